"""Where the bundled demo lives (package data) and where results go.

Bundled data (read-only, shipped in the wheel):
  quantbench/data/corpus/images/<file>.png   synthetic outdoor scenes, 128x128 RGB
  quantbench/data/corpus/labels.json          COCO JSON; each image has "split": train|val|eval
  quantbench/data/models/<name>.onnx          litter-detr-tiny, litter-cnn
  quantbench/data/models/<name>.json          sidecar: classes, input, normalisation, decode (read by
                                              quantbench.recipe, the one sidecar reader)

Working folders (relative to the current directory, as the README documents):
  calib_sets/<name>/                          calibration-set manifests
  results/variants/<model>/                   quantized variants + recipes
  results/tables/<table>/part-*.parquet       result tables (see quantbench.tables)
  results/report.md, results/bench/*.json

Tool installs (qemu, the arm64 root, aarch64 wheels) go under QUANTBENCH_HOME,
default ~/.cache/quantbench, so that every checkout shares one install.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from quantbench.errors import UserError

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


_SEAL_KEY: dict = {}


def _seal_key() -> bytes | None:
    """This machine's secret for sealing cache entries: 32 random bytes in QUANTBENCH_HOME/cache-seal.key
    (mode 0600, made once, never travels with a results folder); None when it cannot be read or made."""
    path = quantbench_home() / "cache-seal.key"
    if path not in _SEAL_KEY:
        try:
            if not path.is_file():
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=".cache-seal.", dir=path.parent)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(os.urandom(32))
                try:
                    os.link(tmp, path)  # the first writer's key wins; a second one reads it
                except FileExistsError:
                    pass
                finally:
                    os.unlink(tmp)
            key = path.read_bytes()
            _SEAL_KEY[path] = key if len(key) == 32 else None
        except OSError:
            return None
    return _SEAL_KEY[path]


def seal(data: bytes) -> str | None:
    """HMAC-SHA256 of `data` under this machine's secret (None: no secret here, nothing can be sealed).

    A cache entry carries its seal, not a checksum: anyone can recompute a SHA-256 over a forged entry, only
    this machine's quantbench its seal, so an entry forged or brought from elsewhere is a miss and is computed
    again."""
    import hmac

    key = _seal_key()
    return None if key is None else hmac.new(key, data, hashlib.sha256).hexdigest()


def sealed(data: bytes, mark) -> bool:
    """`mark` is the seal of `data` made on this machine."""
    import hmac

    want = seal(data)
    return want is not None and isinstance(mark, str) and hmac.compare_digest(want, mark)
