"""`quantbench.diff(a, b)`: the comparison the `diff` command prints, from Python: its text and JSON, one row per
aspect compared, and the gate as GateFailed."""

from __future__ import annotations

import json

import pytest
from model_helpers import make_model

import quantbench
from quantbench.cli import main
from quantbench.errors import GateFailed, UserError


def test_diff_gives_the_commands_comparison(tmp_path, capsys):
    a = make_model(tmp_path / "a.onnx", weight_seed=0)
    b = make_model(tmp_path / "b.onnx", weight_seed=1, producer="other")
    done = quantbench.diff(a, b, strip="producer")
    table = done.table()
    assert table.column_names[:3] == ["category", "risk", "differs"]
    assert table.num_rows == len(done.model_diff.findings) and table.column("differs").to_pylist()[0]
    assert done.semantic_differences == 1
    assert main(["diff", str(a), str(b), "--strip", "producer"]) == 0
    assert capsys.readouterr().out.strip() == done.text().strip()
    assert main(["diff", str(a), str(b), "--strip", "producer", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(done.to_json(), sort_keys=True))
    with pytest.raises(GateFailed, match=r"^1 semantic difference\(s\) between "):
        done.check()
    assert quantbench.diff(a, a).check().semantic_differences == 0


def test_its_errors_name_parameters(tmp_path):
    a = make_model(tmp_path / "a.onnx")
    with pytest.raises(UserError, match=r"^strip: unknown option\(s\) nope; choose from "):
        quantbench.diff(a, a, strip="nope")
    with pytest.raises(UserError, match=r"^b: must be a file or folder name"):
        quantbench.diff(a, None)
