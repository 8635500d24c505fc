"""The search's per-node tensor choices (onnxruntime's per-tensor quantization overrides) on a transformer-like
classifier (tests/model_helpers.transformer_like_classifier): a bias channel at 1000 stretches fc1's output range so
int8 activations round its informative channels away and flip the top class on every fixture, while its int8
weights do not. 16-bit activations on fc1 (the A16W8 QDQ form) keep every weight in int8 and meet a budget of 0
flips; keeping nodes in float is the only other way and leaves no int8 multiply-accumulate. Percentile and
symmetric ranges per node are walked too (8-bit, first). Searched on the masked AVX2 tier, the same kernels on any
CPU with AVX2+FMA: the ranking puts first the nodes the weight lint flags for the fleet's saturating int8 path, so
on a CPU whose int8 path is exact (VNNI) nothing is flagged and the answer is 16-bit on fc2 instead."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from model_helpers import transformer_like_classifier
from quantbench.cli import main
from search_helpers import calibrate_small, copy_run, result_of
from setup_required import need_tier

HOST = "x86-avx2"


@pytest.fixture(scope="module")
def outlier(tmp_path_factory):
    """A calibrate run (minmax and percentile) of the transformer-like classifier."""
    return calibrate_small(tmp_path_factory.mktemp("outlier"), transformer_like_classifier, "minmax,percentile")


@pytest.fixture
def outlier_dir(outlier, workdir):
    return copy_run(outlier, workdir)


def _space(workdir):
    from quantbench.explain.search.space import Space
    from quantbench.inputs.variantdir import latest_variants

    base = next(v for v in latest_variants() if v.name == "static-minmax")
    return Space.open(base, workdir)


def _qparams(path) -> dict:
    """{tensor: (scale, zero point)} of every activation QuantizeLinear of the model at `path`."""
    g = onnx.load(str(path)).graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    return {n.input[0]: (float(inits[n.input[1]]), inits[n.input[2]]) for n in g.node if n.op_type == "QuantizeLinear"}


def test_sixteen_bit_activations_on_the_flipping_node_keep_its_weights_in_int8_and_pass_the_gate(outlier_dir, capsys):
    """The search walks 16-bit activations on the ranked nodes before keeping any in float: its answer holds every
    weight in int8, its recipe records the per-tensor overrides, the summary and --json name the choice each
    candidate used, and a fresh `equiv --gate decision` passes it."""
    need_tier(HOST)
    rc = main(["search", "--variant", "static-minmax", "--hosts", HOST, "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0, captured.out
    result = result_of(captured.out)
    chosen = result["chosen"]
    assert chosen["choice"] == "a16x1" and chosen["exclude"] == [] and chosen["int8"]["weights"] == 1.0
    assert chosen["int8"]["macs"] == 0.0   # both MatMuls touch the 16-bit tensor: they run dequantized, not in int8
    assert "  keeps 0.0% of the MACs and 100.0% of the weights in int8" in captured.out
    (node,) = chosen["recipe"]["node_forms"]
    assert chosen["recipe"]["node_forms"] == {node: "a16"} and node.startswith("fc1")
    assert f"  per-node tensor choices: 16-bit activations (A16W8, weights int8) on {node}" in captured.out
    assert "search: a16 on the ranked nodes of choice " in captured.err
    folder = outlier_dir / "results/variants/m"
    recipe = json.loads((folder / f"{result['variant_name']}.recipe.json").read_text())
    assert recipe["extra_options"]["TensorQuantOverrides"]["h"] == [{"quant_type": "u16"}]
    assert recipe["exclude_nodes"] == [] and recipe["weight_type"] == "s8"
    scale, zp = _qparams(folder / f"{result['variant_name']}.onnx")["h"]
    assert zp.dtype == np.uint16 and scale < 0.05   # fc1's output on the 16-bit grid
    floated = [r for r in result["tried"] if r["exclude"] and r["stage"] == "confirm"]
    assert floated and not any(r["passes"] for r in floated)   # float: over budget or no int8 left
    forms = {r["choice"]: r["recipe"]["node_forms"] for r in result["tried"]}
    assert forms["base"] == {} and any(f and set(f.values()) == {"symmetric"} for f in forms.values())
    proc = subprocess.run([sys.executable, "-m", "quantbench", "equiv", "--hosts", HOST, "--variants",
                           str(folder / "fp32.onnx"), str(folder / f"{result['variant_name']}.onnx"), "--gate",
                           "decision", "--no-progress"], cwd=outlier_dir, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_a_node_takes_another_calibration_methods_ranges_or_symmetric_ranges_its_neighbours_keep_theirs(outlier_dir):
    """A per-node calibration method sets that node's tensors to the other method's ranges (calibrate's percentile
    ranges file), and per-node symmetric activations centre its u8 tensors on 128; the tensors of other nodes keep
    the base's parameters; the 8-bit forms come before 16-bit activations."""
    from quantbench.explain.search.tensors import forms, with_forms
    from quantbench.quantize.calibration import load_ranges, ranges_dict

    space = _space(outlier_dir)
    base = space.base_choice()
    assert forms(space, base) == ["percentile", "symmetric", "a16"]
    fc2 = "fc2"
    plain = _qparams(space.build(base, ()).path)
    pct = _qparams(space.build(with_forms(base, "percentile", [fc2]), ()).path)
    sym = _qparams(space.build(with_forms(base, "symmetric", [fc2]), ()).path)
    lo, hi = ranges_dict(load_ranges(space.ranges_files["percentile"]))["z"]
    assert pct["z"][0] == pytest.approx((max(hi, 0) - min(lo, 0)) / 255, rel=1e-5) != plain["z"][0]
    assert int(sym["z"][1]) == 128 != int(plain["z"][1])
    for other in ("f", "n"):   # not fc2's tensors
        assert pct[other] == plain[other] and sym[other] == plain[other]


