"""A project whose sidecar names plug-in code (`evil.py`, which leaves a marker file when imported or
called): the `proj` fixture, and how the plug-in tests edit the sidecar and calibrate."""

import json

import pytest

from calib_helpers import make_corpus, tiny_model
from quantbench.cli import main

# importing this file (or calling it) leaves a marker: proof that it ran
PLUGIN = '''
import pathlib
import numpy as np
pathlib.Path(__file__).with_name("{marker}").write_text("imported")

def prep(rgb, spec):
    return np.zeros(spec["shape"], np.float32)

def dec(outputs, spec):
    y = np.asarray(next(iter(outputs.values())), np.float64).ravel()
    return {{"cls": [int(y.argmax())], "score": [1.0], "kept": [True]}}
'''


@pytest.fixture
def proj(workdir):
    labels, images = make_corpus(workdir / "corpus", n_litter=4, n_negative=4, n_eval=2)
    model = tiny_model(workdir / "m" / "tiny.onnx")
    (workdir / "evil.py").write_text(PLUGIN.format(marker="evil-ran"))
    return workdir, model, labels


def _sidecar(model, **blocks):
    side = json.loads(model.with_suffix(".json").read_text())
    for key, value in blocks.items():
        side[key] = {**side.get(key, {}), **value}
    model.with_suffix(".json").write_text(json.dumps(side))
    return model.with_suffix(".json")


def _calibrate(model, labels, *extra):
    return main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2",
                 "--methods", "dynamic", "--no-progress", *extra])
