"""`quantbench.diff(a, b, ...)`: what differs between two ONNX files (the `diff` command), ranked by semantic risk
(ops, initializers, interface, opset before producer, value_info, doc_strings), with both files' hashes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from quantbench.api.options import check_path
from quantbench.errors import GateFailed
from quantbench.inputs.modelio import parse_strip
from quantbench.release.diff import SEMANTIC, ModelDiff, diff_models, format_diff
from quantbench.store import lazy

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy.module("pyarrow")

FINDING_COLUMNS = ("category", "risk", "differs", "a", "b", "bytes_a", "bytes_b")


@dataclass
class Diff:
    """A comparison (release.diff.ModelDiff: `.model_diff`) of files `a` and `b`."""

    model_diff: ModelDiff
    a: str
    b: str

    @property
    def semantic_differences(self) -> int:
        """How many semantic aspects (op, initializer, interface, opset, node) differ."""
        return sum(f.differs and f.risk == SEMANTIC for f in self.model_diff.findings)

    def text(self) -> str:
        """The ranked comparison as the command prints it.

        Returns
        -------
        str
        """
        return format_diff(self.model_diff)

    def to_json(self) -> dict:
        """The full comparison as plain data, for a caller that stores or sends it.

        Returns
        -------
        dict
            What the command prints as JSON.
        """
        return self.model_diff.to_json()

    def table(self) -> "pa.Table":
        """The comparison as a table, to filter or join.

        Returns
        -------
        pyarrow.Table
            One row per aspect compared (category, risk, differs, a, b, bytes), differences first, then by risk.
        """
        return pa.Table.from_pylist([{k: getattr(f, k) for k in FINDING_COLUMNS} for f in self.model_diff.ranked()])

    def check(self) -> "Diff":
        """The comparison as a gate: a semantic difference fails (the command exits 1).

        Returns
        -------
        Diff
            This comparison, when no semantic aspect differs; else GateFailed is raised.
        """
        if self.semantic_differences:
            raise GateFailed(f"{self.semantic_differences} semantic difference(s) between {self.a} and {self.b}")
        return self


def diff(a, b, strip: str = "") -> Diff:
    """Compare two ONNX files by what they compute, ranked by risk: whether a re-export changed the model.

    Parameters
    ----------
    a, b : str or path
        The ONNX files.
    strip : str
        Extra non-executing content left out of the semantic hash, comma-separated (producer, value_info,
        metadata; doc_strings always are).

    Returns
    -------
    Diff
        The findings per aspect (op, initializer, interface, opset, node, ...) and the semantic differences.
    """
    check_path("a", a, optional=False)
    check_path("b", b, optional=False)
    return Diff(diff_models(a, b, parse_strip(strip)), str(a), str(b))
