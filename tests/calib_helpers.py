"""Small constructed models and stand-in corpora for the calibrate tests (fast, no bundled data)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


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


def make_corpus(root, n_litter: int = 16, n_negative: int = 16, n_eval: int = 4, size: int = 16, seed: int = 0):
    """A COCO corpus of random-texture PNGs with spread luminance; returns (labels.json, images/)."""
    from PIL import Image

    root = Path(root)
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    coco = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "bottle"}]}
    kinds = ["litter"] * n_litter + ["negative"] * n_negative + ["eval"] * n_eval
    ann_id = 1
    for i, kind in enumerate(kinds):
        level = 30 + 190 * ((i * 7919) % 97) / 96.0
        px = np.clip(rng.normal(level, 25, (size, size, 3)), 0, 255).astype(np.uint8)
        name = f"img_{i:03d}.png"
        Image.fromarray(px).save(images / name)
        split = "eval" if kind == "eval" else ("val" if i % 5 == 0 else "train")
        neg = kind == "negative" or (kind == "eval" and i % 2)
        coco["images"].append({"id": i + 1, "file_name": name, "width": size, "height": size, "split": split,
                               "negative": bool(neg)})
        if not neg:
            for _ in range(1 + i % 3):
                coco["annotations"].append({"id": ann_id, "image_id": i + 1, "category_id": 1,
                                            "bbox": [2.0, 2.0, 5.0, 5.0]})
                ann_id += 1
    labels = root / "labels.json"
    labels.write_text(json.dumps(coco, indent=1))
    return labels, images


def random_feeds(n: int, hw: int = 16, seed: int = 1, name: str = "images"):
    rng = np.random.default_rng(seed)
    return [{name: (rng.random((1, 3, hw, hw), dtype=np.float32) * 2 - 0.5)} for _ in range(n)]


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
