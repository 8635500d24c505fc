"""The catalogue of the hand-built ONNX models the tests use (onnx.helper graphs, a few parameters each): one place
to find a model before building another. The helper modules re-export what their tests import by the old names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: the ops of libm_model, one output each
LIBM_OPS = ("Pow", "Log", "Sin", "Cos", "Atan", "Sinh", "Erf", "Tanh", "Exp")


# ---------------------------------------- from model_helpers.py


def save_model(graph, path: Path, opset: int = 17) -> Path:
    """`graph` as a checked model (IR 8, default-domain `opset`) at path (its folder made); returns path."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def make_model(path, *, casts=2, doc="", value_info=False, producer="pytorch", version="2.6.0",
               weight_seed=0, metadata=None):
    """A tiny MatMul + Cast chain; `doc` goes into every node's doc_string."""
    w = np.random.default_rng(weight_seed).standard_normal((4, 4)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h0"], name="mm", doc_string=doc)]
    prev = "h0"
    for i in range(casts):
        to = TensorProto.FLOAT16 if i % 2 == 0 else TensorProto.FLOAT
        nodes.append(helper.make_node("Cast", [prev], [f"c{i}"], to=to, name=f"cast{i}", doc_string=doc))
        prev = f"c{i}"
    out_type = TensorProto.FLOAT16 if casts % 2 == 1 else TensorProto.FLOAT
    nodes.append(helper.make_node("Relu", [prev], ["y"], name="relu", doc_string=doc))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", out_type, [1, 4])],
                              initializer=[numpy_helper.from_array(w, "w")])
    if value_info:
        graph.value_info.extend([helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name=producer,
                              producer_version=version)
    model.ir_version = 8
    for k, v in (metadata or {}).items():
        model.metadata_props.add(key=k, value=v)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


# ---------------------------------------- from hosts_helpers.py


def _save_checked_opset13(graph, path) -> Path:
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="quantbench-tests")
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return Path(path)


def matmul_model(path, n: int = 16, k: int = 4, seed: int = 0) -> Path:
    """x[1,n] -> logits = x @ W (+ softmax probs): two float outputs."""
    w = numpy_helper.from_array(np.random.RandomState(seed).randn(n, k).astype(np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Softmax", ["logits"], ["probs"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, k]),
         helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, k])], [w])
    return _save_checked_opset13(g, path)


def gather_model(path, n: int = 16) -> Path:
    """Gathers data[int(x[0,0])]: an input whose first value is out of range makes onnxruntime raise at run time."""
    data = numpy_helper.from_array(np.arange(4, dtype=np.float32), "data")
    start = numpy_helper.from_array(np.array([0], np.int64), "s0")
    end = numpy_helper.from_array(np.array([1], np.int64), "s1")
    axis = numpy_helper.from_array(np.array([1], np.int64), "ax")
    g = helper.make_graph(
        [helper.make_node("Slice", ["x", "s0", "s1", "ax"], ["first"]),
         helper.make_node("Cast", ["first"], ["idx"], to=TensorProto.INT64),
         helper.make_node("Gather", ["data", "idx"], ["y"], axis=0)],
        "gather", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])], [data, start, end, axis])
    return _save_checked_opset13(g, path)


def slow_model(path, n: int = 16, rows: int = 128, size: int = 384, layers: int = 24) -> Path:
    """x[1,n] tiled to rows x n, then a chain of size x size MatMuls: ~0.1-0.3 s per fixture, so a run can be killed midway."""
    rs = np.random.RandomState(1)
    inits = [numpy_helper.from_array(np.array([rows, 1], np.int64), "reps"),
             numpy_helper.from_array((rs.randn(n, size) / np.sqrt(n)).astype(np.float32), "w_in")]
    nodes = [helper.make_node("Tile", ["x", "reps"], ["xt"]), helper.make_node("MatMul", ["xt", "w_in"], ["h0"])]
    for i in range(layers):
        inits.append(numpy_helper.from_array((rs.randn(size, size) / np.sqrt(size)).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [f"h{i}", f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"h{i + 1}"]))
    nodes.append(helper.make_node("ReduceMean", [f"h{layers}"], ["y"], axes=[0], keepdims=1))
    g = helper.make_graph(nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, size])], inits)
    return _save_checked_opset13(g, path)