def test_a_sixteen_bit_tensor_a_weighted_matmul_reads_stays_sixteen_bit_as_the_candidate_is_run(outlier_dir):
    """16-bit activations on fc2 (it reads fc1's 16-bit output): onnxruntime fuses DQ(int8 weight) -> MatMul into a
    MatMulNBits, whose default accuracy level (4) quantizes its float input to int8 in blocks of 32 on the fly,
    taking the 16-bit grid back to 8 bits (here the outlier channel leaves one of 16 inputs non-zero and every
    fixture's top class flips). The candidate carries the session requirement that keeps that input in float
    (accuracy level 1, as onnxruntime's own A16 tests set it), and run with its requirements it serves fp32's
    decisions, on real onnxruntime sessions."""
    import onnxruntime as ort

    from quantbench.explain.search.tensors import with_forms

    space = _space(outlier_dir)
    cand = with_forms(space.base_choice(), "a16", ["fc2"])
    assert cand.entries.get("session.qdq_matmulnbits_accuracy_level") == "1"
    rng = np.random.default_rng(5)
    xs = [rng.uniform(0, 1, (1, 3, 8, 8)).astype(np.float32) for _ in range(6)]

    def top1(path, entries, optimized=None):
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        for k, v in entries.items():
            so.add_session_config_entry(k, v)
        if optimized:
            so.optimized_model_filepath = str(optimized)
        s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        name = s.get_inputs()[0].name
        return [int(s.run(None, {name: x})[0].argmax()) for x in xs]

    built = space.build(cand, ())
    optimized = outlier_dir / "optimized.onnx"
    assert top1(built.path, cand.entries, optimized) == top1(outlier_dir / "results/variants/m/fp32.onnx", {})
    fused = [n for n in onnx.load(str(optimized)).graph.node if n.op_type == "MatMulNBits"]
    assert fused and all(a.i == 1 for n in fused for a in n.attribute if a.name == "accuracy_level")
