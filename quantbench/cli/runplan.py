"""The run plan of an explain command and a fleet's host requests, from their option groups. Only the commands
that run or read hosts import it, so `quantbench --help` and the other commands never load the variants, the
fixtures or the recipe (numpy)."""

from __future__ import annotations

from quantbench.api.options import Fleet
from quantbench.api.plan import explain_hosts
from quantbench.cli.groups import Explained
from quantbench.errors import render_params
from quantbench.hosts.registry import parse_hosts


def explain_run(ex: Explained, variant, limit: int | None = None, render=render_params, requirement: bool = True,
                compares: bool = False) -> tuple[list, object]:
    """(the hosts, the run plan) of an explain command on `variant` (api.plan.explain_hosts over `ex`'s groups)."""
    return explain_hosts(ex.fleet, ex.session, ex.fixtures, variant, limit, render, requirement, compares)


def fleet_requests(fleet: Fleet) -> list:
    """The fleet's host requests (hosts.registry.parse_hosts); [] when it names no hosts."""
    return parse_hosts(fleet.names(), None, fleet.hosts_file) if fleet.hosts else []