def image_model(path, size: int = 8, classes: int = 4) -> Path:
    """images[1,3,size,size] -> logits[1,classes]: a stand-in classifier for CLI runs on a tiny corpus."""
    w = numpy_helper.from_array(np.random.RandomState(3).randn(3 * size * size, classes).astype(np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("Flatten", ["images"], ["f"]), helper.make_node("MatMul", ["f", "w"], ["logits"])],
        "img", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])], [w])
    return _save_checked_opset13(g, path)


# ---------------------------------------- from explain_helpers.py


def _save_opset13(graph, path):
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
    return _save_opset13(g, path)


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
    return _save_opset13(g, path)


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
    return _save_opset13(g, path)


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


def near_tie_image_model(path, size: int = 8, classes: int = 8, seed: int = 0, softmax: bool = False):
    """images[1,3,size,size] -> Flatten -> `fc` (one MatMul) -> logits[1,classes] where classes 0 and 1 differ only
    by weights below half an int8 step: column 1 is column 0 (integers times a step, one at 127, so both columns
    take the same per-channel and per-tensor scale) plus 0.2 step on 32 elements, the other classes far below. On
    bright images fp32 picks class 1; every int8 form of `fc` (any scale, S8 or U8, 7 or 8 bits) rounds the two
    columns to the same integers, ties them and serves class 0: only `fc` kept in float, the fp32 model itself,
    meets a budget of 0 flips. `softmax`: a Softmax after `fc` (a tie stays a tie, in float or int8), so the
    space has an op type to leave out of QDQ."""
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
    if softmax:
        return _image_classifier(path, "near_tie", size, classes, {"w": w}, [("MatMul", ["f", "w"], "z", "fc"),
                                                                           ("Softmax", ["z"], "logits", "norm")])
    return _image_classifier(path, "near_tie", size, classes, {"w": w}, [("MatMul", ["f", "w"], "logits", "fc")])


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


# ---------------------------------------- from calib_helpers.py


def tiny_model(path, hw: int = 16, seed: int = 0, opset: int = 17, sidecar: bool = True):
    """Conv-ReLU-Conv-SiLU + a one-head attention block: every op family the detector has, tiny."""
    import onnx
    from onnx import TensorProto, helper
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(seed)
    arr = {
        "W1": rng.normal(0, 0.3, (8, 3, 3, 3)), "B1": rng.normal(0, 0.1, (8,)),
        "W2": rng.normal(0, 0.3, (8, 8, 3, 3)), "B2": rng.normal(0, 0.1, (8,)),
        "Wq": rng.normal(0, 0.3, (8, 8)), "Wk": rng.normal(0, 0.3, (8, 8)), "Wo": rng.normal(0, 0.3, (8, 4)),
        "scale": np.array([0.35]),
    }
    inits = [nh.from_array(np.asarray(v, np.float32), k) for k, v in arr.items()]
    inits.append(nh.from_array(np.array([1, 8, -1], np.int64), "shp"))
    nodes = [
        helper.make_node("Conv", ["images", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "W2", "B2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Sigmoid", ["c2"], ["s2"], name="sig2"),
        helper.make_node("Mul", ["c2", "s2"], ["a2"], name="silu2"),
        helper.make_node("Reshape", ["a2", "shp"], ["t"], name="flat"),
        helper.make_node("Transpose", ["t"], ["tt"], perm=[0, 2, 1], name="tr"),
        helper.make_node("MatMul", ["tt", "Wq"], ["q"], name="mq"),
        helper.make_node("MatMul", ["tt", "Wk"], ["k"], name="mk"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="trk"),
        helper.make_node("MatMul", ["q", "kt"], ["att"], name="qk"),
        helper.make_node("Mul", ["att", "scale"], ["atts"], name="sc"),
        helper.make_node("Softmax", ["atts"], ["p"], axis=-1, name="sm"),
        helper.make_node("MatMul", ["p", "tt"], ["ctx"], name="pv"),
        helper.make_node("MatMul", ["ctx", "Wo"], ["logits"], name="head"),
    ]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, hw, hw])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, None, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="quantbench-tests")
    m.ir_version = 8
    onnx.checker.check_model(m)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(path))
    if sidecar:
        path.with_suffix(".json").write_text(json.dumps({"input": {
            "name": "images", "shape": [1, 3, hw, hw], "layout": "NCHW", "color": "RGB", "dtype": "float32",
            "scale": 1 / 255, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}))
    return path


def static_batch_model(path, batch: int = 10, hw: int = 32, fixed_reshape: bool = False, sidecar: dict | None = None):
    """A static-batch export as PyTorch 1.2 wrote them: input 'input.1' declared [batch, 3, hw, hw], output
    [batch, 2], opset 9, IR 4, every initializer also listed in graph.input (Conv-Relu-GlobalAveragePool-Flatten-
    Gemm: runs at any batch and size). `fixed_reshape`: a Reshape to [batch, 8] instead of Flatten, so the graph
    runs only at its declared batch. `sidecar`: written beside it as <stem>.json."""
    import onnx
    from onnx import TensorProto, helper
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(3)
    arr = {"1": rng.normal(0, 0.3, (8, 3, 3, 3)), "2": rng.normal(0, 0.1, (8,)),
           "3": rng.normal(0, 0.3, (2, 8)), "4": rng.normal(0, 0.1, (2,))}
    inits = [nh.from_array(np.asarray(v, np.float32), k) for k, v in arr.items()]
    flat = helper.make_node("Flatten", ["7"], ["8"], axis=1)
    if fixed_reshape:
        inits.append(nh.from_array(np.array([batch, 8], np.int64), "9"))
        flat = helper.make_node("Reshape", ["7", "9"], ["8"])
    nodes = [helper.make_node("Conv", ["input.1", "1", "2"], ["5"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["5"], ["6"]), helper.make_node("GlobalAveragePool", ["6"], ["7"]), flat,
             helper.make_node("Gemm", ["8", "3", "4"], ["out"], transB=1)]
    inputs = [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [batch, 3, hw, hw])]
    inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits]
    g = helper.make_graph(nodes, "torch-jit-export", inputs,
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [batch, 2])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)], producer_name="pytorch",
                          producer_version="1.2")
    m.ir_version = 4
    onnx.checker.check_model(m)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(path))
    if sidecar is not None:
        path.with_suffix(".json").write_text(json.dumps(sidecar))
    return path


