"""Noise floors on the local host: every factor is a row; a non-deterministic model is a harness fault."""

import numpy as np
import onnx
from onnx import TensorProto, helper

from quantbench.analysis.decode import spec_from_sidecar
from explain_helpers import fixture, saturating_inputs, saturating_matmul


def _spec():
    return spec_from_sidecar({"decode": {"kind": "classifier-softmax", "logits": "logits"}})


def test_noise_rows_on_local_host(workdir):
    from quantbench.store import partread, partwrite
    from quantbench.hosts.registry import parse_hosts
    from quantbench.explain.noise import noise_floor, table

    path = saturating_matmul(workdir / "m.onnx")
    fxs = [fixture(x) for x in saturating_inputs(count=8)]
    [host] = parse_hosts("x86")
    rows = noise_floor(path, host, fxs, _spec(), threads=2, batch=8, variant_name="fp32",
                       factors=("repeat", "threads", "batch", "opt_level"))
    by = {r.factor: r for r in rows}
    assert list(by) == ["repeat", "threads", "batch", "opt_level"]
    assert by["repeat"].same_bytes and not by["repeat"].harness_fault and by["repeat"].flips == 0
    assert by["batch"].setting_b == "batch=8" and by["batch"].fixtures == 8
    for r in rows:
        assert r.same_bytes is not None and r.flips is not None
        assert r.same_bytes == (r.differing_fixtures == 0)
    partwrite.append("noise", [r.row() for r in rows], root=workdir / "t")
    assert partread.read("noise", root=workdir / "t").num_rows == 4
    assert "repeat" in table(rows)


def test_deployed_threads_and_provider_against_the_hosts_own_session(workdir):
    """1 thread vs the host's deployed count, and its providers vs the CPU provider alone, each with its flips;
    a host deploying 1 thread and the CPU provider says there is nothing to compare; a fallback is named."""
    from hosts_helpers import need_cores
    from quantbench.hosts.registry import parse_hosts
    from quantbench.explain.noise import FACTORS, noise_floor

    need_cores(2)
    assert FACTORS[-2:] == ("deployed_threads", "provider")
    path = saturating_matmul(workdir / "m.onnx")
    fxs = [fixture(x) for x in saturating_inputs(count=4)]
    plain, deployed = parse_hosts("x86,x86+intra_op_num_threads=2+providers=XnnpackExecutionProvider/CPUExecutionProvider")
    factors = ("deployed_threads", "provider")
    by = {r.factor: r for r in noise_floor(path, plain, fxs, _spec(), factors=factors)}
    assert by["deployed_threads"].same_bytes is None and "deploys 1 intra-op thread" in by["deployed_threads"].note
    assert by["provider"].same_bytes is None and "CPU provider only" in by["provider"].note
    by = {r.factor: r for r in noise_floor(path, deployed, fxs, _spec(), factors=factors)}
    t, p = by["deployed_threads"], by["provider"]
    assert (t.setting_a, t.setting_b) == ("threads=2 (deployed)", "threads=1") and t.flips is not None
    assert t.same_bytes == (t.differing_fixtures == 0) and t.fixtures == 4
    assert p.setting_a == "providers=XnnpackExecutionProvider>CPUExecutionProvider" and p.same_bytes  # it fell back
    assert p.flips == 0 and "requested XnnpackExecutionProvider is not available in this onnxruntime" in p.note


def test_fixed_batch_axis_is_said(workdir):
    from quantbench.hosts.registry import parse_hosts
    from quantbench.explain.noise import noise_floor

    path = saturating_matmul(workdir / "m.onnx")
    m = onnx.load(path)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 1
    onnx.save(m, workdir / "fixed.onnx")
    fxs = [fixture(x) for x in saturating_inputs(count=2)]
    [host] = parse_hosts("x86")
    [row] = noise_floor(workdir / "fixed.onnx", host, fxs, _spec(), factors=("batch",))
    assert row.same_bytes is None and "fixed (1)" in row.note


def test_nondeterministic_model_is_a_harness_fault(workdir):
    from quantbench.hosts.registry import parse_hosts
    from quantbench.explain.noise import noise_floor

    g = helper.make_graph(
        [helper.make_node("RandomUniformLike", ["x"], ["r"], dtype=TensorProto.FLOAT),
         helper.make_node("Add", ["x", "r"], ["logits"])], "rnd",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, workdir / "rnd.onnx")
    [host] = parse_hosts("x86")
    [row] = noise_floor(workdir / "rnd.onnx", host, [fixture(np.zeros((1, 4), np.float32))], None,
                        factors=("repeat",))
    assert row.harness_fault and row.same_bytes is False and "HARNESS FAULT" in row.note
    assert row.flips is None and "no decode spec" in row.note
