"""Semantic model hash: doc_strings never change a model's identity; the raw hash still does."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantbench.errors import UserError
from quantbench.modelio import model_hashes, parse_strip, semantic_sha256


def make_model(path, *, casts=2, doc="", value_info=False, producer="pytorch", version="2.6.0",
               weight_seed=0, metadata=None):
    """A tiny MatMul + Cast chain; `doc` goes into every node's doc_string."""
    w = np.random.default_rng(weight_seed).standard_normal((4, 4)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h0"], name="mm", doc_string=doc)]
    prev = "h0"
    for i in range(casts):
        to = TensorProto.FLOAT16 if i % 2 == 0 else TensorProto.FLOAT
        nodes.append(helper.make_node("Cast", [prev], [f"c{i}"], to=to, name=f"cast{i}", doc_string=doc))
        prev = f"c{i}"
    out_type = TensorProto.FLOAT16 if casts % 2 == 1 else TensorProto.FLOAT
    nodes.append(helper.make_node("Relu", [prev], ["y"], name="relu", doc_string=doc))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", out_type, [1, 4])],
                              initializer=[numpy_helper.from_array(w, "w")])
    if value_info:
        graph.value_info.extend([helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name=producer,
                              producer_version=version)
    model.ir_version = 8
    for k, v in (metadata or {}).items():
        model.metadata_props.add(key=k, value=v)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


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
    with pytest.raises(UserError, match="--strip: unknown option"):
        parse_strip("producer,weights")
