"""The tiny classifier bench: a model built with onnx.helper (two near-tied classes, so int8 flips
decisions), its sidecar SIDE, a variants folder of fp32 + dynamic int8 and seeded random COCO-labelled
images. Shared by the equiv, report, fixture and decode tests."""

import json
from pathlib import Path

import numpy as np
from models import batchnorm_classifier as tiny_classifier  # noqa: F401 (the catalogue: tests/models.py)


SIDE = {"classes": ["bottle", "can", "bag", "cup", "lid"],
        "input": {"name": "images", "shape": [1, 3, 8, 8], "layout": "NCHW", "color": "RGB", "dtype": "float32",
                  "scale": 1 / 255, "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]},
        "decode": {"kind": "classifier-softmax", "logits": "logits", "threshold": None}}


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
