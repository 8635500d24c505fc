"""localize on a constructed two-host divergence whose first divergent node is known.

The two hosts are this machine's onnxruntime with and without the session config
entry session.set_denormal_as_zero=1, each in its own worker process. The model
scales the input, multiplies by 1e-39 (node "tiny": a denormal result, which the
DAZ/FTZ host flushes to zero), then by 1e38 (node "big") and adds a constant, so
the first divergent node is "tiny" and the divergence reaches the output.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantbench.store import partread, partwrite
from quantbench.inputs.fixtures import Fixture
from quantbench.tensorcode import tensor_sha256
from setup_required import missing_setup


def _model(path):
    c = {n: numpy_helper.from_array(np.array([v], np.float32), n) for n, v in
         (("two", 2.0), ("small", 1e-39), ("huge", 1e38), ("one", 1.0))}
    nodes = [helper.make_node("Mul", ["x", "two"], ["a"], name="scale"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "small"], ["b"], name="tiny"),
             helper.make_node("Mul", ["b", "huge"], ["c"], name="big"),
             helper.make_node("Add", ["c", "one"], ["y"], name="shift")]
    g = helper.make_graph(nodes, "daz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], list(c.values()))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def _fixture():
    x = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    return Fixture(fixture_id=tensor_sha256(x), input_name="x", array=x, source="", image_sha256="")


def _daz_applies() -> bool:
    """Whether session.set_denormal_as_zero changes anything on this CPU: onnxruntime applies it only where its CPU
    detection reports DAZ, which a CPU without XSAVE is not (measured: the masked SSE4.2 Nehalem tier and qemu's
    Nehalem model alike leave every byte as it was; the AVX tier and up flush). From the features this process's
    CPUID shows (a whole-process mask included)."""
    from quantbench.hosts.masked import here_features

    return "xsave" in here_features()


def test_first_divergent_node_is_the_denormal_multiply(workdir):
    from quantbench.explain.localize import localize
    from quantbench.hosts.registry import parse_hosts

    path = _model(workdir / "daz.onnx")
    hosts = parse_hosts("x86,x86+session.set_denormal_as_zero=1", {"graph_optimization_level": "basic"})
    res = localize(path, hosts, _fixture(), group=2, progress=False, tables_root=workdir / "t")
    assert res.opt_level == "basic"
    if not _daz_applies():
        assert res.first == [] and all(r.same for r in res.rows)
        return
    assert [r.node for r in res.first] == ["tiny"]
    same = {r.tensor: r.same for r in res.rows}
    assert same["a"] and same["r"] and not same["b"] and not same["c"] and not same["y"]
    assert all(res.reproduces.values())
    out = res.outputs[0]
    assert not out.same and out.bits_min == 0 and out.max_abs > 0.1
    assert res.first[0].bits_min == 0  # a denormal against zero: nothing left in common
    assert res.unobservable == 0
    # 4 intermediates in groups of 2: 2 group runs + the unmodified run + the fetch of the first node
    assert res.runs == 4
    partwrite.append("localize", res.table_rows(), root=workdir / "t")
    back = partread.read("localize", root=workdir / "t")
    assert back.num_rows == 5 and back.column("first_divergent").to_pylist().count(True) == 1


def test_first_only_stops_after_the_group_holding_the_first_divergent_tensor(workdir):
    """first_only (the search's use): groups of one, the walk stops once "b" (tiny's output) is known divergent:
    the unmodified run + 3 group runs, nothing after; max_runs stops before a group would exceed it."""
    from quantbench.explain.localize import localize
    from quantbench.hosts.registry import parse_hosts

    if not _daz_applies():
        pytest.skip("session.set_denormal_as_zero changes nothing on this CPU: no divergence to find")
    path = _model(workdir / "daz.onnx")
    hosts = parse_hosts("x86,x86+session.set_denormal_as_zero=1", {"graph_optimization_level": "basic"})
    res = localize(path, hosts, _fixture(), group=1, progress=False, tables_root=workdir / "t", first_only=True)
    assert [r.tensor for r in res.first] == ["b"] and res.first[0].node == "tiny"
    assert res.runs == 4 and res.host_runs == 4 and res.stopped.startswith("first_only")
    assert "c" not in {r.tensor for r in res.rows} and res.first[0].bits_mean is None   # no fetch
    short = localize(path, hosts, _fixture(), group=1, progress=False, tables_root=workdir / "t", max_runs=3)
    assert short.first == [] and short.host_runs <= 3 and short.stopped.startswith("max_runs")
    assert short.trend.startswith("stopped before a divergent tensor was found")
    full = localize(path, hosts, _fixture(), group=1, progress=False, tables_root=workdir / "t")
    assert [r.node for r in full.first] == ["tiny"] and full.stopped == "" and full.runs == 6


def test_a_first_divergent_tensor_maps_to_the_mac_node_upstream_of_it():
    """A QDQ chain DQ -> Conv -> Relu -> Q -> DQ -> MatMul -> Q: the fused conv's quantized output (what localize
    names first divergent at level all) maps to the Conv, the MatMul's to the MatMul; a tensor with no
    multiply-accumulate node upstream, or one not among the nodes the search keeps, maps to none."""
    from quantbench.explain.search.space import mac_node_of

    nodes = [helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["x"], name="dq_in"),
             helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("QuantizeLinear", ["r", "s", "z"], ["rq"], name="q_conv"),
             helper.make_node("DequantizeLinear", ["rq", "s", "z"], ["rd"], name="dq_conv"),
             helper.make_node("MatMul", ["rd", "w2"], ["mm"], name="fc"),
             helper.make_node("QuantizeLinear", ["mm", "s", "z"], ["mq"], name="q_fc")]
    model = helper.make_model(helper.make_graph(nodes, "chain", [], []))
    macs = ("conv", "fc")
    assert mac_node_of(model, "rq", macs) == "conv" and mac_node_of(model, "rd", macs) == "conv"
    assert mac_node_of(model, "mq", macs) == "fc" and mac_node_of(model, "c", macs) == "conv"
    assert mac_node_of(model, "x", macs) is None and mac_node_of(model, "mq", ("conv",)) == "conv"


def test_identical_hosts_report_no_divergence(workdir):
    from quantbench.explain.localize import localize
    from quantbench.hosts.registry import parse_hosts

    path = _model(workdir / "daz.onnx")
    hosts = parse_hosts("x86,local", {"graph_optimization_level": "basic"})
    res = localize(path, hosts, _fixture(), group=8, progress=False, tables_root=workdir / "t")
    assert res.first == [] and all(r.same for r in res.rows)
    assert res.trend.startswith("no divergence")


def test_host_override_syntax_errors():
    from quantbench.errors import UserError
    from quantbench.hosts.registry import parse_hosts

    with pytest.raises(UserError, match="KEY=VALUE"):
        parse_hosts("x86+oops")
    with pytest.raises(UserError, match="unknown host"):
        parse_hosts("nosuchhost")
    hr = parse_hosts("x86+graph_optimization_level=disabled+session.x64quantprecision=1")[0]
    assert hr.session["graph_optimization_level"] == "disabled"
    assert hr.session["config_entries"] == {"session.x64quantprecision": "1"}


@pytest.mark.slow
def test_qdq_saturation_localised_between_local_and_avx2(workdir):
    """Static QDQ U8S8 MatMul that saturates vpmaddubsw on Haswell: at level 'all' the
    DequantizeLinear/MatMul tensors inside the fused group are not observable (exposing
    them stops the QDQ fusion, which the fidelity check detects), and the first
    divergent observable tensor is the fused MatMul's quantized output."""
    from explain_helpers import exact_int8_host, fixture, saturating_inputs, saturating_matmul, static_qdq
    from quantbench.explain.localize import localize, summary
    from quantbench.hosts.registry import parse_hosts
    from quantbench.hosts import emulated as EM

    ok, msg = EM.ready("x86-avx2")
    if not ok:
        missing_setup(f"x86-avx2 not set up: {msg}")
    exact = exact_int8_host()  # this machine with VNNI/AMX, else the emulated SSE4.2 host
    fp32 = saturating_matmul(workdir / "fp32.onnx")
    qdq = static_qdq(fp32, workdir, "qdq", feeds=saturating_inputs(count=4, seed=7))
    hosts = parse_hosts(f"{exact},x86-avx2")
    res = localize(qdq, hosts, fixture(saturating_inputs(count=1)[0]), group=8, progress=False,
                   tables_root=workdir / "t")
    print(summary(res))
    assert res.opt_level == "all" and all(res.reproduces.values())
    assert res.unobservable >= 1
    assert len(res.first) == 1 and res.first[0].op_type == "QuantizeLinear"
    producer_of_input_q = min(r.position for r in res.rows if r.op_type == "QuantizeLinear")
    assert res.first[0].position > producer_of_input_q  # the input's own quantization agrees
    assert not res.outputs[0].same and res.outputs[0].max_abs > 1.0


