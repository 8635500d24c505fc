"""Evaluation fixtures: images + labels -> input tensors keyed by their hash.

A fixture's id is the SHA-256 of its input tensor's canonical encoding
(quantbench.hosts.worker.tensor_sha256), so two hosts compare only when they
were fed byte-identical inputs.

Labels are COCO JSON: ``images`` (id, file_name, width, height, and a
``split`` of train/val/eval), ``annotations`` (image_id, category_id,
bbox = [x, y, w, h] in pixels), ``categories`` (id, name).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from quantbench.assets import CORPUS_IMAGES, CORPUS_LABELS
from quantbench.errors import UserError
from quantbench.fsutil import canonical_json, sha256_file
from quantbench.hosts.worker import canonical, tensor_sha256
from quantbench.preprocess import load_rgb, to_tensor
from quantbench.strata import density_label, single_label


@dataclass
class Fixture:
    fixture_id: str
    input_name: str
    array: np.ndarray
    source: str
    image_sha256: str
    labels: list = field(default_factory=list)
    stratum: str = ""
    split: str = ""

    def row(self, spec: dict) -> dict:
        """This fixture's `fixtures` row without its tensor (fixtures_table adds that column)."""
        arr = canonical(self.array)
        return {
            "fixture_id": self.fixture_id,
            "input_name": self.input_name,
            "dtype": arr.dtype.str,
            "shape": list(arr.shape),
            "source": self.source,
            "image_sha256": self.image_sha256,
            "labels": canonical_json(self.labels),
            "stratum": self.stratum,
            "split": self.split,
            "preprocess": canonical_json(spec),
        }


