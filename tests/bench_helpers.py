"""The tiny classifier bench: a model built with onnx.helper (two near-tied classes, so int8 flips
decisions), its sidecar SIDE, a variants folder of fp32 + dynamic int8 and seeded random COCO-labelled
images. Shared by the equiv, report, fixture and decode tests."""

import json
from pathlib import Path

import numpy as np


SIDE = {"classes": ["bottle", "can", "bag", "cup", "lid"],
        "input": {"name": "images", "shape": [1, 3, 8, 8], "layout": "NCHW", "color": "RGB", "dtype": "float32",
                  "scale": 1 / 255, "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]},
        "decode": {"kind": "classifier-softmax", "logits": "logits", "threshold": None}}


def tiny_classifier(path: Path) -> None:
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


def fp32_and_dynamic(vdir: Path, build, sidecar: dict, model: str, op_types=("MatMul", "Conv")) -> Path:
    """A variants folder: fp32 (made by `build(path)`) and its dynamic int8, each with `sidecar` in its recipe
    and beside it (preprocessing), and index.json."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from quantbench.inputs.variantdir import Variant, write_index

    vdir.mkdir(parents=True)
    build(vdir / "fp32.onnx")
    quantize_dynamic(str(vdir / "fp32.onnx"), str(vdir / "dynamic.onnx"), weight_type=QuantType.QInt8,
                     op_types_to_quantize=list(op_types))
    vs = []
    for name in ("fp32", "dynamic"):
        recipe = {"variant": name, "method": name, "model": model, "sidecar": sidecar}
        (vdir / f"{name}.recipe.json").write_text(json.dumps(recipe))
        (vdir / f"{name}.json").write_text(json.dumps(sidecar))
        vs.append(Variant(name=name, path=vdir / f"{name}.onnx", model=model, recipe=recipe))
    write_index(vdir, vs)
    return vdir


def random_images(root: Path, extras: list, size: int = 8, annotations=(), categories=()) -> Path:
    """One random PNG per entry of `extras` under root/images (seeded), and COCO labels.json of them in the eval
    split (each image entry updated with its `extras` dict); returns the labels path."""
    from PIL import Image

    img = root / "images"
    img.mkdir()
    rng = np.random.default_rng(3)
    images = []
    for i, extra in enumerate(extras):
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(img / f"im{i:02d}.png")
        images.append({"id": i, "file_name": f"im{i:02d}.png", "width": size, "height": size, "split": "eval",
                       **extra})
    labels = root / "labels.json"
    labels.write_text(json.dumps({"images": images, "annotations": list(annotations), "categories": list(categories)}))
    return labels


def make_bench(root: Path, n_images: int = 8) -> tuple[Path, Path]:
    """A variants folder (fp32 + dynamic int8) and COCO labels with n eval images; returns (variants, labels)."""
    vdir = fp32_and_dynamic(root / "variants", tiny_classifier, SIDE, "tiny")
    return vdir, random_images(root, [{}] * n_images)
