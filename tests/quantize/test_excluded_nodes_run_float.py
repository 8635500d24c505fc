"""A node left out of QDQ runs in float under onnxruntime: one whose every operand is an activation (a MatMul of two,
as attention's are) would otherwise read two DequantizeLinear outputs, a group onnxruntime's graph optimizer fuses
into an integer kernel whatever the quantizer was told."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from models import transformer_like_classifier
from quantbench.quantize import variants

ATTENTION = ("attn_scores", "attn_context")


def _optimized_ops(path, tmp_path) -> list[str]:
    """The op types of the graph onnxruntime runs for the model at `path` (its extended optimizations applied)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]


def _static(tmp_path, name, exclude):
    model = transformer_like_classifier(tmp_path / "m.onnx", attention=True)
    rng = np.random.default_rng(0)
    feeds = [{"images": rng.random((1, 3, 8, 8), dtype=np.float32)} for _ in range(4)]
    out = tmp_path / f"{name}.onnx"
    variants.make_static(model, out, inputs=feeds, exclude_nodes=exclude, name=name)
    return out


def test_excluded_matmuls_of_two_activations_run_in_float(tmp_path):
    base = _optimized_ops(_static(tmp_path, "base", ()), tmp_path)
    kept = _static(tmp_path, "kept", ATTENTION)
    ops = _optimized_ops(kept, tmp_path)
    integer = lambda found: sum(op in ("QLinearMatMul", "MatMulInteger", "MatMulIntegerToFloat") for op in found)
    assert integer(base) - integer(ops) == 2, (base, ops)
    assert ops.count("MatMul") - base.count("MatMul") == 2
    graph = onnx.load(str(kept)).graph
    read = {t for n in graph.node for t in n.input}
    assert all(i.name in read for i in graph.initializer)   # no scale or zero point of a removed pair left behind
    producer = {t: n.op_type for n in graph.node for t in n.output}
    for node in graph.node:
        if node.name in ATTENTION:
            assert not any(producer.get(t) == "DequantizeLinear" for t in node.input), node


def test_an_excluded_node_with_a_weight_is_left_as_the_quantizer_made_it(tmp_path):
    graph = onnx.load(str(_static(tmp_path, "kept", ("attn_q",)))).graph
    node = next(n for n in graph.node if n.name == "attn_q")
    assert "wq" in node.input   # its float weight
    assert variants.read_float_where_excluded(graph, ("attn_q",)) == []
