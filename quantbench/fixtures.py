"""Evaluation fixtures: images + labels -> input tensors keyed by their hash.

A fixture's id is the SHA-256 of its input tensor's canonical encoding
(quantbench.hosts.worker.tensor_sha256), so two hosts compare only when they
were fed byte-identical inputs.

Labels are COCO JSON: ``images`` (id, file_name, width, height, and a
``split`` of train/val/eval), ``annotations`` (image_id, category_id,
bbox = [x, y, w, h] in pixels), ``categories`` (id, name).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from quantbench import preprocess, tables
from quantbench.assets import CORPUS_IMAGES, CORPUS_LABELS, quantbench_home
from quantbench.errors import UserError
from quantbench.fsutil import canonical_json, read_json, sha256_file
from quantbench.hosts.worker import canonical, tensor_sha256
from quantbench.plugins import plugin_identity
from quantbench.preprocess import check_input_block, load_rgb, to_tensor
from quantbench.strata import density_label, single_label
from quantbench.variants import input_spec_for


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
    """Read and validate COCO JSON; every referenced image must exist.

    Refused (UserError naming the file and the entry): an image entry that is not an object
    or lacks an integer/string 'id' or a 'file_name'; an image id used twice; 'annotations'
    or 'categories' not a list; an annotation without 'image_id', or whose image_id is not
    an image; a category_id not in a non-empty 'categories'; a bbox that is not 4 finite
    numbers with non-negative width and height. Nothing is silently re-stratified.
    """
    labels_path = Path(labels_path)
    if not labels_path.exists():
        raise UserError(f"{labels_path}: labels file not found")
    coco = read_json(labels_path, "labels JSON")
    if not isinstance(coco, dict) or not isinstance(coco.get("images"), list):
        raise UserError(f"{labels_path}: not COCO JSON (no 'images' list)")
    images_dir = Path(images_dir) if images_dir is not None else labels_path.parent / "images"
    ids = set()
    for i, img in enumerate(coco["images"]):
        if not isinstance(img, dict):
            raise UserError(f"{labels_path}: image entry {i} is not an object: {img!r:.80}")
        if "file_name" not in img or "id" not in img:
            raise UserError(f"{labels_path}: image entry without 'id' and 'file_name': {img!r}")
        if not _is_id(img["id"]):
            raise UserError(f"{labels_path}: image entry {i}: 'id' must be an integer or a string (got {img['id']!r:.40})")
        if not isinstance(img["file_name"], str) or not img["file_name"]:
            raise UserError(f"{labels_path}: image entry {i}: 'file_name' must be a non-empty string")
        if img["id"] in ids:
            raise UserError(f"{labels_path}: image id {img['id']!r} appears twice (image entry {i}, "
                            f"{img['file_name']}); image ids must be unique")
        ids.add(img["id"])
        if check_files and not (images_dir / img["file_name"]).exists():
            raise UserError(f"{labels_path}: references missing image {images_dir / img['file_name']}")
    coco.setdefault("annotations", [])
    coco.setdefault("categories", [])
    for key in ("annotations", "categories"):
        if not isinstance(coco[key], list):
            raise UserError(f"{labels_path}: '{key}' must be a list (got {type(coco[key]).__name__})")
    cats = set()
    for i, cat in enumerate(coco["categories"]):
        if not isinstance(cat, dict) or not _is_id(cat.get("id")):
            raise UserError(f"{labels_path}: category entry {i} must be an object with an integer or string 'id'")
        cats.add(cat["id"])
    for i, ann in enumerate(coco["annotations"]):
        if not isinstance(ann, dict):
            raise UserError(f"{labels_path}: annotation {i} is not an object: {ann!r:.80}")
        if "image_id" not in ann:
            raise UserError(f"{labels_path}: annotation {i} has no 'image_id'")
        if not _is_id(ann["image_id"]) or ann["image_id"] not in ids:
            raise UserError(f"{labels_path}: annotation {i}: image_id {ann['image_id']!r:.40} is not in 'images'")
        if cats and "category_id" in ann and (not _is_id(ann["category_id"]) or ann["category_id"] not in cats):
            raise UserError(f"{labels_path}: annotation {i}: category_id {ann['category_id']!r:.40} is not in "
                            "'categories'")
        if "bbox" in ann and not _is_bbox(ann["bbox"]):
            raise UserError(f"{labels_path}: annotation {i}: bbox must be 4 finite numbers [x, y, width, height] "
                            f"with width, height >= 0 (got {ann['bbox']!r:.60})")
    coco["_images_dir"] = str(images_dir)
    return coco


def _is_id(x) -> bool:
    return isinstance(x, (int, str)) and not isinstance(x, bool)


def _is_bbox(b) -> bool:
    import math

    return (isinstance(b, list) and len(b) == 4
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in b)
            and b[2] >= 0 and b[3] >= 0)


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

        self.enabled = os.environ.get("QUANTBENCH_TENSOR_CACHE", "1").lower() not in ("0", "no", "false", "off")
        code = hashlib.sha256(Path(preprocess.__file__).read_bytes()).hexdigest()
        if spec.get("plugin"):  # the tensors are the plug-in's: an edited plug-in file makes other tensors
            code += f"|{plugin_identity(spec['plugin'])['sha256']}"
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
    """Fixtures for every image of `split` (all images if None), in file-name order; `limit`: that many,
    balanced over the strata (pick_balanced)."""
    if images_dir is None and Path(labels_path) == CORPUS_LABELS:
        images_dir = CORPUS_IMAGES
    coco = load_coco(labels_path, images_dir)
    anns = annotations_by_image(coco)
    images = [im for im in coco["images"] if split is None or im.get("split") == split]
    images.sort(key=lambda im: im["file_name"])
    root = Path(coco["_images_dir"])
    names = {c.get("id"): c.get("name", c.get("id")) for c in coco["categories"] if isinstance(c, dict)}
    if limit is not None:
        images = pick_balanced(images, [_stratum(anns.get(im["id"], []), names) for im in images], limit)
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
            stratum=_stratum(labels, names),
            split=im.get("split", ""),
        ))
    cache.trim()
    return out


def _stratum(labels: list, names: dict) -> str:
    return single_label(labels, names) or density_label(len(labels))


def pick_balanced(images: list, strata: list, limit: int) -> list:
    """`limit` of `images` (in file-name order) balanced over their `strata`: one image of each stratum in
    turn (strata by name, images by file name within one), until `limit`; the picked ones in file-name order.
    Same images, same limit: the same set."""
    by: dict = {}
    for im, s in zip(images, strata):
        by.setdefault(s, []).append(im)
    queues = [by[s] for s in sorted(by)]
    picked, depth = [], 0
    while len(picked) < min(limit, len(images)):
        picked += [q[depth] for q in queues if depth < len(q)][:limit - len(picked)]
        depth += 1
    chosen = {id(im) for im in picked}
    return [im for im in images if id(im) in chosen]


def limit_note(fixtures: list) -> str:
    """How a limit picked `fixtures` (pick_balanced), in one line: the rule and the count per stratum."""
    counts: dict = {}
    for fx in fixtures:
        counts[fx.stratum] = counts.get(fx.stratum, 0) + 1
    per = ", ".join(f"{s or 'unlabelled'} {n}" for s, n in sorted(counts.items()))
    return f"{len(fixtures)} images taken in turn from each stratum (by file name within one): {per}"


def fixtures_for_variants(variants, labels=None, images=None, split: str | None = "eval", limit: int | None = None,
                          sidecar: dict | None = None) -> tuple[list[Fixture], dict]:
    """Fixtures for every distinct input recipe among `variants`; returns (fixtures, spec by fixture id).

    Each variant's recipe comes from quantbench.variants.input_spec_for (its
    calibration recipe, or the sidecar beside the file); `sidecar` overrides it
    where it agrees with the calibration. split "all" (or None) takes every image.
    """
    specs = {}
    for v in variants:
        spec = check_input_block(input_spec_for(v, sidecar), v.path)
        specs.setdefault(canonical_json(spec), spec)
    fixtures, spec_of = [], {}
    for spec in specs.values():
        for fx in build_fixtures(spec, labels or CORPUS_LABELS, images, None if split in (None, "all") else split, limit):
            if fx.fixture_id not in spec_of:
                spec_of[fx.fixture_id] = spec
                fx.preprocess = spec
                fixtures.append(fx)
    return fixtures, spec_of


def pick_fixture(fixtures: list[Fixture], wanted: str | None, split: str = "eval") -> Fixture:
    """The fixture whose id starts with `wanted` or whose image is named `wanted` (the first one if None)."""
    if not fixtures:
        raise UserError(f"--split {split}: no fixtures")
    if not wanted:
        return fixtures[0]
    for fx in fixtures:
        if fx.fixture_id.startswith(wanted) or Path(fx.source).name == wanted or fx.source == wanted:
            return fx
    raise UserError(f"--fixture {wanted}: no fixture with that id prefix or image name in split {split}")
