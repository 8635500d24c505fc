"""The run plan of an explain command and a fleet's host requests, from their option groups. Only the commands
that run or read hosts import it, so `quantbench --help` and the other commands never load the variants, the
fixtures or the recipe (numpy)."""

from __future__ import annotations

from quantbench.api.options import Fixtures, Fleet
from quantbench.api.plan import note_plan
from quantbench.errors import render_params
from quantbench.hosts.registry import parse_hosts
from quantbench.hosts.runner import plan_run


def explain_plan(fixtures: Fixtures, hosts, variants, limit: int | None = None, render=render_params):
    """The run plan of an explain command (hosts.runner.plan_run) from its fixture group: each model parsed once
    and kept on the plan (`models`) for the commands that read its graph; `hosts` its --hosts items, each
    started later under its own session (explain.localize.start_workers), so they are not asked ready here."""
    plan = plan_run([h.spec for h in hosts], variants, labels=fixtures.labels, images=fixtures.images,
                    split=fixtures.split, limit=limit, check_hosts=False, keep_models=True)
    note_plan(plan, render=render)
    return plan


def fleet_requests(fleet: Fleet) -> list:
    """The fleet's host requests (hosts.registry.parse_hosts); [] when it names no hosts."""
    return parse_hosts(fleet.names(), None, fleet.hosts_file) if fleet.hosts else []
