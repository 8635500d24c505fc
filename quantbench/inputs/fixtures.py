"""Evaluation fixtures: images + labels -> input tensors keyed by their hash.

A fixture's id is the SHA-256 of its input tensor's canonical encoding
(quantbench.tensorcode.tensor_sha256), so two hosts compare only when they
were fed byte-identical inputs.

Labels are COCO JSON: ``images`` (id, file_name, width, height, and a
``split`` of train/val/eval), ``annotations`` (image_id, category_id,
bbox = [x, y, w, h] in pixels), ``categories`` (id, name); or CSV with an
``image`` column, a ``density`` (object count, or empty/objects) or ``label``
column, and an optional ``split`` (read_csv_labels). Every image a labels file
names must resolve, symlinks followed, inside the images folder.

Without labels given, a variant is evaluated on the eval split of the labels its
recipe records (``eval_labels``: path, SHA-256, images folder; calibration_labels);
the bundled corpus only for the bundled demo models.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from quantbench.inputs import preprocess
from quantbench.store import arrowrows
from quantbench.inputs.assets import CORPUS_IMAGES, CORPUS_LABELS, quantbench_home
from quantbench.errors import ParameterError, UserError, flag_mark
from quantbench.fsutil import (cache_on, canonical_json, file_state, read_cached_json, read_json, regular_file,
                               remove_tree, sha256_file, temp_beside, write_cache_entry)
from quantbench.tensorcode import canonical, tensor_sha256
from quantbench.inputs.plugins import plugin_identity
from quantbench.inputs.preprocess import geometry, load_rgb, squeezed_width, to_tensor, upright_size
from quantbench.inputs.sidecarfile import input_spec_for
from quantbench.inputs.strata import clean_label, density_label, single_label
from quantbench.inputs.variantdir import inside, is_demo

#: how recipes and calibration-set manifests name the bundled corpus
BUNDLED_LABELS = "bundled:corpus/labels.json"
BUNDLED_IMAGES = "bundled:corpus/images"
#: the labels a message asks for (the CLI names the flags)
PASS_LABELS = f"{flag_mark('fixtures')} LABELS {flag_mark('images')} DIR"


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
    #: the width the image would take at the model's height, where a dynamic width's max_width squeezed it narrower
    squeezed: int | None = None
    #: where the image went in the input tensor (preprocess.Geometry.as_dict), None when unknown; decoders undo it
    geometry: dict | None = None

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
            "geometry": None if self.geometry is None else canonical_json(self.geometry),
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
    t = arrowrows.to_arrow("fixtures", rows)
    return t.set_column(t.schema.get_field_index("tensor"), t.schema.field("tensor"), tensor)


def fixtures_chunks(fixtures: list, spec_of, size: int = 32):
    """fixtures_table of consecutive slices of `size` fixtures (for tables.append_chunks)."""
    for i in range(0, len(fixtures), size):
        yield fixtures_table(fixtures[i:i + size], spec_of)


def default_images_dir(labels_path: str | os.PathLike) -> Path:
    """The images folder of a labels file when none is given: the bundled corpus's own, the CSV's
    folder, or images/ beside a COCO JSON."""
    labels_path = Path(labels_path)
    if labels_path.resolve() == CORPUS_LABELS.resolve():
        return CORPUS_IMAGES
    return labels_path.parent if labels_path.suffix.lower() == ".csv" else labels_path.parent / "images"


def image_file(labels_path, images_dir, name, where: str, base: Path | None = None) -> Path:
    """images_dir/name, if `name` resolves (symlinks followed) inside `images_dir`; else a UserError.
    `base`: images_dir resolved already (variants.inside), for the many names of one labels file."""
    path = inside(images_dir, name, base)
    if path is None:
        raise UserError(f"{labels_path}: {where}: {name!r} is not a file inside {images_dir}; labels may name "
                        "only images inside the images folder")
    return regular_file(path, "image")


def check_image_size(labels_path, path: Path, img: dict, sizes: "ImageSizes | None" = None) -> None:
    """COCO width/height (when given) must be the image's as it is decoded, upright (its EXIF orientation applied,
    preprocess.upright_wh): boxes are in the labelled image's pixels. `sizes`: where the sizes of files read before
    are remembered (ImageSizes)."""
    w, h = img.get("width"), img.get("height")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (w, h)):
        return
    sizes = sizes or ImageSizes(remember=False)
    size = sizes.size(path)
    if size is not None and size != (w, h):
        turned = sizes.orientation(path)
        how = (f" upright (EXIF orientation {turned} turns the stored {size[1]}x{size[0]} by 90 degrees)"
               if turned else "")
        raise UserError(f"{labels_path}: image {img['file_name']}: width x height {w}x{h} in the labels, but the "
                        f"file is {size[0]}x{size[1]}{how}; fix the labels (boxes are in the labelled image's pixels, "
                        "upright)")


class ImageSizes:
    """Each image file's upright width x height (preprocess.upright_wh: as load_rgb decodes it, EXIF orientation
    applied), remembered with the file's state (size, mtime, ctime, inode: any write changes its ctime) and the
    EXIF orientation that turned it (0: none), one file per images folder under QUANTBENCH_HOME/image-sizes/, so
    checking a labels file's sizes again opens no image that did not change (PIL's import and 600 header reads
    were ~40 ms of every cached equiv on the demo). What is remembered is the file's size, never a verdict: the
    labels are checked against it each time. A record of another shape (an earlier version's stored size) is
    read again. QUANTBENCH_TENSOR_CACHE=0 turns it off with the tensor cache."""

    FOLDERS = 256   # images folders remembered; the least recently written go first
    RECORD = 8      # file_state (5) + upright width, height + the orientation that turned it (0: none)

    def __init__(self, folder=None, remember: bool = True):
        import hashlib

        self.enabled = remember and folder is not None and cache_on("QUANTBENCH_TENSOR_CACHE")
        digest = hashlib.sha256(os.path.abspath(folder or '.').encode()).hexdigest()[:32]
        self.path = quantbench_home() / "image-sizes" / f"{digest}.json"
        self.known, self.changed = {}, False
        if self.enabled:
            known = read_cached_json(self.path)
            self.known = known if isinstance(known, dict) else {}

    def size(self, path) -> tuple[int, int] | None:
        """(width, height) upright, or None when the file cannot be read as an image (load_rgb says so when it is
        used)."""
        record = self._record(path)
        return None if record is None else (record[0], record[1])

    def orientation(self, path) -> int:
        """The EXIF orientation (5..8) that turned the file by 90 degrees to give size(path); 0 if none did."""
        record = self._record(path)
        return 0 if record is None else record[2]

    def _record(self, path) -> list | None:
        key = os.path.abspath(path)
        state = file_state(key)
        if state is None:
            return None
        regular_file(path, "image")  # never opened when it is not: a FIFO would block the open
        hit = self.known.get(key)
        if isinstance(hit, list) and len(hit) == self.RECORD and hit[:5] == state:
            return hit[5:]
        from PIL import Image

        try:
            with Image.open(key) as im:
                o = preprocess.orientation(im)
                record = [*preprocess.upright_wh(im), o if o in preprocess.TURNED else 0]
        except Exception:  # not decodable
            return None
        self.known[key] = state + record   # remembered for this check too; saved only when enabled
        if self.enabled:
            self.changed = True
        return record

    def save(self) -> None:
        """Write what was read (a cache: not written is only slower next time), keeping FOLDERS files."""
        if self.changed:
            write_cache_entry(self.path, self.known, self.FOLDERS)


#: the largest labels file read (JSON or CSV): parsed into Python objects it takes some 15 times its size (a
#: 180 MB file took 2.7 GB), and a COCO file of 100,000 images is about 60 MB (docs/trust.md)
MAX_LABELS_BYTES = 64 << 20


def _check_labels_size(path: Path) -> None:
    try:
        size = path.stat().st_size
    except OSError:
        return   # missing: the caller words it
    if size > MAX_LABELS_BYTES:
        raise UserError(f"{path}: labels file is {size:,} bytes, more than the limit of {MAX_LABELS_BYTES:,} (parsed, "
                        "it would take some 15 times that in memory); split it, or keep the images you evaluate on")


def load_coco(labels_path: str | os.PathLike, images_dir: str | os.PathLike | None = None,
              check_files: bool = True) -> dict:
    """Read and validate COCO JSON; every referenced image must lie inside `images_dir` (and, with
    `check_files`, exist with the width and height the labels give).

    Refused (UserError naming the file and the entry): an image entry that is not an object
    or lacks an integer/string 'id' or a 'file_name'; a file_name that leaves the images folder
    ('../', absolute, a symlink out); an image id used twice; 'annotations'
    or 'categories' not a list; an annotation without 'image_id', or whose image_id is not
    an image; an image file listed twice; a 'width' or 'height' that is not a whole number of pixels;
    a category_id not in 'categories' (an empty one too); a bbox that is not 4 finite
    numbers with non-negative width and height. Nothing is silently re-stratified.
    """
    labels_path = Path(labels_path)
    if not labels_path.exists():
        raise UserError(f"{labels_path}: labels file not found")
    _check_labels_size(labels_path)
    coco = read_json(labels_path, "labels JSON", limit=MAX_LABELS_BYTES)
    if not isinstance(coco, dict) or not isinstance(coco.get("images"), list):
        raise UserError(f"{labels_path}: not COCO JSON (no 'images' list)")
    images_dir = Path(images_dir) if images_dir is not None else default_images_dir(labels_path)
    ids, base, sizes = set(), images_dir.resolve(), ImageSizes(images_dir) if check_files else None
    names: dict = {}   # file_name -> its first image entry
    for i, img in enumerate(coco["images"]):
        _check_image_entry(labels_path, i, img, ids)
        if names.setdefault(img["file_name"], i) != i:
            raise UserError(f"{labels_path}: image {img['file_name']} is listed twice (image entries "
                            f"{names[img['file_name']]} and {i}); list each image once")
        path = image_file(labels_path, images_dir, img["file_name"], f"image entry {i}", base)
        if check_files:
            if not path.exists():
                raise UserError(f"{labels_path}: references missing image {path}")
            check_image_size(labels_path, path, img, sizes)
    if sizes is not None:
        sizes.save()
    coco.setdefault("annotations", [])
    coco.setdefault("categories", [])
    for key in ("annotations", "categories"):
        if not isinstance(coco[key], list):
            raise UserError(f"{labels_path}: '{key}' must be a list (got {type(coco[key]).__name__})")
    _check_annotations(labels_path, coco, ids)
    coco["_images_dir"] = str(images_dir)
    return coco


def _check_image_entry(labels_path, i: int, img, ids: set) -> None:
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
    for key in ("width", "height"):
        v = img.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise UserError(f"{labels_path}: image entry {i} ({img['file_name']}): '{key}' must be a whole number of "
                            f"pixels, at least 1 (got {v!r:.40})")


def _check_annotations(labels_path, coco: dict, ids: set) -> None:
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
        if "category_id" in ann and (not _is_id(ann["category_id"]) or ann["category_id"] not in cats):
            raise UserError(f"{labels_path}: annotation {i}: category_id {ann['category_id']!r:.40} is not in "
                            "'categories'" + ("" if cats else " (it is empty: list each category with its id and name)"))
        if "bbox" in ann and not _is_bbox(ann["bbox"]):
            raise UserError(f"{labels_path}: annotation {i}: bbox must be 4 finite numbers [x, y, width, height] "
                            f"with width, height >= 0 (got {ann['bbox']!r:.60})")


_EMPTY = ("empty", "none", "negative", "neg", "hard-negative", "hard_negative")
_OBJECTS = ("objects", "object", "positive", "litter")


def read_csv_labels(labels: str | os.PathLike, images_dir: str | os.PathLike) -> list[dict]:
    """CSV labels -> [{image, path, objects, split, label}] in file order (a UTF-8 byte-order mark is fine).

    Columns: image (inside `images_dir`), density (an object count, or empty/objects words) and/or
    label (the image's one class), split (optional). Every image must exist.
    """
    labels, images_dir = Path(regular_file(labels, "labels file")), Path(images_dir)
    _check_labels_size(labels)
    try:
        with open(labels, newline="", encoding="utf-8-sig") as fh:  # Excel's "CSV UTF-8" starts with a BOM
            reader = csv.DictReader(fh)
            fields = [f.strip() for f in (reader.fieldnames or [])]
            if "image" not in fields or not ({"density", "label", "text"} & set(fields)):
                raise UserError(f"{labels}: CSV needs an 'image' column and a 'density', 'label' or 'text' column "
                                f"(has {fields})")
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"{labels}: not a readable CSV ({exc})") from None
    out, base = [], images_dir.resolve()   # once per file, not per image
    for i, r in enumerate(rows, start=2):
        r = {k.strip(): (v or "").strip() for k, v in r.items() if k}
        label = clean_label(r["label"]) if r.get("label") else None
        path = image_file(labels, images_dir, r.get("image", ""), f"line {i}", base)
        if not path.exists():
            raise UserError(f"{labels}: references missing image {path}")
        out.append({"image": r["image"], "path": path, "objects": _density(labels, i, r.get("density", ""), label),
                    "split": r.get("split", ""), "label": label, **({"text": r["text"]} if "text" in fields else {})})
    return out


def labels_coco(labels_path: str | os.PathLike, images_dir: str | os.PathLike | None = None,
                check_files: bool = True) -> dict:
    """The labels file as COCO: load_coco for JSON, csv_as_coco(read_csv_labels) for CSV."""
    labels_path = Path(labels_path)
    if labels_path.suffix.lower() != ".csv":
        return load_coco(labels_path, images_dir, check_files=check_files)
    if not labels_path.exists():
        raise UserError(f"{labels_path}: labels file not found")
    return csv_as_coco(read_csv_labels(labels_path, images_dir if images_dir is not None
                                       else default_images_dir(labels_path)))


def csv_as_coco(rows: list[dict]) -> dict:
    """read_csv_labels' rows as COCO: image ids 1..N in file order, a labelled row's class as one
    annotation without a box (a classifier's label), categories named by the labels."""
    images = [{"id": k, "file_name": r["image"], "split": r["split"], **({"text": r["text"]} if "text" in r else {})}
              for k, r in enumerate(rows, start=1)]   # a 'text' column: a text recogniser's truth, as COCO's field
    anns = [{"id": k, "image_id": k, "category_id": r["label"]} for k, r in enumerate(rows, start=1)
            if r["label"] is not None]
    cats = [{"id": lb, "name": lb} for lb in sorted({r["label"] for r in rows if r["label"] is not None})]
    return {"images": images, "annotations": anns, "categories": cats}


def _density(labels, line: int, text: str, label) -> int:
    d = text.lower()
    if not d:
        return 1 if label is not None else 0
    if d in _EMPTY:
        return 0
    if d in _OBJECTS:
        return 1
    try:
        n = int(d)
    except ValueError:
        raise UserError(f"{labels}:{line}: density {text!r} is not an object count or empty/objects") from None
    if n < 0:
        raise UserError(f"{labels}:{line}: density {n} is negative; give an object count >= 0")
    return n


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

        self.enabled = cache_on("QUANTBENCH_TENSOR_CACHE")
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
        tmp = None
        try:
            tmp = temp_beside(path, folder=False)  # its writer's own (two threads may write one key)
            with open(tmp, "wb") as fh:
                np.save(fh, arr, allow_pickle=False)
            os.replace(tmp, path)  # a cache: atomic, not fsynced
            self.wrote += 1
        except OSError:
            if tmp is not None:
                remove_tree(tmp)
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


def labelled_images(labels_path: str | os.PathLike, images_dir: str | os.PathLike | None = None,
                    split: str | None = "eval") -> list[dict]:
    """The images of `split` (all if None) a labels file (COCO JSON or CSV) names, in file-name order:
    [{file_name, path, split, labels (annotations), objects, label (its one class, or None)}].

    A COCO image marked "negative" that has annotations is refused."""
    labels_path = Path(labels_path)
    if images_dir is None:
        images_dir = default_images_dir(labels_path)
    if labels_path.suffix.lower() == ".csv":
        if not labels_path.exists():
            raise UserError(f"{labels_path}: labels file not found")
        rows = read_csv_labels(labels_path, images_dir)
        anns = annotations_by_image(csv_as_coco(rows))
        out = [{"file_name": r["image"], "path": r["path"], "split": r["split"], "objects": r["objects"],
                "label": r["label"], "labels": anns.get(k, [])} for k, r in enumerate(rows, start=1)]
    else:
        coco = load_coco(labels_path, images_dir)
        anns = annotations_by_image(coco)
        names = {c.get("id"): c.get("name", c.get("id")) for c in coco["categories"] if isinstance(c, dict)}
        out = []
        for im in coco["images"]:
            mine = anns.get(im["id"], [])
            if im.get("negative") is True and mine:
                raise UserError(f"{labels_path}: image {im['file_name']} is marked negative but has {len(mine)} "
                                "annotations")
            out.append({"file_name": im["file_name"], "path": Path(coco["_images_dir"]) / im["file_name"],
                        "split": str(im.get("split", "")), "labels": mine, "objects": len(mine),
                        "label": single_label(mine, names)})
    _check_split_names(labels_path, out)
    return sorted((im for im in out if split is None or im["split"] == split), key=lambda im: im["file_name"])


#: the split names quantbench reads, compared exactly: "Eval" is not "eval"
SPLITS = ("train", "val", "eval")


def _check_split_names(labels_path: Path, images: list[dict]) -> None:
    """A split that is one of SPLITS in another case or with spaces ("Eval") would drop its image from the eval
    split (and put it in the calibration pool) without a word: refused, naming the image."""
    for im in images:
        word = im["split"]
        if word not in SPLITS and word.strip().lower() in SPLITS:
            raise UserError(f"{labels_path}: image {im['file_name']}: split {word!r} is not {word.strip().lower()!r} "
                            f"(split names are exact: write {word.strip().lower()!r})")


def build_fixtures(spec: dict, labels_path: str | os.PathLike = CORPUS_LABELS,
                   images_dir: str | os.PathLike | None = None, split: str | None = "eval",
                   limit: int | None = None) -> list[Fixture]:
    """Fixtures for every image of `split` (all images if None), in file-name order; `limit`: that many,
    balanced over the strata (pick_balanced)."""
    images = labelled_images(labels_path, images_dir, split)
    if limit is not None:
        images = pick_balanced(images, [im["label"] or density_label(im["objects"]) for im in images], limit)
    cache = TensorCache(spec)
    out = []
    for im in images:
        image_sha = sha256_file(im["path"])
        arr = cache.get(image_sha)
        if arr is None:
            arr = cache.put(image_sha, to_tensor(load_rgb(im["path"]), spec))
        hw = upright_size(im["path"])
        geo = geometry(spec, hw)
        out.append(Fixture(
            fixture_id=tensor_sha256(arr),
            input_name=spec.get("name", "input"),
            array=arr,
            source=im["file_name"],
            image_sha256=image_sha,
            labels=im["labels"],
            stratum=im["label"] or density_label(im["objects"]),
            split=im["split"],
            squeezed=squeezed_width(hw, spec) if spec.get("max_width") else None,
            geometry=None if geo is None else geo.as_dict(),
        ))
    cache.trim()
    return out


def _demo_model(v) -> bool:
    """A bundled demo model: the bundled file itself, or variants calibrate made from it."""
    source = ((v.recipe or {}).get("source_model") or {}).get("path", "")
    return is_demo([v.path]) or (isinstance(source, str) and source.startswith("bundled:models/"))


def calibration_labels(variants, images: str | os.PathLike | None = None) -> tuple[str | None, str | None]:
    """(labels file, images folder) to evaluate `variants` on when no labels are given: the ones their
    recipes record (checked unchanged by SHA-256); labels None for the bundled corpus, which only the
    bundled demo models are evaluated on. `images` overrides the recorded folder."""
    recorded = {}
    for v in variants:
        rec = (v.recipe or {}).get("eval_labels")
        if isinstance(rec, dict) and isinstance(rec.get("path"), str):
            recorded.setdefault((rec["path"], rec.get("sha256")), (v, rec))
        elif not _demo_model(v):
            raise UserError(f"{v.path}: no labels recorded with this model (not made by this version of "
                            "`quantbench calibrate`), and the bundled demo images are only for the demo models; "
                            f"pass {PASS_LABELS}, or recalibrate")
    if len(recorded) > 1:
        (a, _), (b, _) = list(recorded.values())[:2]
        raise UserError(f"variants {a.name} ({a.path}) and {b.name} ({b.path}) were calibrated with different "
                        f"labels; pass {PASS_LABELS}")
    if not recorded:
        return None, (str(images) if images else None)
    v, rec = next(iter(recorded.values()))
    bundled = rec["path"] == BUNDLED_LABELS
    path = CORPUS_LABELS if bundled else Path(rec["path"])
    where = f"the labels variant {v.name} was calibrated with ({v.recipe_path or v.path})"
    if not path.is_file():
        raise UserError(f"{path}: not found: {where}; restore it, or pass {PASS_LABELS}")
    now = sha256_file(path)
    if now != rec.get("sha256"):
        raise UserError(f"{path}: changed since calibration (SHA-256 {now[:12]}, recorded "
                        f"{str(rec.get('sha256'))[:12]}): {where}; restore it, recalibrate, or pass "
                        f"{PASS_LABELS}")
    if bundled and not images:
        return None, None
    folder = images or rec.get("images") or default_images_dir(path)
    return str(path), str(CORPUS_IMAGES if folder == BUNDLED_IMAGES else folder)


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


#: an image whose aspect ratio the resize changes by more than this share is named as squeezed (rounding a size to
#: whole pixels, or to PaddleOCR's multiples of 32 at a realistic size, stays well below it)
SQUEEZE_TOLERANCE = 0.10


def _distortion(fx) -> float:
    """How much the resize changed an image's aspect ratio (0: kept), from its recorded geometry."""
    g = getattr(fx, "geometry", None)
    if not g:
        return 0.0
    sy, sx = g["scale"]
    return max(sx / sy, sy / sx) - 1.0


def _aspect_note(fixtures: list) -> str | None:
    """Which images a fixed input size squeezed (aspect changed by more than SQUEEZE_TOLERANCE), in one line."""
    hit = [fx for fx in fixtures if _distortion(fx) > SQUEEZE_TOLERANCE]
    if not hit:
        return None
    worst = max(hit, key=_distortion)
    g = worst.geometry
    (ih, iw), (nh, nw) = g["image_size"], g["resized"]
    return (f"{len(hit)} of {len(fixtures)} images are squeezed by \"resize\": \"{g['resize']}\" to the input's "
            f"{g['input_size'][1]}x{g['input_size'][0]}, aspect changed by more than {SQUEEZE_TOLERANCE:.0%} (most: "
            f"{worst.source}, {iw}x{ih} -> {nw}x{nh}): deployed code that keeps the aspect feeds other pixels; if "
            "yours does, set 'resize' in the sidecar as it does (letterbox, center-crop, limit-side)")


def squeeze_note(fixtures: list) -> str | None:
    """Which images the preprocessing squeezed, in one line (None when none was): a dynamic width's max_width
    (Fixture.squeezed), else a fixed input size that changed their aspect ratio (Fixture.geometry)."""
    hit = [fx for fx in fixtures if getattr(fx, "squeezed", None)]
    if not hit:
        return _aspect_note(fixtures)
    widest = max(hit, key=lambda fx: fx.squeezed)
    spec = getattr(widest, "preprocess", None) or {}
    limit = f"max_width {spec['max_width']}" if spec.get("max_width") else "max_width"
    return (f"{len(hit)} of {len(fixtures)} images are wider than {limit} at the model's height and are squeezed to "
            f"it, aspect not kept (widest: {widest.source}, {widest.squeezed} px): a recogniser reads squeezed text "
            "differently from the deployed code that feeds it whole; raise 'max_width' in the sidecar to the widest "
            "line it serves")


def fixtures_for_variants(variants, labels=None, images=None, split: str | None = "eval", limit: int | None = None,
                          sidecar: dict | None = None, facts: list | None = None) -> tuple[list[Fixture], dict]:
    """Fixtures for every distinct input recipe among `variants`; returns (fixtures, spec by fixture id).

    Each variant's recipe comes from quantbench.inputs.sidecarfile.input_spec_for (its
    calibration recipe, or the sidecar beside the file); `sidecar` overrides it
    where it agrees with the calibration. split "all" (or None) takes every image.
    `facts`: each variant's modelio.ModelFacts, in the same order, when the caller has them.
    """
    specs = {}
    for v, f in zip(variants, facts or [None] * len(variants)):
        spec = input_spec_for(v, sidecar, facts=f)   # checked there, once
        specs.setdefault(canonical_json(spec), spec)
    fixtures, spec_of = [], {}
    for spec in specs.values():
        for fx in build_fixtures(spec, labels or CORPUS_LABELS, images, None if split in (None, "all") else split, limit):
            if fx.fixture_id not in spec_of:
                spec_of[fx.fixture_id] = spec
                fx.preprocess = spec
                fixtures.append(fx)
    return fixtures, spec_of


def no_fixtures_message(labels, split) -> str:
    """Why fixtures_for_variants found nothing to evaluate on (one wording for every caller)."""
    return (f"{labels or 'the bundled corpus'}: no image in split {split!r} to evaluate on; "
            f"mark some with \"split\": \"eval\", or pass {flag_mark('split')} / {flag_mark('fixtures')}")


def pick_fixture(fixtures: list[Fixture], wanted: str | None, split: str = "eval") -> Fixture:
    """The fixture whose id starts with `wanted` or whose image is named `wanted` (the first one if None)."""
    if not fixtures:
        raise ParameterError("split", "no fixtures", split)
    if not wanted:
        return fixtures[0]
    for fx in fixtures:
        if fx.fixture_id.startswith(wanted) or Path(fx.source).name == wanted or fx.source == wanted:
            return fx
    raise ParameterError("fixture", f"no fixture with that id prefix or image name in split {split}", wanted)
