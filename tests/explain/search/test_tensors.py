"""The search's per-node tensor choices (onnxruntime's per-tensor quantization overrides) on a transformer-like
classifier (tests/model_helpers.transformer_like_classifier): a bias channel at 1000 stretches fc1's output range so
int8 activations round its informative channels away and flip the top class on every fixture, while its int8
weights do not. 16-bit activations on fc1 (the A16W8 QDQ form) keep every weight in int8 and meet a budget of 0
flips; keeping nodes in float is the only other way and leaves no int8 multiply-accumulate. Percentile and
symmetric ranges per node are walked too (8-bit, first). Searched on the masked AVX2 tier (the same kernels on any
CPU with AVX2+FMA): on a Zen 5's own kernels (AVX-512 VNNI) the 16-bit form flipped 3 of 4 as the int8 one did."""

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
