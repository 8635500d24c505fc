"""Semantic model hash: doc_strings never change a model's identity; the raw hash still does."""

import pytest

from model_helpers import make_model
from quantbench.errors import UserError
from quantbench.inputs.modelio import model_hashes, parse_strip, semantic_sha256


def test_doc_strings_change_raw_but_not_semantic_hash(tmp_path):
    a = make_model(tmp_path / "a.onnx", doc="/home/alice/venv/lib/torch/nn/module.py(1736): _call_impl")
    b = make_model(tmp_path / "b.onnx", doc="C:\\tmp\\venv-rfdetr\\lib\\site-packages\\torch\\nn\\module.py(1736)")
    ha, hb = model_hashes(a), model_hashes(b)
    assert ha["raw_sha256"] != hb["raw_sha256"]
    assert ha["semantic_sha256"] == hb["semantic_sha256"]
    assert ha["semantic_strip"] == ["doc_string"]


def test_cast_difference_changes_semantic_hash(tmp_path):
    a = make_model(tmp_path / "a.onnx", casts=3)
    b = make_model(tmp_path / "b.onnx", casts=2)
    assert semantic_sha256(a) != semantic_sha256(b)


def test_optional_strips_are_named_and_off_by_default(tmp_path):
    a = make_model(tmp_path / "a.onnx", value_info=True, producer="pytorch", version="2.6.0", metadata={"k": "1"})
    b = make_model(tmp_path / "b.onnx", value_info=False, producer="pytorch", version="2.7.0")
    assert semantic_sha256(a) != semantic_sha256(b)
    assert semantic_sha256(a, parse_strip("producer,value_info")) != semantic_sha256(b, parse_strip("producer,value_info"))
    everything = parse_strip("producer, value_info,metadata")
    assert everything == ("doc_string", "producer", "value_info", "metadata")
    assert semantic_sha256(a, everything) == semantic_sha256(b, everything)


def test_unknown_strip_option_is_a_user_error():
    with pytest.raises(UserError, match="strip: unknown option"):
        parse_strip("producer,weights")
