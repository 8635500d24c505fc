"""Where the bundled demo lives (package data), where calibration sets go, and QUANTBENCH_HOME.

Bundled data (read-only, shipped in the wheel):
  quantbench/data/corpus/images/<file>.png   synthetic outdoor scenes, 128x128 RGB
  quantbench/data/corpus/labels.json          COCO JSON; each image has "split": train|val|eval
  quantbench/data/models/<name>.onnx          litter-detr-tiny, litter-cnn
  quantbench/data/models/<name>.json          sidecar: classes, input, normalisation, decode (read by
                                              quantbench.inputs.sidecarfile, the one sidecar reader)

Working folders (relative to the current directory, as the README documents):
  calib_sets/<name>/                          calibration-set manifests
  results/                                    the results folder: quantbench.store.resultpaths

Tool installs (qemu, the arm64 root, aarch64 wheels) go under QUANTBENCH_HOME,
default ~/.cache/quantbench, so that every checkout shares one install.
"""

from __future__ import annotations

import os
from pathlib import Path

from quantbench.errors import UserError

PACKAGE_DIR = Path(__file__).resolve().parents[1]   # quantbench/ (this module is quantbench/inputs/assets.py)
DATA_DIR = PACKAGE_DIR / "data"
CORPUS_DIR = DATA_DIR / "corpus"
CORPUS_IMAGES = CORPUS_DIR / "images"
CORPUS_LABELS = CORPUS_DIR / "labels.json"
MODELS_DIR = DATA_DIR / "models"

DEMO_DETECTOR = "litter-detr-tiny"
DEMO_CLASSIFIER = "litter-cnn"

CALIB_SETS_DIR = Path("calib_sets")


def quantbench_home() -> Path:
    return Path(os.environ.get("QUANTBENCH_HOME", Path.home() / ".cache" / "quantbench"))


def demo_model(name: str = DEMO_DETECTOR) -> Path:
    path = MODELS_DIR / f"{name}.onnx"
    if not path.exists():
        raise UserError(f"{path}: bundled model is missing from this install")
    return path
