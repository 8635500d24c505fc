"""Small models and fixtures shared by the explain tests (tiny, built with onnx.helper)."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantbench.inputs.fixtures import Fixture
from quantbench.tensorcode import tensor_sha256
from models import saturating_matmul, shared_weight_matmuls, saturating_image_model, tied_logits_image_model, near_tie_image_model, softmax_sigmoid_image_model  # noqa: F401 (the catalogue: tests/models.py)


def fixture(arr, name="x"):
    arr = np.ascontiguousarray(arr)
    return Fixture(fixture_id=tensor_sha256(arr), input_name=name, array=arr, source="", image_sha256="")


def saturating_inputs(k=64, count=4, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.9, 1.0, (1, k)).astype(np.float32) for _ in range(count)]


def static_qdq(float_model, workdir, name="static", feeds=None, **kw):
    """A static QDQ (U8S8 MinMax per-channel) variant of a float model, calibrated on `feeds`
    (arrays for its single input; default: 4 uniform [0, 1) tensors)."""
    from quantbench.quantize import variants as QV
    from quantbench.quantize import intake

    float_model = str(float_model)
    m = onnx.load(float_model)
    inp = m.graph.input[0]
    dims = [d.dim_value if d.HasField("dim_value") else 1 for d in inp.type.tensor_type.shape.dim]
    rng = np.random.default_rng(3)
    if feeds is None:
        feeds = [rng.uniform(0, 1, dims).astype(np.float32) for _ in range(4)]
    feeds = [{inp.name: f} for f in feeds]
    prepared = workdir / f"{name}.prepared.onnx"
    intake.prepare(float_model, prepared)
    QV.make_static(prepared, workdir / f"{name}.onnx", inputs=feeds, method="minmax", **kw)
    return workdir / f"{name}.onnx"


def classifier_fixtures(model_path, count):
    m = onnx.load(str(model_path))
    inp = m.graph.input[0]
    dims = [d.dim_value if d.HasField("dim_value") else 1 for d in inp.type.tensor_type.shape.dim]
    rng = np.random.default_rng(5)
    return [fixture(rng.uniform(0, 1, dims).astype(np.float32), inp.name) for _ in range(count)]


def exact_int8_host() -> str:
    """A host whose U8S8 int8 kernel is exact, to stand apart from the saturating AVX2 one: this machine
    when it has VNNI/AMX, else the emulated SSE4.2 Nehalem (its SSE kernel uses exact pmaddwd)."""
    from quantbench.analysis.tiers import int8_path
    from quantbench.hosts import emulated as EM
    from quantbench.hosts.masked import here_features
    from setup_required import missing_setup

    # the features this process's CPUID shows (the local worker's: a whole-process mask included), not /proc/cpuinfo
    if int8_path("x86", "x86_64", here_features()).kind == "exact":
        return "x86"
    ok, msg = EM.ready("x86-sse4")
    if not ok:
        missing_setup(f"x86-sse4 not set up: {msg}")
    return "x86-sse4"


def saturating_int8_host() -> str:
    """A host whose U8S8 int8 kernel saturates (VPMADDUBSW: AVX2 without VNNI): this machine when its own path
    does, else its masked x86-avx2 tier (the same kernels on any CPU with AVX2+FMA; skipped where it has none)."""
    from quantbench.analysis.tiers import int8_path
    from quantbench.hosts.masked import here_features
    from setup_required import need_tier

    if int8_path("x86", "x86_64", here_features()).kind == "saturates":
        return "x86"
    need_tier("x86-avx2")
    return "x86-avx2"


def bright_corpus(folder, count: int = 6, size: int = 8, seed: int = 0):
    """`count` bright PNGs (every channel 230..255: activations near the top of their range) and a COCO
    labels.json, the first half in the train split (calibration), the rest in eval; returns the labels path."""
    import json

    from PIL import Image

    from pathlib import Path

    folder = Path(folder)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    images = []
    for i in range(count):
        px = rng.integers(230, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(px).save(folder / "images" / f"im{i}.png")
        images.append({"id": i + 1, "file_name": f"im{i}.png", "width": size, "height": size,
                       "split": "train" if i < count // 2 else "eval"})
    labels = folder / "labels.json"
    labels.write_text(json.dumps({"images": images, "annotations": [], "categories": [{"id": 1, "name": "x"}]}))
    return labels


def unnamed_nodes(path, op_types=("Conv", "MatMul")):
    """The model at `path` with the names of its `op_types` nodes emptied (as CenterFace's exporter leaves its 63
    Convs), saved in place."""
    m = onnx.load(str(path))
    for node in m.graph.node:
        if node.op_type in op_types:
            node.name = ""
    onnx.save(m, str(path))
    return path