# ---------------------------------------- from tier_helpers.py


def libm_model(path, n: int = 64) -> Path:
    """x[1,n] (values in (0.1, 2)) through ops that reach libm (Pow, Log, Sin, Cos, Atan, Sinh) and MLAS's own
    vector code (Erf, Tanh, Exp): one output per op."""
    nodes, outs = [helper.make_node("Constant", [], ["p"], value=helper.make_tensor("p", TensorProto.FLOAT, [], [1.37]))], []
    for op in LIBM_OPS:
        nodes.append(helper.make_node(op, ["x", "p"] if op == "Pow" else ["x"], [op.lower()]))
        outs.append(helper.make_tensor_value_info(op.lower(), TensorProto.FLOAT, [1, n]))
    g = helper.make_graph(nodes, "libm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])], outs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return Path(path)


# ---------------------------------------- from requirement_helpers.py


def saturating_flat_model(path, shared: bool = False, seed: int = 0) -> Path:
    """images [1,3,8,8] -> Flatten -> MatMul -> logits [1,8] (explain_helpers.saturating_matmul on a flattened
    image: every weight column of one sign and large, bright images near the top of the u8 range, so U8S8's
    VPMADDUBSW saturates). `shared`: a second MatMul reuses the weight (tied weights: onnxruntime 1.32 cannot make
    the session of its static QDQ form under session.x64quantprecision=1 where the S8-to-U8 transformer applies)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    k, n = 192, 8
    signs = np.where(np.arange(n) % 2 == 0, 1.0, -1.0).astype(np.float32)
    inits = [numpy_helper.from_array((rng.uniform(0.5, 1.0, (k, n)) * signs).astype(np.float32), "w")]
    nodes = [helper.make_node("Flatten", ["images"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "w"], ["m"], name="fc")]
    if shared:
        inits.append(numpy_helper.from_array(rng.uniform(0.5, 1.0, (n, k)).astype(np.float32), "back"))
        nodes += [helper.make_node("MatMul", ["m", "back"], ["b"], name="up"),
                  helper.make_node("Relu", ["b"], ["r"], name="relu"),
                  helper.make_node("MatMul", ["r", "w"], ["logits"], name="fc2")]
    else:
        nodes[-1].output[0] = "logits"
    g = helper.make_graph(nodes, "sat", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, n])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(path))
    return path


# ---------------------------------------- from bench_helpers.py


def batchnorm_classifier(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w = rng.normal(0, 0.5, (6, 3, 3, 3)).astype(np.float32)
    b = rng.normal(0, 0.1, 6).astype(np.float32)
    scale = rng.uniform(0.5, 1.5, 6).astype(np.float32)
    bias = rng.normal(0, 0.1, 6).astype(np.float32)
    mean = rng.normal(0, 0.1, 6).astype(np.float32)
    var = rng.uniform(0.5, 1.5, 6).astype(np.float32)
    # per-tensor int8 scale = max|w2| / 127 = 0.01; column 0 sits on the int8 grid and column 1 is
    # column 0 + 0.001: fp32 always prefers class 1 (features are >= 0 after Relu), while int8 rounds
    # both columns to the same integers, ties, and serves class 0: a class flip on every image
    w2 = np.zeros((6, 5), np.float32)
    w2[:, 0] = [0.3, -0.5, 0.2, 0.7, -0.1, 0.4]
    w2[:, 1] = w2[:, 0] + 0.001
    w2[:, 2] = [1.27, -0.3, 0.1, 0.2, 0.0, -0.6]
    w2[:, 3] = [-0.2, 0.4, 0.3, -0.7, 0.5, 0.1]
    w2[:, 4] = [0.1, 0.1, -0.4, 0.3, 0.2, -0.2]
    b2 = np.zeros(5, np.float32)
    b2[2:] = -3.0
    inits = [numpy_helper.from_array(a, n) for a, n in
             ((w, "w"), (b, "b"), (scale, "s"), (bias, "bb"), (mean, "m"), (var, "v"), (w2, "w2"), (b2, "b2"))]
    nodes = [helper.make_node("Conv", ["images", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("MatMul", ["f", "w2"], ["mm"]),
             helper.make_node("Add", ["mm", "b2"], ["logits"])]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 5])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, path)


# ---------------------------------------- from release_helpers.py


def documented_classifier(path, doc: str) -> None:
    """Conv + MatMul classifier with two nearly tied classes (int8 flips them); `doc` in every node."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w = rng.normal(0, 0.5, (6, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 1.0, (6, 5)).astype(np.float32)
    w2[:, 1] = w2[:, 0] + rng.normal(0, 2e-3, 6).astype(np.float32)
    b2 = np.zeros(5, np.float32)
    b2[2:] = -3.0
    inits = [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (w2, "w2"), (b2, "b2"))]
    nodes = [helper.make_node("Conv", ["images", "w"], ["c"], pads=[1, 1, 1, 1], doc_string=doc),
             helper.make_node("Relu", ["c"], ["r"], doc_string=doc),
             helper.make_node("GlobalAveragePool", ["r"], ["g"], doc_string=doc),
             helper.make_node("Flatten", ["g"], ["f"], doc_string=doc),
             helper.make_node("MatMul", ["f", "w2"], ["mm"], doc_string=doc),
             helper.make_node("Add", ["mm", "b2"], ["logits"], doc_string=doc)]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 5])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, str(path))


