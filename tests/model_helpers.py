"""Small ONNX models built with onnx.helper, saved checked: the one way the tests save a hand-built graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def save_model(graph, path: Path, opset: int = 17) -> Path:
    """`graph` as a checked model (IR 8, default-domain `opset`) at path (its folder made); returns path."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


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
