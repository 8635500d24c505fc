"""`quantbench diff`: ranked by semantic risk, not by bytes."""

import json

from model_helpers import make_model

from quantbench.cli import main
from quantbench.release.diff import diff_models

BIG_DOC = "/home/alice/src/checkout-moved-to-a-much-longer-folder/torch/nn/modules/module.py(1736): _call_impl\n" * 200


def test_cast_difference_ranks_above_large_doc_string_difference(tmp_path):
    a = make_model(tmp_path / "a.onnx", casts=4, doc=BIG_DOC, value_info=True)
    b = make_model(tmp_path / "b.onnx", casts=2, doc="", value_info=False)
    d = diff_models(a, b)
    ranked = d.ranked()
    by_cat = {f.category: f for f in ranked}
    docs, ops = by_cat["doc_strings"], by_cat["op types"]
    assert docs.differs and ops.differs
    assert docs.bytes_a - docs.bytes_b > 50_000 > 250          # the doc_string delta dwarfs the Cast bytes
    assert ranked.index(ops) < ranked.index(docs)
    assert ranked.index(by_cat["value_info"]) > ranked.index(ops)
    assert ops.detail[0] == "Cast 4 vs 2 (-2)"
    assert docs.data["a"]["with_absolute_paths"] == 6 and docs.data["b"]["with_absolute_paths"] == 0
    assert by_cat["initializers"].differs is False
    assert by_cat["value_info"].data == {"entries_a": 1, "entries_b": 0}
    assert not d.semantic_equal


def test_doc_string_only_difference_is_metadata_only(tmp_path, capsys):
    a = make_model(tmp_path / "a.onnx", doc=BIG_DOC)
    b = make_model(tmp_path / "b.onnx", doc="C:\\tmp\\venv-rfdetr\\torch\\nn\\module.py(1736)")
    assert main(["diff", str(a), str(b), "--json", "--gate"]) == 0    # no semantic difference: gate passes
    out = json.loads(capsys.readouterr().out)
    assert out["semantic_equal"] is True and out["a"]["raw_sha256"] != out["b"]["raw_sha256"]
    assert out["semantic_differences"] == 0
    first = out["findings"][0]
    assert (first["category"], first["differs"], first["rank"]) == ("doc_strings", True, 1)
    assert out["findings"][0]["data"]["b"]["top_roots"] == ["C:\\tmp\\venv-rfdetr"]


def test_initializer_difference_named_and_gated(tmp_path, capsys):
    a = make_model(tmp_path / "a.onnx", weight_seed=0)
    b = make_model(tmp_path / "b.onnx", weight_seed=1)
    assert main(["diff", str(a), str(b), "--gate"]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    row = next(line for line in lines if " initializers " in line)
    assert "DIFFERS" in row and "1 differ: w" in row
    assert "raw " in out and "semantic " in out


def test_missing_file_is_one_line_user_error(tmp_path, capsys):
    a = make_model(tmp_path / "a.onnx")
    assert main(["diff", str(a), str(tmp_path / "nope.onnx")]) == 2
    err = capsys.readouterr().err
    assert "nope.onnx: model file not found" in err and len(err.strip().splitlines()) == 1
