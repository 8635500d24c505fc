"""`quantbench.lint(...)`: the static saturation lint of an int8 model's weights (the `lint` command), per layer
and host tier, and with a fleet which of its hosts each layer can make diverge; rows into the `lint` table."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quantbench.api import explained
from quantbench.api.options import Fleet, Results, check_groups, check_path
from quantbench.explain.lint import LayerLint, fleet_note, fleet_of, lint_model
from quantbench.hosts.registry import parse_hosts
from quantbench.inputs.modelio import load_model, semantic_sha256
from quantbench.store import lazy
from quantbench.textfmt import text_table

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy.module("pyarrow")

_HEAD = ("layer", "op", "K", "act/weight", "x86 sat pairs", "neon wrap pairs", "int32", "tiers")


@dataclass
class Lint:
    """A linted model: its layers (explain.lint.LayerLint), the fleet's int8 paths (None: no fleet named), the
    model's semantic hash, the `lint` table's part written (None: no int8 layer) and the report updated."""

    layers: list[LayerLint]
    fleet: list | None
    variant_id: str
    part: Path | None
    report: Path

    @property
    def risky(self) -> list[LayerLint]:
        """The layers some host tier can diverge on."""
        return [r for r in self.layers if r.tiers]

    def table(self) -> "pa.Table":
        """The `lint` table's rows this lint wrote.

        Returns
        -------
        pyarrow.Table
            One row per int8 layer.
        """
        return explained.written("lint", self.part)

    def fleet_note(self) -> str | None:
        """One line: the fleet's int8 paths and the hosts the layers affect (None without a fleet).

        Returns
        -------
        str or None
        """
        return fleet_note(self.fleet, self.layers) if self.fleet else None

    def listing(self, every: bool = False) -> str:
        """The layers as a text table, as the command prints them.

        Parameters
        ----------
        every : bool
            Every int8 layer, not only the risky ones.

        Returns
        -------
        str
            The table; '' when there is no layer to show.
        """
        shown = self.layers if every else self.risky
        head = _HEAD + (("fleet hosts affected",) if self.fleet else ())
        rows = [(r.node, r.op_type, str(r.k), f"{r.act_type}/{r.weight_type}", str(r.x86_saturating_pairs),
                 str(r.neon_wrapping_pairs), "ok" if r.int32_ok else "OVERFLOW", ",".join(r.tiers) or "-")
                + ((",".join(r.fleet_hosts) or "-",) if self.fleet else ()) for r in shown]
        return text_table(head, rows) if rows else ""


def lint(model, fleet: Fleet = Fleet(), results: Results = Results()) -> Lint:
    """Lint a quantized model's weights, running nothing: per layer, x86 vpmaddubsw saturation, NEON int16 wrap and
    int32 overflow, so a risky layer is known before any host runs it. Appends to the `lint` table, updates the
    report.

    Parameters
    ----------
    model : str or path
        A quantized .onnx file.
    fleet : Fleet
        Hosts whose int8 paths are read from their fingerprints (a tier this CPU cannot show is predicted), so each
        layer names the hosts it affects (no hosts: per tier only).
    results : Results
        Where the `lint` table and the report are.

    Returns
    -------
    Lint
        The layers (LayerLint), the fleet's int8 paths, the model's semantic hash, the table part written.
    """
    check_path("model", model, optional=False)
    check_groups(fleet=fleet, results=results)
    loaded = load_model(model)
    requests = parse_hosts(fleet.names(), None, fleet.hosts_file) if fleet.hosts else []
    paths = fleet_of(requests) if requests else None
    layers = lint_model(loaded, paths)
    vid = semantic_sha256(loaded)
    part = explained.append("lint", [dict(r.row(), variant_id=vid, model=str(model)) for r in layers], results)
    return Lint(layers, paths, vid, part, explained.update_report(results))
