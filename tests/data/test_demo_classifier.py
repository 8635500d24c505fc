"""The bundled demo classifier litter-cnn: loads, has the promised structure, and scores
on the eval split what its sidecar (and docs/demo.md) report."""

import importlib.util
import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from quantbench.inputs.assets import CORPUS_IMAGES, CORPUS_LABELS, MODELS_DIR
from quantbench.inputs.sidecarfile import load_sidecar
from quantbench.inputs.fixtures import load_coco
from quantbench.inputs.preprocess import input_spec, load_rgb, to_tensor

REPO = Path(__file__).resolve().parents[2]
MODEL = MODELS_DIR / "litter-cnn.onnx"


@pytest.fixture(scope="module")
def sidecar():
    return load_sidecar(MODEL)


def _image_labels(coco, mode):
    spec = importlib.util.spec_from_file_location("train_classifier", REPO / "scripts" / "train_classifier.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.image_labels(coco, mode)


def test_sidecar_describes_the_model(sidecar):
    assert sidecar["name"] == "litter-cnn"
    assert sidecar["decode"]["kind"] == "classifier-softmax"
    assert sidecar["decode"]["logits"] == "logits"
    inp = sidecar["input"]
    assert inp["name"] == "images" and inp["shape"] == [1, 3, 128, 128] and inp["layout"] == "NCHW"
    assert abs(inp["scale"] - 1 / 255) < 1e-12 and len(inp["mean"]) == 3 and all(s > 0 for s in inp["std"])
    assert sidecar["classes"][0] == "none"
    assert (sidecar["label_mode"], len(sidecar["classes"])) in {("binary", 2), ("dominant", 7)}
    for key in ("seed", "torch_version", "corpus_sha256", "epochs"):
        assert sidecar["training"][key] not in (None, "")


def test_model_structure_and_size():
    assert MODEL.stat().st_size <= 1024 * 1024
    m = onnx.load(str(MODEL))
    onnx.checker.check_model(m)
    ops = Counter(n.op_type for n in m.graph.node)
    assert ops["Conv"] >= 8
    assert ops["Relu"] >= 8
    assert ops["MaxPool"] + ops["AveragePool"] + ops["GlobalAveragePool"] >= 2
    assert ops["Gemm"] + ops["MatMul"] >= 1
    # BatchNorm either kept or folded into the convolutions (the exporter folds it in eval mode):
    # folded convolutions carry a bias although the trained ones have none.
    convs = [n for n in m.graph.node if n.op_type == "Conv"]
    assert ops["BatchNormalization"] >= 8 or all(len(n.input) == 3 for n in convs)
    assert [o.name for o in m.graph.output] == ["logits"]
    assert m.opset_import[0].version >= 17


def test_eval_accuracy_matches_the_reported_figure(sidecar):
    coco = load_coco(CORPUS_LABELS, CORPUS_IMAGES)
    classes, labels = _image_labels(coco, sidecar["label_mode"])
    assert classes == sidecar["classes"]
    sess = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    spec = input_spec(sidecar)
    ims = sorted((im for im in coco["images"] if im["split"] == "eval"), key=lambda im: im["file_name"])
    x = np.concatenate([to_tensor(load_rgb(CORPUS_IMAGES / im["file_name"]), spec) for im in ims])
    y = np.array([labels[im["id"]] for im in ims])
    # Batch of 8 through the dynamic batch axis, as the noise-floor work runs it.
    pred = np.concatenate([sess.run(["logits"], {"images": x[i:i + 8]})[0].argmax(1) for i in range(0, len(x), 8)])
    acc = float((pred == y).mean())
    assert len(ims) == sidecar["metrics"]["eval_images"]
    assert abs(acc - sidecar["metrics"]["eval_accuracy"]) <= 0.005
    majority = np.bincount(y).max() / len(y)
    assert acc >= majority + 0.15, (acc, majority)
    # It separates litter from clean ground, not only the majority class.
    litter = y > 0
    assert ((pred > 0) == litter).mean() >= 0.85


def test_readme_reports_the_sidecar_accuracy(sidecar):
    readme = (REPO / "docs" / "demo.md").read_text()
    section = readme.split("<!-- section:demo-classifier -->")[1].split("<!-- /section:demo-classifier -->")[0]
    assert f"{100 * sidecar['metrics']['eval_accuracy']:.1f}%" in section
    assert json.dumps(sidecar["metrics"]["eval_images"]) in section
