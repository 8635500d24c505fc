"""`quantbench.api.tables`: the parts each result table holds and their compaction, what `quantbench tables info`
and `tables compact` print, from Python."""

from __future__ import annotations

import shutil

import pytest

from quantbench.api.options import Results
from quantbench.api.tables import compact_tables, tables_info
from quantbench.cli import main
from quantbench.errors import UserError
from quantbench.store import partread, partwrite


def _lint_parts(root, count: int) -> None:
    """`count` one-row parts of the lint table."""
    for i in range(count):
        partwrite.append("lint", [{"variant_id": f"v{i}", "model": "m.onnx", "node": f"conv{i}", "op_type": "Conv",
                                   "k": 9, "act_type": "u8", "weight_type": "s8", "x86_saturating_pairs": 0,
                                   "neon_wrapping_pairs": 0, "int32_ok": True, "tiers": [], "reason": ""}], root=root)


def test_info_and_compaction_are_the_commands(workdir, capsys):
    _lint_parts(workdir / "a" / "tables", 3)
    shutil.copytree(workdir / "a", workdir / "b")
    info = tables_info(Results("a"))
    assert info.table().to_pylist()[0]["parts"] == 3 and info.rows[0]["small"] == 3
    capsys.readouterr()
    assert main(["tables", "--results", "b", "info"]) == 0
    assert capsys.readouterr().out.strip() == info.text().strip()
    done = compact_tables(Results("a"))
    assert [(r["table"], r["parts_in"], r["rows"]) for r in done] == [("lint", 3, 3)]
    assert main(["tables", "--results", "b", "compact"]) == 0
    assert capsys.readouterr().out.strip() == f"lint: 3 parts -> {done[0]['parts_out']} (3 rows)"
    key = ["variant_id", "node"]
    assert partread.read("lint", root=workdir / "a" / "tables").select(key) == \
        partread.read("lint", root=workdir / "b" / "tables").select(key)
    with pytest.raises(UserError, match=r"^unknown table\(s\) nope; tables: "):
        compact_tables(Results("a"), ["nope"])
