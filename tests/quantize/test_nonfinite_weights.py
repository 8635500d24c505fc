"""A model whose weights hold NaN (or an infinity) is refused before calibration, one line naming the weight:
no scale quantizes it (was: onnxruntime's quantizer stopping on `AssertionError: scale issue`)."""

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
