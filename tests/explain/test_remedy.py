"""Remedy matrix on a model that splits x86-avx2 from the others.

A static QDQ U8S8 MatMul whose weight columns have one sign and large magnitudes,
fed activations near 255: vpmaddubsw's int16 pair sums saturate on Haswell (AVX2),
while this machine's kernel (AVX-512 VNNI, or AMX) is exact. reduce_range and
session.x64quantprecision=1 must close the gap (as measured in the notes).
"""

import json

import pytest

from quantbench.analysis.decode import spec_from_sidecar
from explain_helpers import (exact_int8_host, fixture, saturating_inputs, saturating_matmul, shared_weight_matmuls,
                             static_qdq)
from setup_required import missing_setup


def test_build_remedies_offline(workdir):
    from quantbench.explain.lint import lint_model
    from quantbench.explain.remedy import build_remedies

    fp32 = saturating_matmul(workdir / "fp32.onnx")
    base = static_qdq(fp32, workdir, "base")
    rvs = build_remedies(base, fp32, workdir / "rem", {"activation_type": "u8", "weight_type": "s8"},
                         workdir / "base.ranges.json")
    by = {r.remedy: r for r in rvs}
    assert list(by) == ["baseline", "x64quantprecision", "reduce_range", "s8s8", "u8u8", "disable_kleidiai"]
    assert by["x64quantprecision"].config_entries == {"session.x64quantprecision": "1"}
    assert by["disable_kleidiai"].config_entries == {"mlas.disable_kleidiai": "1"}
    assert by["disable_kleidiai"].path == base
    assert by["reduce_range"].path is not None and "ranges from base.ranges.json" in by["reduce_range"].note
    # the lint predicts the split and that reduce_range removes it
    assert lint_model(base)[0].tiers == ["x86-vpmaddubsw"]
    assert lint_model(by["reduce_range"].path)[0].x86_saturating_pairs == 0
    for r in rvs:
        assert r.path is not None or r.note.startswith("not supported")


@pytest.mark.slow
def test_remedy_matrix_closes_the_avx2_gap(workdir):
    from quantbench.hosts.registry import parse_hosts
    from quantbench.explain.remedy import build_remedies, remedy_matrix, table
    from quantbench.hosts import emulated as EM

    ok, msg = EM.ready("x86-avx2")
    if not ok:
        missing_setup(f"x86-avx2 not set up: {msg}")
    exact = exact_int8_host()  # the 'other' class: an exact int8 kernel
    fp32 = saturating_matmul(workdir / "fp32.onnx")
    # calibrated on inputs like the fixtures, so the output range is not clipped (which would hide the saturation)
    base = static_qdq(fp32, workdir, "base", feeds=saturating_inputs(count=4, seed=7))
    rvs = build_remedies(base, fp32, workdir / "rem", {"activation_type": "u8", "weight_type": "s8"},
                         workdir / "base.ranges.json")
    hosts = parse_hosts(f"{exact},x86-avx2")
    fxs = [fixture(x) for x in saturating_inputs(count=3)]
    spec = spec_from_sidecar({"decode": {"kind": "classifier-softmax", "logits": "logits"}})
    rows = remedy_matrix(rvs, fp32, hosts, fxs, spec, "base", progress=False)
    by = {r.remedy: r for r in rows}
    print(table(rows))
    assert by["baseline"].classes == 2 and not by["baseline"].one_class
    cmap = json.loads(by["baseline"].class_map)
    assert cmap[exact] != cmap["x86-avx2"]
    assert by["x64quantprecision"].one_class
    # the first row names each host's int8 path (from its fingerprint) and the hosts the shipped layers affect
    note = rows[0].note
    assert "saturating VPMADDUBSW path: x86-avx2 (avx2 without" in note and f"exact: {exact} (" in note
    assert note.endswith("hosts affected: x86-avx2")
    assert by["reduce_range"].one_class
    for r in rows:
        if r.supported:
            assert r.flips_total is not None and r.flips_max <= 3 and r.fixtures == 3


