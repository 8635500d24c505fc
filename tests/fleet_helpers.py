"""The ARM fleet's measured run, shared: `quantbench equiv` of the demo detector's fp32, dynamic and static-minmax
(made by `quantbench calibrate`, as the demo) on every ARM preset set up here, 1 intra-op thread, 2 eval fixtures.
Made once per session (per xdist worker: the tests reading it are slow, so in the machine group) and only read:
tests/analysis/test_predict.py reads its classes, tests/hosts/test_arm_fleet.py reruns its hosts over a copy of its
tables (quantbench's run_key cache) and compares them with plain onnxruntime."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from quantbench.hosts import emulated
from setup_required import missing_setup


@dataclass
class FleetRun:
    folder: Path          #: where calibrate and equiv ran: results/variants/litter-detr-tiny, results/tables
    hosts: list           #: the ARM presets measured
    code: int             #: equiv's exit code
    report: dict          #: results/equiv.json

    @property
    def variants(self) -> Path:
        return self.folder / "results" / "variants" / "litter-detr-tiny"

    @property
    def tables(self) -> Path:
        return self.folder / "results" / "tables"


def arm_hosts_set_up() -> list[str]:
    """The ARM presets (on the PyPI onnxruntime) set up here; missing setup when fewer than two."""
    hosts = [n for n, p in emulated.PRESETS.items()
             if p.arch == "aarch64" and p.runtime == "pypi" and emulated.ready(n)[0]]
    if len(hosts) < 2:
        missing_setup(f"ARM presets set up: {', '.join(hosts) or 'none'} (leave-one-out needs two)")
    return hosts


@pytest.fixture(scope="session")
def arm_demo_equiv(tmp_path_factory) -> FleetRun:
    """calibrate (dynamic, minmax) then `equiv --threads 1 --limit 2` over arm_hosts_set_up(), once per session."""
    from quantbench.cli import main

    hosts = arm_hosts_set_up()
    folder = tmp_path_factory.mktemp("arm-demo-equiv")
    with contextlib.chdir(folder):
        assert main(["calibrate", "--methods", "dynamic,minmax", "--no-progress", "-q"]) == 0
        code = main(["equiv", "--hosts", ",".join(hosts), "--threads", "1", "--limit", "2", "--no-progress",
                     "--no-plots"])
    report = json.loads((folder / "results" / "equiv.json").read_text())
    return FleetRun(folder, hosts, code, report)
