"""`quantbench.localize(...)`: the first node whose output differs between two hosts (the `localize` command),
every intermediate hashed in bounded memory, and optionally which instruction families ran on each emulated host;
rows into the `localize` (and `evidence`) tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from quantbench.api import explained
from quantbench.api.options import Fixtures, Fleet, Output, Results, Session, check_groups, check_whole
from quantbench.api.plan import explain_hosts
from quantbench.errors import render_params
from quantbench.explain.evidence import Evidence, run_evidence_for, table as evidence_text
from quantbench.explain.localize import DEFAULT_GROUP, LocalizeResult, localize as walk, summary
from quantbench.inputs.fixtures import limit_note, pick_balanced, pick_fixture
from quantbench.inputs.variantdir import pick_variant
from quantbench.store import lazy, partread

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy.module("pyarrow")


@dataclass
class Localize:
    """A localisation (explain.localize.LocalizeResult: `.result`), the `localize` table's part written, and with
    evidence: the fixtures it ran (`evidence_fixtures`, described), the evidence per emulated host and notes on
    the hosts skipped."""

    result: LocalizeResult
    part: Path | None
    tables_root: Path
    report: Path
    evidence: list[Evidence] = field(default_factory=list)
    evidence_notes: list[str] = field(default_factory=list)
    evidence_fixtures: str | None = None

    def summary(self) -> str:
        """What the command prints: the first divergent node, the outputs, the trend.

        Returns
        -------
        str
        """
        return summary(self.result)

    def table(self) -> "pa.Table":
        """The `localize` table's rows this localisation wrote (one per tensor hashed).

        Returns
        -------
        pyarrow.Table
        """
        return explained.written("localize", self.part)

    def evidence_text(self) -> str:
        """The instruction families per emulated host as a text table ('' without evidence).

        Returns
        -------
        str
        """
        return evidence_text(self.evidence) if self.evidence else ""

    def evidence_table(self) -> "pa.Table":
        """The `evidence` table's rows of this variant on the hosts evidence ran on.

        Returns
        -------
        pyarrow.Table
        """
        return partread.read("evidence", root=self.tables_root,
                             filter={"variant_id": self.result.variant_id, "host": [e.host for e in self.evidence]})


def localize(variant, fleet: Fleet, fixtures: Fixtures = Fixtures(), session: Session = Session(),
             results: Results = Results(), output: Output = Output(), *, fixture: str | None = None,
             opt_level: str | None = None, group: int = DEFAULT_GROUP, evidence: bool = False,
             evidence_fixtures: int = 1, render=render_params) -> Localize:
    """Find the first node whose output differs between two hosts, so a split class points at one kernel.
    Appends to the `localize` (and `evidence`) tables, updates the report.

    Parameters
    ----------
    variant : str or path
        A variant name of the last calibrate run, or an .onnx file.
    fleet : Fleet
        The two hosts compared (``NAME+KEY=VALUE`` sets a session option of one).
    fixtures : Fixtures
        The fixture group `fixture` is taken from.
    session : Session
        Session options for both hosts.
    results : Results
        Where the tables and the report are.
    output : Output
        Progress and what is printed.
    fixture : str, optional
        A fixture id prefix or image name (None: the split's first).
    opt_level : str, optional
        The graph optimisation level run (None: the explained run's), since fusion changes which nodes exist.
    group : int
        Intermediate outputs exposed per run: more is fewer runs and more memory.
    evidence : bool
        Also run each emulated host under qemu's instruction log: which kernel families ran.
    evidence_fixtures : int
        Fixtures run for the evidence.
    render : callable
        Names a parameter in a note (the command line: its flag).

    Returns
    -------
    Localize
        The localisation (first divergent node, outputs, trend), the table part written and the evidence.
    """
    check_groups(fleet=fleet, fixtures=fixtures, session=session, results=results, output=output)
    for name, value in (("group", group), ("evidence_fixtures", evidence_fixtures)):
        check_whole(name, value, optional=False)
    root = results.tables
    picked = pick_variant(variant)
    hosts, plan = explain_hosts(fleet, session, fixtures, picked, render=render)
    (vi,) = plan.variants
    candidates = plan.fixtures_for[vi.variant_id]
    one = pick_fixture(candidates, fixture, fixtures.split)
    res = walk(picked.path, hosts, one, opt_level, group, picked.name, progress=output.bars(), tables_root=root,
               variant_id=vi.variant_id, model=plan.models[vi.variant_id])
    part = explained.append("localize", res.table_rows(), results)
    done = Localize(res, part, root, root)
    if evidence:
        chosen = pick_balanced(candidates, [fx.stratum for fx in candidates], max(1, evidence_fixtures))
        done.evidence_fixtures = f"{len(chosen)}: {limit_note(chosen)}"
        done.evidence, done.evidence_notes = run_evidence_for(picked, hosts, chosen, root, vi.variant_id)
    done.report = explained.update_report(results)
    return done
