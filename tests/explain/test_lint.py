"""Saturation lint on hand-made int8 weight tensors with known overflow pairs."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantbench.explain.lint import lint_model, pair_counts, reduction_layout


def test_pair_counts_known_pairs():
    # one output, K = 7 (odd: padded with a zero)
    w = np.array([[127, 2,   # 255*129 > 32767: saturates
                   100, 28,  # 255*128 = 32640: fits
                   -128, -1,  # 255*129 = 32895 > 32768: saturates (negative side)
                   -128]], np.int8)  # paired with the zero pad: 255*128 fits
    pairs, sat, wrap = pair_counts(w)
    assert (pairs, sat, wrap) == (4, 2, 0)
    # opposite signs never saturate, however large
    assert pair_counts(np.array([[127, -128, -128, 127]], np.int8))[1] == 0
    # -128,-128 wraps on NEON-only ARM and saturates on x86
    assert pair_counts(np.array([[-128, -128, 5, 6]], np.int8)) == (2, 1, 1)
    # pairs are (2i, 2i+1): a big pair straddling the boundary is not a pair
    assert pair_counts(np.array([[1, 127, 127, 1]], np.int8))[1] == 0


def test_conv_reduction_order_is_channel_fastest():
    # [M=1, C=2, kh=1, kw=2]: K order (tap0,c0) (tap0,c1) (tap1,c0) (tap1,c1)
    w = np.array([[[[1, 2]], [[3, 4]]]], np.int8)
    assert reduction_layout("Conv", w, {}).tolist() == [[1, 3, 2, 4]]
    b = np.arange(6, dtype=np.int8).reshape(3, 2)  # MatMul B [K=3, N=2]
    assert reduction_layout("MatMul", b, {}).tolist() == [[0, 2, 4], [1, 3, 5]]


def _qdq_model(w_int8, act_type, k):
    at = TensorProto.UINT8 if act_type == "u8" else TensorProto.INT8
    n = w_int8.shape[1]
    inits = [numpy_helper.from_array(w_int8, "w_q"), numpy_helper.from_array(np.array(0.01, np.float32), "w_s"),
             numpy_helper.from_array(np.array(0, np.int8), "w_zp"),
             numpy_helper.from_array(np.array(0.02, np.float32), "x_s"),
             numpy_helper.from_array(np.array(0, np.uint8 if act_type == "u8" else np.int8), "x_zp")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_s", "x_zp"], ["x_q"]),
             helper.make_node("DequantizeLinear", ["x_q", "x_s", "x_zp"], ["x_dq"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["w_dq"]),
             helper.make_node("MatMul", ["x_dq", "w_dq"], ["y"], name="fc")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_lint_qdq_u8s8_flags_x86_only():
    w = np.zeros((4, 2), np.int8)
    w[0, 0], w[1, 0] = 120, 100    # column 0: one saturating pair
    w[2, 1], w[3, 1] = -127, -127  # column 1: saturates on x86; no -128, so no NEON wrap
    [row] = lint_model(_qdq_model(w, "u8", 4))
    assert row.node == "fc" and row.act_type == "uint8" and row.k == 4
    assert row.x86_saturating_pairs == 2 and row.neon_wrapping_pairs == 0
    assert row.tiers == ["x86-vpmaddubsw"] and row.int32_ok
    w[2, 1], w[3, 1] = -128, -128  # a -128 pair: U8 activations are shifted to S8 on NEON-only cores
    [row] = lint_model(_qdq_model(w, "u8", 4))
    assert row.neon_wrapping_pairs == 1 and row.tiers == ["x86-vpmaddubsw", "arm-neon"]
    assert "U8 activations are shifted to S8" in row.reason


def test_lint_qdq_s8s8_flags_neon_wrap():
    w = np.array([[-128], [-128]], np.int8)
    [row] = lint_model(_qdq_model(w, "s8", 2))
    assert row.act_type == "int8"
    assert row.tiers == ["x86-vpmaddubsw", "arm-neon"]
    assert "S8 activations are shifted to U8" in row.reason


def test_lint_clean_weights_and_int32_bound():
    w = np.full((4, 3), 60, np.int8)  # 255*120 = 30600: fits
    [row] = lint_model(_qdq_model(w, "u8", 4))
    assert row.tiers == [] and row.reason == "exact on every tier"
    big = np.ones((70000, 1), np.int8)
    [row] = lint_model(_qdq_model(big, "u8", 70000))
    assert not row.int32_ok and "all" in row.tiers


def test_lint_integer_ops_and_reduce_range_model(tmp_path):
    from explain_helpers import saturating_matmul, static_qdq

    fm = saturating_matmul(tmp_path / "f.onnx")
    plain = lint_model(static_qdq(fm, tmp_path, "plain"))
    rr = lint_model(static_qdq(fm, tmp_path, "rr", reduce_range=True))
    assert plain[0].x86_saturating_pairs > 0 and plain[0].tiers == ["x86-vpmaddubsw"]
    assert rr[0].x86_saturating_pairs == 0 and rr[0].tiers == []
    # MatMulInteger (dynamic quantization form)
    w = np.full((2, 1), 127, np.int8)
    g = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"], name="mmi")], "g",
                          [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])],
                          [numpy_helper.from_array(w, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    [row] = lint_model(m)
    assert row.op_type == "MatMulInteger" and row.x86_saturating_pairs == 1 and row.act_type == "uint8"


def test_lint_command(workdir, capsys):
    from quantbench.cli import main

    w = np.zeros((4, 2), np.int8)
    w[0, 0], w[1, 0] = 120, 100
    onnx.save(_qdq_model(w, "u8", 4), workdir / "m.onnx")
    assert main(["lint", str(workdir / "m.onnx"), "--tables", str(workdir / "t")]) == 0
    out = capsys.readouterr().out
    assert "fc" in out and "x86-vpmaddubsw" in out and "fleet hosts affected" not in out
    report = (workdir / "report.md").read_text()
    assert "### Saturation lint" in report and "| m.onnx | fc | MatMul | 4 |" in report
    assert main(["lint", str(workdir / "missing.onnx")]) == 2