def test_localize_command_on_corpus_fixture(workdir, capsys):
    """The CLI end to end: a bundled-corpus fixture, two local hosts, table and report written."""
    from quantbench.cli import main

    c = {n: numpy_helper.from_array(np.array([v], np.float32), n) for n, v in
         (("small", 1e-39), ("huge", 1e38), ("one", 1.0))}
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[2, 3], keepdims=0, name="pool"),
             helper.make_node("Mul", ["m", "small"], ["b"], name="tiny"),
             helper.make_node("Mul", ["b", "huge"], ["c"], name="big"),
             helper.make_node("Add", ["c", "one"], ["logits"], name="shift")]
    g = helper.make_graph(nodes, "daz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 3])], list(c.values()))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, workdir / "cli.onnx")
    from quantbench.inputs.assets import CORPUS_LABELS

    # a bare model that is not the demo's runs on the bundled images only when they are asked for
    rc = main(["localize", "--variant", str(workdir / "cli.onnx"), "--hosts", "x86,x86+session.set_denormal_as_zero=1",
               "--fixtures", str(CORPUS_LABELS), "--graph-opt", "basic", "--tables", str(workdir / "results" / "tables"), "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    if not _daz_applies():
        assert "no divergence: every observable tensor and every output is byte-identical" in out
        return
    assert "first divergent node: tiny (Mul, position 1)" in out
    assert "localised at graph optimisation level 'basic'" in out
    report = (workdir / "results" / "report.md").read_text()
    assert "### First divergent node (`localize`)" in report and "tiny (Mul)" in report
    assert main(["localize", "--variant", str(workdir / "cli.onnx"), "--hosts", "x86"]) == 2
