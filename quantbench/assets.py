"""Where the bundled demo lives (package data) and where results go.

Bundled data (read-only, shipped in the wheel):
  quantbench/data/corpus/images/<file>.png   synthetic outdoor scenes, 128x128 RGB
  quantbench/data/corpus/labels.json          COCO JSON; each image has "split": train|val|eval
  quantbench/data/models/<name>.onnx          litter-detr-tiny, litter-cnn
  quantbench/data/models/<name>.json          sidecar: classes, input, normalisation, decode

Working folders (relative to the current directory, as the README documents):
  calib_sets/<name>/                          calibration-set manifests
  results/variants/<model>/                   quantized variants + recipes
  results/tables/<table>/part-*.parquet       result tables (see quantbench.tables)
  results/report.md, results/bench/*.json

Tool installs (qemu, the arm64 root, aarch64 wheels) go under QUANTBENCH_HOME,
default ~/.cache/quantbench, so that every checkout shares one install.
"""

from __future__ import annotations

import os
from pathlib import Path

from quantbench.errors import UserError
from quantbench.fsutil import read_json, sha256_bytes
from quantbench.preprocess import check_input_block

PACKAGE_DIR = Path(__file__).resolve().parent
DATA_DIR = PACKAGE_DIR / "data"
CORPUS_DIR = DATA_DIR / "corpus"
CORPUS_IMAGES = CORPUS_DIR / "images"
CORPUS_LABELS = CORPUS_DIR / "labels.json"
MODELS_DIR = DATA_DIR / "models"

DEMO_DETECTOR = "litter-detr-tiny"
DEMO_CLASSIFIER = "litter-cnn"

RESULTS_DIR = Path("results")
TABLES_DIR = RESULTS_DIR / "tables"
VARIANTS_DIR = RESULTS_DIR / "variants"
CALIB_SETS_DIR = Path("calib_sets")


def quantbench_home() -> Path:
    return Path(os.environ.get("QUANTBENCH_HOME", Path.home() / ".cache" / "quantbench"))


def demo_model(name: str = DEMO_DETECTOR) -> Path:
    path = MODELS_DIR / f"{name}.onnx"
    if not path.exists():
        raise UserError(f"{path}: bundled model is missing from this install")
    return path


#: the top-level keys of a sidecar (docs/your-model.md); anything else is a typo, refused
SIDECAR_KEYS = ("name", "classes", "input", "decode", "label", "label_mode", "metrics", "score_calibration", "training")


def sidecar_path(model_path: str | os.PathLike) -> Path:
    """The sidecar JSON beside a model: `x.onnx` -> `x.json`."""
    p = Path(model_path)
    return p.with_suffix(".json")


def load_sidecar_path(p: Path, required: bool = False) -> dict | None:
    """A sidecar JSON object read from `p`; None when absent (unless `required`)."""
    if not p.exists():
        if required:
            raise UserError(f"{p}: sidecar file not found")
        return None

    data = read_json(p, "sidecar JSON")
    if not isinstance(data, dict):
        raise UserError(f"{p}: sidecar must be a JSON object like {{\"input\": {{...}}, \"decode\": {{...}}}}, "
                        f"not a {type(data).__name__}")
    unknown = [k for k in data if k not in SIDECAR_KEYS]
    if unknown:
        raise UserError(f"{p}: unknown key {unknown[0]!r}; a sidecar takes {', '.join(map(repr, SIDECAR_KEYS))}")
    if data.get("input") is not None:
        check_input_block(data["input"], p)
    return _inline_alphabet(data, p)


def _inline_alphabet(data: dict, p: Path) -> dict:
    """A decode block's "alphabet": "FILE" (a ctc alphabet, one character per line, in the sidecar's folder) read
    into the list it holds, with "alphabet_file": {"file", "sha256"}: the recipe then carries the characters."""
    block = data.get("decode")
    name = block.get("alphabet") if isinstance(block, dict) else None
    if not isinstance(name, str):
        return data
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise UserError(f"{p}: decode 'alphabet' {name!r}: name a file in the sidecar's folder (no folders, no "
                        "leading '.'), or list the characters")
    path = p.parent / name
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except OSError as exc:
        raise UserError(f"{path}: alphabet file not readable ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: alphabet file is not UTF-8 text") from None
    lines = text.split("\n")   # newlines only: an alphabet may hold any other character
    if lines[-1] == "":
        lines.pop()
    chars = [c[:-1] if c.endswith("\r") else c for c in lines]
    empty = [i + 1 for i, c in enumerate(chars) if not c]
    if not chars or empty:
        raise UserError(f"{path}: alphabet file needs one character per line"
                        + (f"; line {empty[0]} is empty" if empty else "; it is empty"))
    decode = {**block, "alphabet": chars,
              "alphabet_file": {"file": name, "sha256": sha256_bytes(raw)}}
    return {**data, "decode": decode}


def load_sidecar(model_path: str | os.PathLike) -> dict | None:
    """The model's sidecar (classes, input size, normalisation, decode) beside it, or None.

    A sidecar that is not a JSON object, or whose 'input' block is malformed (see
    quantbench.preprocess.check_input_block), is a UserError naming it.
    """
    return load_sidecar_path(sidecar_path(model_path))
