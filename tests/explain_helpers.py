"""Small models and fixtures shared by the explain tests (tiny, built with onnx.helper)."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantbench.inputs.fixtures import Fixture
from quantbench.tensorcode import tensor_sha256


def _save(graph, path):
    """`graph` as an opset-13 model file at `path` (IR 8: what onnxruntime 1.32 and the quantizer take)."""
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def _image_classifier(path, name: str, size: int, classes: int, weights: dict, layers: list):
    """images[1,3,size,size] -> Flatten (`f`) -> `layers` ((op, inputs, output, node name), the last writing
    `logits`) -> logits[1,classes], with `weights` (name -> array) as initializers."""
    nodes = [helper.make_node("Flatten", ["images"], ["f"], name="flatten")]
    nodes += [helper.make_node(op, inputs, [out], name=node) for op, inputs, out, node in layers]
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])],
                          [numpy_helper.from_array(w, k) for k, w in weights.items()])
    return _save(g, path)


def fixture(arr, name="x"):
    arr = np.ascontiguousarray(arr)
    return Fixture(fixture_id=tensor_sha256(arr), input_name=name, array=arr, source="", image_sha256="")


def saturating_matmul(path, k=64, n=8, seed=0):
    """A float MatMul whose U8S8 QDQ form saturates vpmaddubsw: every weight column has
    one sign and large magnitudes, and the activations sit near the top of their range."""
    rng = np.random.default_rng(seed)
    signs = np.where(np.arange(n) % 2 == 0, 1.0, -1.0).astype(np.float32)
    w = (rng.uniform(0.5, 1.0, (k, n)).astype(np.float32) * signs)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"], name="fc")], "sat",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", k])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", n])],
        [numpy_helper.from_array(w, "w")])
    return _save(g, path)


def shared_weight_matmuls(path, k=8, seed=0):
    """Two MatMuls that share one weight (tied weights, as in decoders that reuse a layer): its static QDQ
    form has one int8 initializer under two DequantizeLinear nodes."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.5, (k, k)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc1"), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w"], ["logits"], name="fc2")], "shared",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", k])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", k])],
        [numpy_helper.from_array(w, "w")])
    return _save(g, path)


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


def saturating_image_model(path, size: int = 8, classes: int = 8, seed: int = 0):
    """images[1,3,size,size] -> logits[1,classes] with one node that saturates vpmaddubsw and ordinary ones:
    `fc_sat` (every weight column one sign, large magnitudes: fed bright images its U8S8 pair sums pass int16),
    beside `fc_side` and after them `fc_head` (weights whose adjacent K pairs never share a sign, so no pair
    can saturate). A stand-in image classifier for the CLI on a corpus of bright images."""
    rng = np.random.default_rng(seed)
    k = 3 * size * size
    signs = np.where(np.arange(classes) % 2 == 0, 1.0, -1.0).astype(np.float32)
    w_sat = rng.uniform(0.5, 1.0, (k, classes)).astype(np.float32) * signs / k
    alt = np.where(np.arange(k) % 2 == 0, 1.0, -1.0).astype(np.float32)[:, None]
    w_side = (rng.uniform(0.2, 1.0, (k, classes)) * alt * 0.01).astype(np.float32)
    w_head = np.zeros((classes, classes), np.float32)
    for j in range(classes):
        for i in range(classes):
            w_head[i, j] = 0.05 * (1 if i % 2 == 0 else -1) if i // 2 != j // 2 else 0.0
        w_head[j, j] = 1.0
    return _image_classifier(path, "sat_image", size, classes, {"w_sat": w_sat, "w_side": w_side, "w_head": w_head},
                             [("MatMul", ["f", "w_sat"], "a", "fc_sat"), ("MatMul", ["f", "w_side"], "b", "fc_side"),
                              ("Add", ["a", "b"], "h", "add"), ("MatMul", ["h", "w_head"], "logits", "fc_head")])


def tied_logits_image_model(path):
    """images -> Flatten -> fc1 -> fc2 -> fc3 -> Mul(scale) -> logits, classes 0 and 1 tied but for a 1e-4 larger
    scale on class 1 (identical weight columns, identity fc2/fc3; a vector scale, which no fusion folds into a
    MatMul) and the rest far below: the Mul's u8 output (a step of ~0.04 over its range) rounds the two to one
    value, so the top class moves from 1 to 0 on every host wherever the Mul is quantized, whatever
    Conv/MatMul/Gemm nodes are kept in float."""
    k, n = 3 * 8 * 8, 8
    w1 = np.full((k, n), -10.0 / k, np.float32)
    w1[:, 0] = w1[:, 1] = 1.0 / k
    scale = np.ones(n, np.float32)
    scale[1] += 1e-4
    eye = np.eye(n, dtype=np.float32)
    return _image_classifier(path, "tied", 8, n, {"w1": w1, "w2": eye, "w3": eye, "scale": scale},
                             [("MatMul", ["f", "w1"], "a", "fc1"), ("MatMul", ["a", "w2"], "b", "fc2"),
                              ("MatMul", ["b", "w3"], "c", "fc3"), ("Mul", ["c", "scale"], "logits", "scale")])


def near_tie_image_model(path, size: int = 8, classes: int = 8, seed: int = 0):
    """images[1,3,size,size] -> Flatten -> `fc` (one MatMul) -> logits[1,classes] where classes 0 and 1 differ only
    by weights below half an int8 step: column 1 is column 0 (integers times a step, one at 127, so both columns
    take the same per-channel and per-tensor scale) plus 0.2 step on 32 elements, the other classes far below. On
    bright images fp32 picks class 1; every int8 form of `fc` (any scale, S8 or U8, 7 or 8 bits) rounds the two
    columns to the same integers, ties them and serves class 0: only `fc` kept in float, the fp32 model itself,
    meets a budget of 0 flips."""
    rng = np.random.default_rng(seed)
    k = 3 * size * size
    step = 1.0 / (k * 64)
    ints = rng.integers(1, 100, k).astype(np.float32)
    ints[0] = 127
    w = np.empty((k, classes), np.float32)
    w[:, 0] = ints * step
    w[:, 1] = w[:, 0]
    w[1:33, 1] += np.float32(0.2 * step)
    for c in range(2, classes):
        w[:, c] = -ints * step
    return _image_classifier(path, "near_tie", size, classes, {"w": w}, [("MatMul", ["f", "w"], "logits", "fc")])


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


def softmax_sigmoid_image_model(path, size: int = 8, classes: int = 8, seed: int = 0):
    """images -> Flatten -> fc1 (MatMul) -> Sigmoid -> fc2 (MatMul) -> Softmax -> logits: a classifier with the
    activation and normalisation op types a transformer's int8 form may leave in float."""
    rng = np.random.default_rng(seed)
    k = 3 * size * size
    w1 = rng.normal(0, 1.0 / k, (k, 16)).astype(np.float32)
    w2 = rng.normal(0, 0.5, (16, classes)).astype(np.float32)
    return _image_classifier(path, "softmax_sigmoid", size, classes, {"w1": w1, "w2": w2},
                             [("MatMul", ["f", "w1"], "a", "fc1"), ("Sigmoid", ["a"], "s", "act"),
                              ("MatMul", ["s", "w2"], "z", "fc2"), ("Softmax", ["z"], "logits", "norm")])
