"""`quantbench.latency(...)`: latency and peak memory of each variant on local and ssh hosts (the `latency`
command; never under emulation), and each int8 variant's speed-up over fp32; rows into the `latency` table."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quantbench.api import explained
from quantbench.api.options import Fixtures, Fleet, Results, check_groups, check_whole, is_path
from quantbench.api.plan import note_plan, variants_named
from quantbench.errors import ParameterError, UserError, flag_mark, render_params
from quantbench.explain.latency import (LatencyRow, check_counts, check_host, measure, table as latency_text,
                                        with_speedups)
from quantbench.hosts.registry import parse_hosts
from quantbench.hosts.requirements import for_hosts
from quantbench.runs.runner import plan_run
from quantbench.inputs.variantdir import pick_variant
from quantbench.store import lazy

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy.module("pyarrow")

DEFAULT_HOSTS = "x86"


@dataclass
class Latency:
    """The latency rows (explain.latency.LatencyRow per host and variant, speed-ups filled), the `latency` table's
    part written, and the report updated."""

    rows: list[LatencyRow]
    part: Path | None
    tables_root: Path
    report: Path

    def text(self) -> str:
        """The rows as the command prints them.

        Returns
        -------
        str
        """
        return latency_text(self.rows)

    def table(self) -> "pa.Table":
        """The `latency` table's rows this measurement wrote.

        Returns
        -------
        pyarrow.Table
            One row per host and variant, speed-ups filled.
        """
        return explained.written("latency", self.part)


def _variants(variants) -> list:
    """The variants named: 'all' (every one of the last calibrate run, else the demo models, said), names of it or
    .onnx files, comma-separated or a list."""
    if variants == "all":
        return variants_named(None)
    if isinstance(variants, str):
        names = [n.strip() for n in variants.split(",") if n.strip()]
    elif isinstance(variants, (list, tuple)) and all(is_path(v) for v in variants):
        names = [str(v) for v in variants]
    else:
        raise ParameterError("variants", "must be 'all', variant names or .onnx files (comma-separated or a list)",
                             variants)
    if not names:   # '' measured nothing and printed an empty table
        raise UserError(f"{flag_mark('variants')} {variants!r}: name at least one variant, or 'all'")
    return [pick_variant(n) for n in names]


def latency(variants="all", fleet: Fleet = Fleet(DEFAULT_HOSTS), fixtures: Fixtures = Fixtures(),
            results: Results = Results(), *, warmup: int = 3, runs: int = 10, repeats: int = 3,
            threads: int | None = None, render=render_params) -> Latency:
    """Time each variant on each host of `fleet` (local or ssh: an emulated or imported host is refused, its times
    would mean nothing), each under its own session requirement, and its speed-up over fp32 on the same host.

    Parameters
    ----------
    variants : str or list
        ``"all"`` (every variant of the last calibrate run), names of it or .onnx files, comma-separated or a list.
    fleet : Fleet
        The hosts timed.
    fixtures : Fixtures
        The fixture group whose first image is timed.
    results : Results
        Where the `latency` table and the report are.
    warmup : int
        Untimed runs first (caches, lazy allocations).
    runs : int
        Timed runs per repeat; the repeat's figure is their median.
    repeats : int
        Repeats, so the spread between them shows the noise.
    threads : int, optional
        Intra-op threads (None: each host's deployed count).
    render : callable
        Names a parameter in a note (the command line: its flag).

    Returns
    -------
    Latency
        The rows (LatencyRow per host and variant), the table part written and the report updated.
    """
    check_groups(fleet=fleet, fixtures=fixtures, results=results)
    check_whole("threads", threads)
    if threads is not None and threads < 1:
        raise ParameterError("threads", "must be at least 1", threads)
    check_counts(warmup, runs, repeats)   # before any host is asked
    given = {} if threads is None else {"intra_op_num_threads": threads}
    hosts = parse_hosts(fleet.names(), given, fleet.hosts_file)
    for h in hosts:
        check_host(h)
    rows = []
    for v in _variants(variants):   # the run plan: the model parsed once, its identity and the timed fixture
        plan = plan_run([h.spec for h in hosts], [v], labels=fixtures.labels, images=fixtures.images,
                        split=fixtures.split, limit=1, check_hosts=False)
        note_plan(plan, render=render)
        (vi,) = plan.variants
        fx = plan.fixtures_for[vi.variant_id][0]
        for h in for_hosts(hosts, v):   # each variant under its own session requirement
            rows.append(measure(v.path, h, fx, warmup, runs, repeats, v.name, variant_id=vi.variant_id))
    with_speedups(rows)
    part = explained.append("latency", [r.row() for r in rows], results)
    return Latency(rows, part, results.tables, explained.update_report(results))