def _layernorm_nodes(x: str, out: str, decomposed: bool) -> tuple[list, list]:
    """(nodes, initializers) normalising `x` over its last axis into `out`: one LayerNormalization, or the
    ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add chain older exporters write for it."""
    inits = [numpy_helper.from_array(np.ones(192, np.float32), "ln_g"),
             numpy_helper.from_array(np.zeros(192, np.float32), "ln_b")]
    if not decomposed:
        return [helper.make_node("LayerNormalization", [x, "ln_g", "ln_b"], [out], name="ln", axis=-1)], inits
    inits += [numpy_helper.from_array(np.array(2.0, np.float32), "ln_two"),
              numpy_helper.from_array(np.array(1e-5, np.float32), "ln_eps")]
    chain = [("ReduceMean", [x], "ln_mu"), ("Sub", [x, "ln_mu"], "ln_d"), ("Pow", ["ln_d", "ln_two"], "ln_d2"),
             ("ReduceMean", ["ln_d2"], "ln_var"), ("Add", ["ln_var", "ln_eps"], "ln_ve"), ("Sqrt", ["ln_ve"], "ln_sd"),
             ("Div", ["ln_d", "ln_sd"], "ln_n"), ("Mul", ["ln_n", "ln_g"], "ln_s"), ("Add", ["ln_s", "ln_b"], out)]
    nodes = [helper.make_node(op, ins, [o], name=f"ln_{i}", **({"axes": [-1]} if op == "ReduceMean" else {}))
             for i, (op, ins, o) in enumerate(chain)]
    return nodes, inits


