"""A variants folder (fp32 + dynamic int8) of a hand-built ONNX model, and COCO labels, for decoder tests
that go through `quantbench equiv` on the local host (real onnxruntime, real quantization)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from model_helpers import save_model
from quantbench.inputs import plugins


def input_matmul_head(path: Path, base: np.ndarray, size: int, gain: float = 0.02, seed: int = 5) -> Path:
    """images[1,3,size,size] -> output = base + gain * (mean colour of the image) @ W, shaped like `base`.

    `base` (batch first) fixes what the head says; the MatMul on the input makes int8 differ a little."""
    from onnx import TensorProto, helper, numpy_helper

    shape = list(base.shape)
    width = int(np.prod(shape))
    w = (np.random.default_rng(seed).normal(0, 1, (3, width)) * gain).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(base.astype(np.float32), "base"),
             numpy_helper.from_array(np.asarray(shape, np.int64), "shape")]
    nodes = [helper.make_node("GlobalAveragePool", ["images"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("MatMul", ["f", "w"], ["m"]),
             helper.make_node("Reshape", ["m", "shape"], ["r"]),
             helper.make_node("Add", ["r", "base"], ["output"])]
    g = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, shape)], inits)
    return save_model(g, path)


#: non-square images (height, width): wide, tall, square; a letterbox puts each somewhere else in the input
GEOMETRY_SIZES = [(30, 60), (60, 20), (32, 32)]

#: a decode plug-in's module opening: `record(geometry)` appends each geometry it is given to seen.jsonl beside it
RECORD_GEOMETRY = '''
import json, pathlib
import numpy as np

SEEN = pathlib.Path(__file__).with_name("seen.jsonl")

def record(geometry):
    with SEEN.open("a") as fh:
        fh.write(json.dumps(geometry) + "\\n")
'''


#: a plug-in recording the geometry it is given, deciding one thing whatever the outputs
RECORD_WHOLE = RECORD_GEOMETRY + '''
def whole(outputs, spec, geometry=None):
    """One decision whatever the outputs: only the geometry it is given matters here."""
    record(geometry)
    return {"cls": [0], "score": [0.9], "kept": [True]}
'''

#: the letterboxed head's input side
LETTERBOX_SIZE = 32


def make_variants(root: Path, build, sidecar: dict, images: list[dict], size: int, annotations=(),
                  categories=()) -> tuple[Path, Path]:
    """fp32 (built by `build(path)`) + dynamic int8 with `sidecar`, and COCO labels of random `size` images
    (one per entry of `images`, each entry's keys added to its image entry); returns (variants folder, labels)."""
    from bench_helpers import fp32_and_dynamic, random_images

    vdir = fp32_and_dynamic(root / "variants", build, sidecar, "head", op_types=("MatMul",))
    return vdir, random_images(root, images, size, annotations, categories)


def sidecar(size: int, classes: list, decode: dict) -> dict:
    return {"classes": classes,
            "input": {"name": "images", "shape": [1, 3, size, size], "layout": "NCHW", "color": "RGB",
                      "dtype": "float32", "scale": 1 / 255, "mean": [0, 0, 0], "std": [1, 1, 1]},
            "decode": decode}


# ---- a CTC text recogniser (tests/analysis/test_ctc_*.py) ----

SEQ = [1, 1, 0, 2, 3, 1]    # a a _ b ' ' a -> "ab a" with alphabet a, b and the space


def steps(seq, classes=4, high=5.0) -> np.ndarray:
    """[T, 1, C] logits whose per-step argmax is `seq`."""
    x = np.zeros((len(seq), 1, classes), np.float32)
    for t, k in enumerate(seq):
        x[t, 0, k] = high
    return x


T, C, SIZE = 6, 4, 16


def ocr_model(folder) -> None:
    """images[1,3,16,16] -> output [T, 1, C] (declared [1, 'seqlen'], as one real export does), "ab a" on any image;
    its sidecar and alphabet file beside it."""
    from onnx import helper

    input_matmul_head(folder / "ocr.onnx", steps(SEQ), SIZE)
    import onnx

    m = onnx.load(str(folder / "ocr.onnx"))
    out = m.graph.output[0]
    out.CopyFrom(helper.make_tensor_value_info("output", onnx.TensorProto.FLOAT, [1, "seqlen"]))
    save_model(m.graph, folder / "ocr.onnx")
    side = {"input": {"name": "images", "shape": [1, 3, SIZE, SIZE], "layout": "NCHW", "color": "RGB",
                      "dtype": "float32", "scale": 1 / 255, "mean": [0, 0, 0], "std": [1, 1, 1]},
            "decode": {"kind": "ctc", "alphabet": "keys.txt", "space": True}}
    (folder / "ocr.json").write_text(json.dumps(side))
    (folder / "keys.txt").write_text("a\nb\n")



# ---- a letterboxed head and a geometry-recording plug-in (tests/explain/test_decode_geometry_in_explain.py, ...) ----

def letterboxed(root: Path) -> tuple[Path, Path, str]:
    """fp32 + dynamic variants of a head behind a centre letterbox, labels of the non-square GEOMETRY_SIZES images,
    and the RECORD_WHOLE plug-in (allowed); returns (variants folder, labels, plug-in reference)."""
    plugins.allow_all()
    (root / "geo.py").write_text(RECORD_WHOLE)
    ref = f"{root / 'geo.py'}:whole"
    size = LETTERBOX_SIZE
    side = {"classes": ["thing"],
            "input": {"name": "images", "shape": [1, 3, size, size], "scale": 1 / 255, "resize": "letterbox",
                      "pad": "center"},
            "decode": {"kind": ref, "threshold": 0.5}}
    vdir, labels = make_variants(root, lambda p: input_matmul_head(p, np.zeros((1, 4)), size), side,
                                 [{"width": w, "height": h} for h, w in GEOMETRY_SIZES], size)
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate(GEOMETRY_SIZES):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / "images" / f"im{i:02d}.png")
    return vdir, labels, ref


def seen_geometry(root: Path) -> dict:
    """{image size: the geometry the plug-in was given}; every call had one."""
    got = [json.loads(line) for line in (root / "seen.jsonl").read_text().splitlines()]
    assert got and all(g is not None for g in got), got
    return {tuple(g["image_size"]): g for g in got}


def check_geometry(seen: dict) -> None:
    """The letterbox of each GEOMETRY_SIZES image, as letterboxed()'s sidecar makes it."""
    assert sorted(seen) == sorted(GEOMETRY_SIZES)
    assert seen[(30, 60)]["resized"] == [16, 32] and seen[(30, 60)]["offset"] == [8, 0]
    assert seen[(60, 20)]["resized"] == [32, 11] and seen[(60, 20)]["input_size"] == [LETTERBOX_SIZE] * 2