def fixtures_table(fixtures: list, spec_of) -> "pa.Table":
    """The `fixtures` table rows of `fixtures` as one Arrow table.

    The tensor column is assembled in one buffer: hundreds of 200 KB Python bytes
    objects fed through the row-wise path cost seconds per 600 images on a small
    machine. `spec_of(fx)` gives the fixture's preprocessing recipe.
    """
    import pyarrow as pa

    from quantbench import tables

    raw = [canonical(fx.array).reshape(-1).view(np.uint8) for fx in fixtures]
    offsets = np.zeros(len(raw) + 1, dtype=np.int64)
    np.cumsum([r.size for r in raw], out=offsets[1:])
    data = np.concatenate(raw) if raw else np.zeros(0, dtype=np.uint8)
    tensor = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(raw),
                                              [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    rows = [fx.row(spec_of(fx)) for fx in fixtures]
    t = tables.to_arrow("fixtures", rows)
    return t.set_column(t.schema.get_field_index("tensor"), t.schema.field("tensor"), tensor)


def fixtures_chunks(fixtures: list, spec_of, size: int = 32):
    """fixtures_table of consecutive slices of `size` fixtures (for tables.append_chunks)."""
    for i in range(0, len(fixtures), size):
        yield fixtures_table(fixtures[i:i + size], spec_of)


def load_coco(labels_path: str | os.PathLike, images_dir: str | os.PathLike | None = None,
              check_files: bool = True) -> dict:
    """Read and validate COCO JSON; every referenced image must exist."""
    labels_path = Path(labels_path)
    if not labels_path.exists():
        raise UserError(f"{labels_path}: labels file not found")
    try:
        coco = json.loads(labels_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{labels_path}: not valid JSON ({exc})") from None
    if not isinstance(coco, dict) or not isinstance(coco.get("images"), list):
        raise UserError(f"{labels_path}: not COCO JSON (no 'images' list)")
    images_dir = Path(images_dir) if images_dir is not None else labels_path.parent / "images"
    for img in coco["images"]:
        if "file_name" not in img or "id" not in img:
            raise UserError(f"{labels_path}: image entry without 'id' and 'file_name': {img!r}")
        if check_files and not (images_dir / img["file_name"]).exists():
            raise UserError(f"{labels_path}: references missing image {images_dir / img['file_name']}")
    coco.setdefault("annotations", [])
    coco.setdefault("categories", [])
    coco["_images_dir"] = str(images_dir)
    return coco


def annotations_by_image(coco: dict) -> dict:
    by = {img["id"]: [] for img in coco["images"]}
    for ann in coco["annotations"]:
        by.setdefault(ann["image_id"], []).append(ann)
    return by


class TensorCache:
    """Decoded input tensors, keyed by the image file's SHA-256 and the preprocessing recipe.

    Decoding and resizing every evaluation image is most of what preparing fixtures
    costs; a rerun reads the tensors back instead (one .npy per image and recipe under
    QUANTBENCH_HOME/tensors, named by SHA-256 of image hash, recipe and the
    preprocessing code). The fixture id is still the SHA-256 of the tensor that is
    fed, and every worker checks it. QUANTBENCH_TENSOR_CACHE=0 turns it off;
    QUANTBENCH_TENSOR_CACHE_MB (default 2048) bounds it: the least recently written
    tensors go first.
    """

    DEFAULT_MB = 2048

    def __init__(self, spec: dict):
        import hashlib

        from quantbench import preprocess
        from quantbench.assets import quantbench_home

        self.enabled = os.environ.get("QUANTBENCH_TENSOR_CACHE", "1").lower() not in ("0", "no", "false", "off")
        code = hashlib.sha256(Path(preprocess.__file__).read_bytes()).hexdigest()
        self.salt = f"{code}|{canonical_json(spec)}|"
        self.dir = quantbench_home() / "tensors"
        self.wrote = 0

    def _path(self, image_sha: str) -> Path:
        import hashlib

        key = hashlib.sha256((self.salt + image_sha).encode()).hexdigest()
        return self.dir / key[:2] / f"{key}.npy"

    def get(self, image_sha: str):
        if not self.enabled:
            return None
        try:
            arr = np.load(self._path(image_sha), allow_pickle=False)
        except (OSError, ValueError, EOFError):
            return None
        return arr

    def put(self, image_sha: str, arr: np.ndarray) -> np.ndarray:
        if not self.enabled:
            return arr
        path = self._path(image_sha)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
            with open(tmp, "wb") as fh:
                np.save(fh, arr, allow_pickle=False)
            os.replace(tmp, path)  # a cache: atomic, not fsynced
            self.wrote += 1
        except OSError:
            pass
        return arr

    def trim(self) -> None:
        """Keep the cache under its bound (oldest files removed first); run after writing."""
        if not self.wrote:
            return
        try:
            limit = int(float(os.environ.get("QUANTBENCH_TENSOR_CACHE_MB", self.DEFAULT_MB)) * (1 << 20))
        except ValueError:
            limit = self.DEFAULT_MB << 20
        files = []
        try:
            for sub in os.scandir(self.dir):
                if sub.is_dir():
                    for f in os.scandir(sub.path):
                        if f.name.endswith(".npy"):
                            st = f.stat()
                            files.append((st.st_mtime_ns, st.st_size, f.path))
        except OSError:
            return
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= limit:
                break
            try:
                os.unlink(path)
                total -= size
            except OSError:
                pass


def build_fixtures(spec: dict, labels_path: str | os.PathLike = CORPUS_LABELS,
                   images_dir: str | os.PathLike | None = None, split: str | None = "eval",
                   limit: int | None = None) -> list[Fixture]:
    """Fixtures for every image of `split` (all images if None), in file-name order."""
    if images_dir is None and Path(labels_path) == CORPUS_LABELS:
        images_dir = CORPUS_IMAGES
    coco = load_coco(labels_path, images_dir)
    anns = annotations_by_image(coco)
    images = [im for im in coco["images"] if split is None or im.get("split") == split]
    images.sort(key=lambda im: im["file_name"])
    if limit is not None:
        images = images[:limit]
    root = Path(coco["_images_dir"])
    names = {c.get("id"): c.get("name", c.get("id")) for c in coco["categories"] if isinstance(c, dict)}
    cache = TensorCache(spec)
    out = []
    for im in images:
        path = root / im["file_name"]
        image_sha = sha256_file(path)
        arr = cache.get(image_sha)
        if arr is None:
            arr = cache.put(image_sha, to_tensor(load_rgb(path), spec))
        labels = anns.get(im["id"], [])
        out.append(Fixture(
            fixture_id=tensor_sha256(arr),
            input_name=spec.get("name", "input"),
            array=arr,
            source=im["file_name"],
            image_sha256=image_sha,
            labels=labels,
            stratum=single_label(labels, names) or density_label(len(labels)),
            split=im.get("split", ""),
        ))
    cache.trim()
    return out