def test_a_remedy_onnxruntime_cannot_build_is_a_row(workdir):
    """onnxruntime 1.32.0 cannot make a session of a static QDQ model with a shared int8 weight under
    session.x64quantprecision=1 (its QDQS8ToU8Transformer adds the converted weight twice: "Attempt to replace
    the existing tensor"; the demo detector's decoder shares two). That remedy is a row saying so; the others
    still run."""
    from quantbench.explain.remedy import build_remedies, remedy_matrix, table
    from quantbench.hosts.masked import here_features
    from quantbench.hosts.registry import parse_hosts

    fp32 = shared_weight_matmuls(workdir / "fp32.onnx")
    base = static_qdq(fp32, workdir, "base")
    rvs = build_remedies(base, fp32, workdir / "rem", {"activation_type": "u8", "weight_type": "s8"},
                         workdir / "base.ranges.json", remedies=("baseline", "x64quantprecision", "reduce_range"))
    spec = spec_from_sidecar({"decode": {"kind": "classifier-softmax", "logits": "logits"}})
    fxs = [fixture(x, "x") for x in saturating_inputs(k=8, count=2)]
    rows = remedy_matrix(rvs, fp32, parse_hosts("x86"), fxs, spec, "base", progress=False)
    by = {r.remedy: r for r in rows}
    assert by["baseline"].supported and by["reduce_range"].supported and by["reduce_range"].one_class
    if "avx2" not in here_features():  # the transformer applies with AVX2 and up (measured: SSE4.2 builds it)
        assert by["x64quantprecision"].supported
        return
    bad = by["x64quantprecision"]
    assert not bad.supported and bad.classes is None and bad.flips_total is None
    assert bad.note.startswith("onnxruntime cannot make this session on x86: ")
    assert "Attempt to replace the existing tensor" in bad.note and "\n" not in bad.note
    assert "onnxruntime cannot make this session on x86" in table(rows)


def test_disabling_kleidiai_is_tried_only_where_a_host_has_sme():
    """mlas.disable_kleidiai changes nothing without SME (KleidiAI's SME kernels run nowhere else): on such a fleet
    the remedy is a row saying so, on a fleet with an SME host it runs."""
    from types import SimpleNamespace

    from quantbench.explain.remedy import RemedyVariant, _not_here

    rv = RemedyVariant("disable_kleidiai", "v.onnx", {"mlas.disable_kleidiai": "1"}, "same model, session config "
                       "mlas.disable_kleidiai=1 (MLAS's kernels, not KleidiAI's SME ones)")

    def worker(*flags):
        return SimpleNamespace(fingerprint={"identity": {"isa_flags": list(flags)}})

    skipped = _not_here(rv, [worker("asimd", "asimddp"), worker("avx2", "fma")])
    assert skipped.path is None and skipped.note.startswith("not tried: no host here has SME")
    assert _not_here(rv, [worker("asimd"), worker("asimd", "sve", "sme")]) is rv
    other = RemedyVariant("x64quantprecision", "v.onnx", {"session.x64quantprecision": "1"})
    assert _not_here(other, [worker("asimd")]) is other


@pytest.mark.slow
def test_disabling_kleidiai_brings_the_sme_phone_into_the_class_of_its_sve_twin(workdir):
    """phone-sme2 (SVE 128 + SME 512) and graviton4 (SVE 128, no SME) split on the demo detector's fp32; with
    mlas.disable_kleidiai=1 the phone runs MLAS's own kernels and computes graviton4's bytes (measured: the SME
    difference is KleidiAI's kernels alone)."""
    from quantbench.analysis.decode import spec_from_sidecar
    from quantbench.explain.remedy import build_remedies, remedy_matrix
    from quantbench.hosts import emulated as EM
    from quantbench.hosts.registry import parse_hosts
    from quantbench.inputs import assets, sidecarfile
    from quantbench.inputs.fixtures import build_fixtures
    from quantbench.inputs.modelio import load_model
    from quantbench.inputs.preprocess import input_spec

    for name in ("phone-sme2", "graviton4"):
        ok, msg = EM.ready(name)
        if not ok:
            missing_setup(f"{name} not set up: {msg}")
    model = assets.demo_model()
    first = load_model(model).graph.input[0]
    sidecar = sidecarfile.load_sidecar(model)
    fxs = build_fixtures(input_spec(sidecar, [d.dim_value or 1 for d in first.type.tensor_type.shape.dim], first.name),
                         split="eval", limit=2)
    rvs = build_remedies(model, model, workdir / "rem", remedies=("baseline", "disable_kleidiai"))
    hosts = parse_hosts("phone-sme2+intra_op_num_threads=1,graviton4+intra_op_num_threads=1")
    rows = remedy_matrix(rvs, model, hosts, fxs, spec_from_sidecar(sidecar), "fp32", progress=False)
    by = {r.remedy: r for r in rows}
    assert by["baseline"].classes == 2
    assert by["disable_kleidiai"].supported and by["disable_kleidiai"].one_class
    assert json.loads(by["disable_kleidiai"].session_options)["config_entries"] == {"mlas.disable_kleidiai": "1"}
