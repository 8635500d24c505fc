"""The run plan of an explain command and a fleet's host requests, from their option groups. Only the commands
that run or read hosts import it, so `quantbench --help` and the other commands never load the variants, the
fixtures or the recipe (numpy)."""

from __future__ import annotations

from quantbench.api.options import Fixtures, Fleet
from quantbench.api.plan import note_plan
from quantbench.cli.groups import Explained
from quantbench.errors import UserError, render_params
from quantbench.hosts.registry import parse_hosts
from quantbench.hosts.requirements import for_hosts
from quantbench.hosts.runner import plan_run


def explain_plan(fixtures: Fixtures, hosts, variants, limit: int | None = None, render=render_params):
    """The run plan of an explain command (hosts.runner.plan_run) from its fixture group: each model parsed once
    and kept on the plan (`models`) for the commands that read its graph; `hosts` its --hosts items, each
    started later under its own session (explain.localize.start_workers), so they are not asked ready here."""
    plan = plan_run([h.spec for h in hosts], variants, labels=fixtures.labels, images=fixtures.images,
                    split=fixtures.split, limit=limit, check_hosts=False, keep_models=True)
    note_plan(plan, render=render)
    return plan


def explain_run(ex: Explained, variant, limit: int | None = None, render=render_params, requirement: bool = True,
                compares: bool = False) -> tuple[list, object]:
    """(the hosts, the run plan) of an explain command on `variant`: `ex`'s fleet, each host under the session given
    and, with `requirement`, the variant's session requirement too (hosts.requirements.for_hosts: the variant as
    shipped runs under it; remedy adds it to each remedy instead), and explain_plan's plan of them. `compares`: the
    command compares hosts, so one host is refused before the model is read."""
    hosts = parse_hosts(ex.fleet.names(), ex.session.overrides(), ex.fleet.hosts_file)
    if compares and len(hosts) < 2:
        raise UserError("--hosts: name at least two hosts to compare")
    if requirement:
        hosts = for_hosts(hosts, variant)
    return hosts, explain_plan(ex.fixtures, hosts, [variant], limit, render)


def fleet_requests(fleet: Fleet) -> list:
    """The fleet's host requests (hosts.registry.parse_hosts); [] when it names no hosts."""
    return parse_hosts(fleet.names(), None, fleet.hosts_file) if fleet.hosts else []
