"""`quantbench.noise(...)`: each host's noise floor (the `noise` command): repeated runs, threads 1 vs N, batch 1
vs N, graph optimisation, deployed threads, providers, one factor at a time with decision flips; rows into the
`noise` table."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quantbench.api import explained
from quantbench.api.options import Fixtures, Fleet, Results, Session, check_groups, check_text, check_whole
from quantbench.api.plan import explain_hosts
from quantbench.analysis.decode import spec_for_variant
from quantbench.errors import render_params
from quantbench.explain.noise import FACTORS, NoiseRow, check_factors, check_threads, noise_floor, table as noise_text
from quantbench.inputs.variantdir import pick_variant
from quantbench.store import lazy

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy.module("pyarrow")

DEFAULT_LIMIT = 8
DEFAULT_BATCH = 8


@dataclass
class Noise:
    """The noise rows (explain.noise.NoiseRow per host and factor), the `noise` table's part written, and the
    report updated."""

    rows: list[NoiseRow]
    part: Path | None
    tables_root: Path
    report: Path

    @property
    def harness_faults(self) -> list[str]:
        """The hosts whose repeated runs of one session differ (a harness fault, not noise), sorted."""
        return sorted({r.host for r in self.rows if r.harness_fault})

    def text(self) -> str:
        """The rows as the command prints them.

        Returns
        -------
        str
        """
        return noise_text(self.rows)

    def table(self) -> "pa.Table":
        """The `noise` table's rows this measurement wrote.

        Returns
        -------
        pyarrow.Table
            One row per host and factor.
        """
        return explained.written("noise", self.part)


def noise(variant, fleet: Fleet, fixtures: Fixtures = Fixtures(), session: Session = Session(),
          results: Results = Results(), *, limit: int = DEFAULT_LIMIT, threads: int | None = None,
          batch: int = DEFAULT_BATCH, factors=FACTORS, decode: str | None = None, render=render_params) -> Noise:
    """Measure each host's noise floor: how far its outputs move under a change that should not matter (repeated
    runs, threads, batch, optimisation level), so a difference between hosts is read against it. Appends to the
    `noise` table, updates the report.

    Parameters
    ----------
    variant : str or path
        A variant name of the last calibrate run, or an .onnx file.
    fleet : Fleet
        The hosts measured.
    fixtures : Fixtures
        The fixture group run.
    session : Session
        Session options for every host.
    results : Results
        Where the `noise` table and the report are.
    limit : int
        Fixtures run.
    threads : int, optional
        The N of threads 1 vs N (None: 4, at most each host's cores).
    batch : int
        The batch size of batch 1 vs N.
    factors : str or list
        Names of explain.noise.FACTORS, comma-separated or a list.
    decode : str, optional
        How outputs become decisions for the flips counted (None: the sidecar's).
    render : callable
        Names a parameter in a note (the command line: its flag).

    Returns
    -------
    Noise
        The rows (NoiseRow per host and factor), the table part written and the report updated.
    """
    check_groups(fleet=fleet, fixtures=fixtures, session=session, results=results)
    check_text("decode", decode)
    check_whole("limit", limit, optional=False)
    wanted = check_factors(explained.names("factors", factors))
    picked = pick_variant(variant)
    hosts, plan = explain_hosts(fleet, session, fixtures, picked, limit, render)
    (vi,) = plan.variants
    chosen = plan.fixtures_for[vi.variant_id]
    spec = spec_for_variant(picked, decode, vi.outputs)
    n = check_threads(threads, hosts)   # every host's cores, before any host runs
    rows = []
    for h in hosts:
        rows += noise_floor(picked.path, h, chosen, spec, n, batch, wanted, picked.name,
                            variant_id=vi.variant_id, model=plan.models[vi.variant_id])
    part = explained.append("noise", [r.row() for r in rows], results)
    return Noise(rows, part, results.tables, explained.update_report(results))
