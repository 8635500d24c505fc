"""`quantbench.remedy(...)`: the known remedies tried on a variant whose hosts split (the `remedy` command): which
bring every host into one class, at what decision cost against fp32; rows into the `remedies` table."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quantbench.api import explained
from quantbench.api.options import (Fixtures, Fleet, Output, Results, Session, check_groups, check_path, check_text,
                                    check_whole)
from quantbench.api.plan import explain_hosts
from quantbench.analysis.decode import spec_for_variant
from quantbench.errors import UserError, flag_mark, render_params
from quantbench.explain.remedy import REMEDIES, RemedyRow, build_remedies, remedy_matrix, table as remedy_text
from quantbench.inputs.sidecarfile import check_identity
from quantbench.inputs.variantdir import pick_variant
from quantbench.store import lazy

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy.module("pyarrow")

DEFAULT_LIMIT = 8


@dataclass
class Remedy:
    """The remedy matrix (explain.remedy.RemedyRow per remedy), the `remedies` table's part written, the folder
    the remedy variants were written to, and the report updated."""

    rows: list[RemedyRow]
    part: Path | None
    out: Path
    tables_root: Path
    report: Path

    @property
    def closing(self) -> list[str]:
        """The remedies that bring every host into one class."""
        return [r.remedy for r in self.rows if r.one_class]

    def text(self) -> str:
        """The matrix as the command prints it.

        Returns
        -------
        str
        """
        return remedy_text(self.rows)

    def table(self) -> "pa.Table":
        """The `remedies` table's rows this matrix wrote.

        Returns
        -------
        pyarrow.Table
            One row per remedy.
        """
        return explained.written("remedies", self.part)


def _fp32(fp32) -> Path:
    """The float model: the one given (not empty), else the fp32 variant of the last calibrate run (it runs too: it must be the
    model its recipe names)."""
    if fp32:
        return Path(fp32)
    reference = pick_variant("fp32")
    check_identity(reference)
    return Path(reference.path)


def remedy(variant, fleet: Fleet, fixtures: Fixtures = Fixtures(), session: Session = Session(),
           results: Results = Results(), output: Output = Output(), *, fp32=None, limit: int = DEFAULT_LIMIT,
           remedies=REMEDIES, decode: str | None = None, out=None, render=render_params) -> Remedy:
    """Try the known remedies on a variant whose hosts split: which bring every host into one class, at what
    decision cost against fp32. Appends to the `remedies` table, updates the report.

    Parameters
    ----------
    variant : str or path
        A variant name of the last calibrate run, or an .onnx file.
    fleet : Fleet
        The hosts, two at least.
    fixtures : Fixtures
        The fixture group run.
    session : Session
        Session options for every host (the variant's session requirement goes into each remedy too).
    results : Results
        Where the `remedies` table and the report are.
    output : Output
        Progress and what is printed.
    fp32 : str or path, optional
        The float model flips count against (None: the last calibrate run's fp32 variant).
    limit : int
        Fixtures run.
    remedies : str or list
        Names of explain.remedy.REMEDIES, comma-separated or a list.
    decode : str, optional
        How outputs become decisions (None: the sidecar's).
    out : str or path, optional
        Where the remedy variants are written (None: the results folder's remedies/<variant>).
    render : callable
        Names a parameter in a note (the command line: its flag).

    Returns
    -------
    Remedy
        The matrix (RemedyRow per remedy), the table part written, the remedy variants' folder.
    """
    check_groups(fleet=fleet, fixtures=fixtures, session=session, results=results, output=output)
    check_path("fp32", fp32)
    check_path("out", out)
    check_text("decode", decode)
    check_whole("limit", limit, optional=False)
    wanted = explained.names("remedies", remedies)
    picked = pick_variant(variant)
    hosts, plan = explain_hosts(fleet, session, fixtures, picked, limit, render, requirement=False, compares=True)
    (vi,) = plan.variants
    fp32 = _fp32(fp32)
    spec = spec_for_variant(picked, decode, vi.outputs)
    if spec is None:
        raise UserError(f"{picked.path}: no decoder ({flag_mark('decode')} none, or no decode block in its sidecar); "
                        f"remedy counts decision flips, so pass {flag_mark('decode')} KIND")
    chosen = plan.fixtures_for[vi.variant_id]
    stem = Path(picked.path)
    ranges = stem.with_name(stem.stem + ".ranges.json")
    out = Path(out) if out else results.folder / "remedies" / picked.name
    rvs = build_remedies(picked.path, fp32, out, picked.recipe, ranges if ranges.exists() else None,
                         [{fx.input_name: fx.array} for fx in chosen], wanted)
    rows = remedy_matrix(rvs, fp32, hosts, chosen, spec, vi.variant_id, progress=output.bars(),
                         shipped_model=plan.models.get(vi.variant_id))
    part = explained.append("remedies", [r.row() for r in rows], results)
    return Remedy(rows, part, out, results.tables, explained.update_report(results))