def _erf_gelu_nodes(x: str, out: str) -> tuple[list, list]:
    """(nodes, initializers) of a Gelu in its Erf form, x * 0.5 * (1 + erf(x / sqrt 2)), as exporters write it."""
    inits = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in
             (("gelu_sqrt2", np.sqrt(2.0)), ("gelu_one", 1.0), ("gelu_half", 0.5))]
    chain = [("Div", [x, "gelu_sqrt2"], "gelu_s"), ("Erf", ["gelu_s"], "gelu_e"), ("Add", ["gelu_e", "gelu_one"], "gelu_a"),
             ("Mul", [x, "gelu_a"], "gelu_m"), ("Mul", ["gelu_m", "gelu_half"], out)]
    return [helper.make_node(op, ins, [o], name=f"gelu_{i}") for i, (op, ins, o) in enumerate(chain)], inits


def _self_attention_nodes(x: str, out: str, rng) -> tuple[list, list]:
    """`x` [1, 192] as 12 tokens of 16 -> one head of self-attention (q, k, v weighted MatMuls; `attn_scores` =
    q @ k^T and `attn_context` = softmax @ v, the two MatMuls of two activations) -> `out` = x + context."""
    shapes = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in (("tokens", [1, 12, 16]), ("flat", [1, 192]))]
    weights = [numpy_helper.from_array(rng.normal(0, 0.25, (16, 16)).astype(np.float32), k) for k in ("wq", "wk", "wv")]
    nodes = [helper.make_node("Reshape", [x, "tokens"], ["t"], name="to_tokens"),
             *(helper.make_node("MatMul", ["t", w], [w[1]], name=f"attn_{w[1]}") for w in ("wq", "wk", "wv")),
             helper.make_node("Transpose", ["k"], ["kt"], name="attn_kt", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="attn_scores"),
             helper.make_node("Softmax", ["s"], ["p"], name="attn_probs", axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["c"], name="attn_context"),
             helper.make_node("Reshape", ["c", "flat"], ["cf"], name="from_tokens"),
             helper.make_node("Add", [x, "cf"], [out], name="attn_residual")]
    return nodes, [*shapes, *weights]


def transformer_like_classifier(path, *, decomposed_layernorm: bool = False, gelu: bool = False,
                                attention: bool = False, seed: int = 0) -> Path:
    """images[1,3,8,8] -> Flatten -> LayerNorm -> `fc1` (MatMul, + a bias whose first channel is 1000) -> `fc2`
    (MatMul, blind to that channel) -> Softmax -> logits[1,8]: a transformer block's op types (MatMul, Softmax,
    LayerNormalization, or its decomposed form) where int8 activations flip decisions and int8 weights do not.
    The outlier channel stretches fc1's output range to [.., 1000]: a u8 step of about 4 rounds the informative
    channels (spread about 0.7) away, a u16 step (0.016) keeps them; every weight is well inside its int8 grid.
    `gelu`: an Erf-form Gelu between fc1's bias and fc2; `attention`: a self-attention block (with a residual)
    between the LayerNorm and fc1."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.05, (192, 16)).astype(np.float32)
    w1[:, 0] = 0
    b1 = np.zeros(16, np.float32)
    b1[0] = 1000
    w2 = rng.normal(0, 1.0, (16, 8)).astype(np.float32)
    w2[0] = 0
    ln, ln_inits = _layernorm_nodes("f", "n", decomposed_layernorm)
    gelu_nodes, gelu_inits = _erf_gelu_nodes("h", "g") if gelu else ([], [])
    attn_nodes, attn_inits = _self_attention_nodes("n", "na", rng) if attention else ([], [])
    nodes = [helper.make_node("Flatten", ["images"], ["f"], name="flatten"), *ln, *attn_nodes,
             helper.make_node("MatMul", ["na" if attention else "n", "w1"], ["a"], name="fc1"),
             helper.make_node("Add", ["a", "b1"], ["h"], name="fc1_bias"),
             *gelu_nodes,
             helper.make_node("MatMul", ["g" if gelu else "h", "w2"], ["z"], name="fc2"),
             helper.make_node("Softmax", ["z"], ["logits"], name="attn_softmax", axis=-1)]
    g = helper.make_graph(nodes, "transformer_like",
                          [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 8])],
                          [*ln_inits, *gelu_inits, *attn_inits, *(numpy_helper.from_array(w, k) for k, w in
                                        (("w1", w1), ("b1", b1), ("w2", w2)))])
    return save_model(g, Path(path), opset=13 if decomposed_layernorm else 17)   # as an older exporter writes it
