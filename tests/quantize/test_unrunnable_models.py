"""Models calibration could never finish with are refused before anything is written, one line naming the part:
weights holding NaN or an infinity (no scale quantizes them; was onnxruntime's `AssertionError: scale issue`), and a
Loop of a fixed 1e15 iterations (calibration runs the model on every image; it never ended)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from calib_helpers import make_corpus, tiny_model
from cli_helpers import digest, one_line


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_weights_are_one_line_before_calibration(workdir, value):
    labels, _ = make_corpus(workdir / "corpus", n_litter=4, n_negative=4, n_eval=2)
    path = tiny_model(workdir / "models" / "tiny.onnx")
    model = onnx.load(str(path))
    for i, init in enumerate(model.graph.initializer):
        if init.name == "W1":
            arr = np.full(numpy_helper.to_array(init).shape, value, dtype=np.float32)
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(arr, "W1"))
    onnx.save(model, str(path))
    before = digest(workdir)
    proc = subprocess.run([sys.executable, "-m", "quantbench", "calibrate", "--model", str(path), "--labels",
                           str(labels), "--per-cell", "2", "--methods", "minmax", "--no-progress"],
                          cwd=workdir, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr
    n = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "W1")).size
    assert one_line(proc.stderr, "calibrate") == (
        f"quantbench calibrate: error: {path}: weight 'W1' holds {n} of {n} values that are NaN or infinite; "
        "quantization needs finite weights (fix or retrain the model)")
    assert digest(workdir) == before


def _with_loop(path, trips: int, cond_from_body: str) -> None:
    """The model with a Loop node added (its count a graph output): `trips` fixed iterations, the body's
    condition its input passed on (Identity), or computed (Less of the counter: a while loop)."""
    from onnx import TensorProto, helper

    model = onnx.load(str(path))
    one = helper.make_tensor("one", TensorProto.INT64, [], [1])
    body_nodes = [helper.make_node("Constant", [], ["one_b"], value=one),
                  helper.make_node("Add", ["n_in", "one_b"], ["n_out"])]
    if cond_from_body == "identity":
        body_nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    else:
        lim = helper.make_tensor("lim", TensorProto.INT64, [], [3])
        body_nodes += [helper.make_node("Constant", [], ["lim_b"], value=lim),
                       helper.make_node("Less", ["n_out", "lim_b"], ["cond_out"])]
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("n_in", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("n_out", TensorProto.INT64, [])])
    g = model.graph
    g.initializer.extend([numpy_helper.from_array(np.array(trips, dtype=np.int64), "trips"),
                          numpy_helper.from_array(np.array(True), "go"),
                          numpy_helper.from_array(np.array(0, dtype=np.int64), "n0")])
    g.node.append(helper.make_node("Loop", ["trips", "go", "n0"], ["count"], name="spin", body=body))
    g.output.append(helper.make_tensor_value_info("count", TensorProto.INT64, []))
    onnx.save(model, str(path))


def test_a_loop_of_a_fixed_1e15_iterations_is_refused_by_name(workdir):
    labels, _ = make_corpus(workdir / "corpus", n_litter=4, n_negative=4, n_eval=2)
    path = tiny_model(workdir / "models" / "tiny.onnx")
    _with_loop(path, 10 ** 15, "identity")
    before = digest(workdir)
    proc = subprocess.run([sys.executable, "-m", "quantbench", "calibrate", "--model", str(path), "--labels",
                           str(labels), "--per-cell", "2", "--methods", "minmax", "--no-progress"],
                          cwd=workdir, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr
    assert one_line(proc.stderr, "calibrate") == (
        f"quantbench calibrate: error: {path}: Loop node 'spin' runs a fixed 1000000000000000 iterations, more than "
        "the limit of 1,000,000; export it with the trip count it needs")
    assert digest(workdir) == before


def test_a_while_loop_with_a_huge_bound_is_not_refused(tmp_path):
    """PyTorch exports a while loop as Loop(INT64_MAX, cond) whose body computes its condition: it is kept."""
    from quantbench.quantize.intake import check_loops

    path = tiny_model(tmp_path / "tiny.onnx")
    _with_loop(path, 2 ** 63 - 1, "computed")
    check_loops(onnx.load(str(path)), path)
