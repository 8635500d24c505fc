"""Quantized outputs (make_static(quantize_outputs=True)): each float graph output, one an op left in float writes,
goes through a QuantizeLinear -> DequantizeLinear pair on the activations' grid at its calibrated range, so tiny
host-to-host differences of the float tail round to the same grid step; the recipe records it and the same call gives
the same bytes."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from calib_helpers import random_feeds
from explain_helpers import softmax_sigmoid_image_model
from quantbench.fsutil import sha256_file
from quantbench.quantize.calibration import compute_ranges, ranges_dict
from quantbench.quantize.variants import make_static


def _made(tmp_path, name, **kw):
    model = softmax_sigmoid_image_model(tmp_path / "m.onnx")
    ranges = compute_ranges(model, random_feeds(8, hw=8), ["minmax"])["minmax"]
    return make_static(model, tmp_path / f"{name}.onnx", ranges=ranges, method="minmax", **kw), ranges_dict(ranges)


def _run(path, feed):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)[0]


def test_a_float_output_is_put_on_its_calibrated_int8_grid(tmp_path):
    v, ranges = _made(tmp_path, "q", exclude_op_types=("Softmax",), quantize_outputs=True)
    plain, _ = _made(tmp_path, "plain", exclude_op_types=("Softmax",))
    g = onnx.load(str(v.path)).graph
    producer = {o: n for n in g.node for o in n.output}
    dq = producer["logits"]
    assert dq.op_type == "DequantizeLinear" and producer[dq.input[0]].op_type == "QuantizeLinear"
    assert producer[producer[dq.input[0]].input[0]].op_type == "Softmax"   # the float Softmax, then the pair
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    scale, zp = inits[dq.input[1]], int(inits[dq.input[2]])
    lo, hi = ranges["logits"]
    # the u8 activations' grid at the calibrated range (Softmax's is [0, hi]), held in u16
    assert inits[dq.input[2]].dtype == np.uint16 and zp == 0 and abs(scale - (hi - min(lo, 0.0)) / 255) < 1e-7
    feed = random_feeds(1, hw=8, seed=7)[0]
    got, want = _run(v.path, feed), _run(plain.path, feed)
    assert np.array_equal(got, np.round(got / scale).astype(np.float32) * scale)   # whole steps of the grid
    assert np.abs(got - want).max() <= scale / 2 + 1e-7   # the nearest one to the float
    assert v.recipe["quantize_outputs"] is True
    assert json.loads(v.path.with_name("q.recipe.json").read_text())["quantize_outputs"] is True
    assert "quantize_outputs" not in plain.recipe   # older recipes and plain variants: unset


def test_onnxruntime_keeps_the_float_op_float_under_its_quantized_output(tmp_path):
    """An 8-bit pair after DQ -> Softmax is a node group onnxruntime fuses into QLinearSoftmax, the integer kernel
    the op was kept out of QDQ to avoid; the 8-bit grid held in 16 bits is not one."""
    v, _ = _made(tmp_path, "q", exclude_op_types=("Softmax",), quantize_outputs=True)
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(v.path), so, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]
    assert "Softmax" in ops and "QLinearSoftmax" not in ops and ops[-2:] == ["QuantizeLinear", "DequantizeLinear"]


def test_quantized_outputs_are_made_byte_identically_and_leave_quantized_outputs_alone(tmp_path):
    a, _ = _made(tmp_path, "a", exclude_op_types=("Softmax",), quantize_outputs=True)
    b, _ = _made(tmp_path, "b", exclude_op_types=("Softmax",), quantize_outputs=True)
    assert sha256_file(a.path) == sha256_file(b.path)
    whole, _ = _made(tmp_path, "whole", quantize_outputs=True)   # Softmax quantized: its output is a DQ already
    plain, _ = _made(tmp_path, "plain")
    assert whole.recipe["semantic_sha256"] == plain.recipe["semantic_sha256"]
