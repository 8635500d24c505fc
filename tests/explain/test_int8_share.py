"""The int8 share of a quantized model read from its graph (explain/int8share.py), as scripts/bench_search.py counts
the answers of NNCF and onnxruntime's top-k recipe: real quantizers on the bundled demo detector (5 Conv, 10 MatMul,
40 Gemm), a node kept in float by each quantizer's own exclusion is float, every other multiply-accumulate node
int8, and the shares are the kept nodes' weights over all of them."""

from __future__ import annotations

import shutil

import numpy as np
import onnx

import pytest
from onnx import numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from quantbench.explain.int8share import MAC_OPS, int8_nodes, int8_share, int8_weight_nodes
from quantbench.inputs.assets import demo_model

FLOAT_NODES = ["/model/stem/stem.0/stem.0.0/Conv", "/model/encoder.0/attn/q/Gemm"]


def _feeds(n: int = 4) -> list[dict]:
    rng = np.random.default_rng(0)
    return [{"images": rng.normal(0, 1, (1, 3, 128, 128)).astype(np.float32)} for _ in range(n)]


def _weights(model) -> dict:
    inits = {i.name: int(np.prod(numpy_helper.to_array(i).shape)) for i in model.graph.initializer}
    return {n.name: sum(inits.get(x, 0) for x in n.input) for n in model.graph.node if n.op_type in MAC_OPS}


class _Reader(CalibrationDataReader):
    def __init__(self):
        self.it = iter(_feeds())

    def get_next(self):
        return next(self.it, None)


def test_nodes_onnxruntime_keeps_in_float_are_the_float_share(tmp_path):
    src = shutil.copyfile(demo_model("litter-detr-tiny"), tmp_path / "fp32.onnx")   # the quantizer writes beside it
    quantize_static(str(src), str(tmp_path / "q.onnx"), _Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    nodes_to_exclude=FLOAT_NODES)
    flags = int8_nodes(onnx.load(tmp_path / "q.onnx"))
    fp32 = onnx.load(src)
    assert sorted(n for n, int8 in flags.items() if not int8) == sorted(FLOAT_NODES)
    assert len(flags) == 55
    weights = _weights(fp32)
    share = int8_share(flags, weights, {n: 1 for n in weights})
    assert share["weights"] == pytest.approx(1 - sum(weights[n] for n in FLOAT_NODES) / sum(weights.values()))
    assert share["macs"] == pytest.approx(53 / 55)
    assert int8_share(int8_nodes(fp32), weights, weights) == {"weights": 0.0, "macs": 0.0}
    assert not any(int8_weight_nodes(fp32).values())
    held = int8_weight_nodes(onnx.load(tmp_path / "q.onnx"))
    assert sorted(n for n, int8 in held.items() if not int8) == sorted(FLOAT_NODES)


def test_nodes_reading_16_bit_activations_are_not_int8(tmp_path):
    """onnxruntime's per-tensor override to 16-bit activations (the A16W8 form the search's `a16` node choice makes,
    explain.search.tensors): the nodes that multiply the 16-bit tensor run dequantized from uint16, not in int8,
    though their weights stay 8-bit; every other node is int8."""
    src = shutil.copyfile(demo_model("litter-detr-tiny"), tmp_path / "fp32.onnx")   # the quantizer writes beside it
    fp32 = onnx.load(src)
    wide = next(n for n in fp32.graph.node if n.name == FLOAT_NODES[1]).input[0]
    readers = sorted(n.name for n in fp32.graph.node if n.op_type in MAC_OPS and wide in n.input[:2])
    quantize_static(str(src), str(tmp_path / "q.onnx"), _Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    extra_options={"TensorQuantOverrides": {wide: [{"quant_type": QuantType.QUInt16}]}})
    q = onnx.load(tmp_path / "q.onnx")
    zero_points = {i.name: i.data_type for i in q.graph.initializer}
    assert onnx.TensorProto.UINT16 in {zero_points.get(n.input[2]) for n in q.graph.node
                                       if n.op_type == "DequantizeLinear" and len(n.input) > 2}
    flags = int8_nodes(q)
    assert readers and sorted(n for n, int8 in flags.items() if not int8) == readers
    assert len(flags) == 55
    held = int8_weight_nodes(q)   # A16W8: their weights stay 8-bit, as the search counts them
    assert held == dict.fromkeys(flags, True)
    weights = _weights(fp32)
    share = int8_share(flags, weights, weights, held)
    assert share["weights"] == 1.0 and share["macs"] == pytest.approx(1 - sum(weights[n] for n in readers)
                                                                      / sum(weights.values()))


def test_nodes_nncf_ignores_are_float_and_the_rest_int8(tmp_path):
    nncf = pytest.importorskip("nncf", reason="nncf is a bench-only dependency (pip install -e '.[bench]')")
    from onnxruntime.quantization.shape_inference import quant_pre_process

    # NNCF reads Constant-held tensors as missing: it gets the prepared model, as the bench gives it prepared.onnx
    quant_pre_process(str(demo_model("litter-detr-tiny")), str(tmp_path / "prepared.onnx"), skip_symbolic_shape=True)
    q = nncf.quantize(onnx.load(tmp_path / "prepared.onnx"), nncf.Dataset(_feeds()), subset_size=4,
                      ignored_scope=nncf.IgnoredScope(names=FLOAT_NODES))
    flags = int8_nodes(q)
    assert all(not flags[n] for n in FLOAT_NODES)
    assert [n for n, int8 in flags.items() if n.endswith("/Conv") and n not in FLOAT_NODES and not int8] == []
