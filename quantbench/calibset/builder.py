"""Select a calibration set stratified by the user's own strata x lighting.

Strata (quantbench.inputs.strata, named from the data):
  objects   "empty" (no labelled object) or "objects"; with count_bins,
            object-bearing images split by count, e.g. count_bins=[3] gives
            "objects-1-2" and "objects-3+";
  label     the image's one label (classifier labels), e.g. "0", "90", ...
  A stratum the data do not have at all (a set with no empty images) is left
  out and recorded, not counted as a shortfall.
  lighting  "dark" if the image's luminance is below the median luminance of
            its stratum, else "bright" (so each stratum splits in half by
            its own lighting, not the corpus's).
Luminance is measured, not taken from the labels: the mean Rec. 709 luma of
the decoded 8-bit RGB pixels, 0.2126 R + 0.7152 G + 0.0722 B
(quantbench.inputs.preprocess.luminance).

The pool is every labelled image outside the "eval" split; no pool image may
have the same bytes (SHA-256) as an image of the same labels' eval split. Each
cell gets `per_cell` images drawn as sklearn.utils.resample draws them (without
replacement; `draw`) from the cell's candidates sorted by SHA-256, with one
RandomState(seed) across cells in sorted cell order: the selection depends only
on the image bytes, labels and seed, never on the order of the labels file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from quantbench.store import arrowrows
from quantbench.inputs.strata import density_classes, resolve_mode, stratum_of
from quantbench.inputs.assets import CALIB_SETS_DIR, CORPUS_IMAGES, CORPUS_LABELS
from quantbench.errors import ParameterError, UserError, flag_mark, marked
from quantbench.inputs.fixtures import BUNDLED_IMAGES, BUNDLED_LABELS, default_images_dir, labelled_images
from quantbench.fsutil import atomic_path, atomic_write_json, sha256_bytes, sha256_file
from quantbench.inputs.preprocess import load_rgb, luminance
from quantbench.inputs.variantdir import publish_folder, staging_folder

MANIFEST = "manifest.parquet"
RECIPE = "recipe.json"
#: --per-cell above this is refused before any image is read (a cell is a few dozen images in practice);
#: a --per-cell above the whole pool is refused too.
MAX_PER_CELL = 100_000
LUMA_FORMULA = "mean over pixels of 0.2126 R + 0.7152 G + 0.0722 B (Rec. 709 luma of decoded 8-bit RGB, 0..255)"


@dataclass
class Candidate:
    image: str            # path relative to the images folder
    path: Path
    objects: int
    split: str
    sha256: str = ""
    luminance: float | None = None
    density: str = ""
    error: str = ""
    label: str | None = None  # the image's one label (classifier labels), if it has exactly one


@dataclass
class CalibSet:
    name: str
    rows: list[dict]
    recipe: dict
    cells: list[dict] = field(default_factory=list)

    @property
    def selected(self) -> list[dict]:
        return [r for r in self.rows if r["status"] == "selected"]


def images_root_token(images_dir: Path) -> str:
    """How the manifest names the images folder: a token for the bundled corpus, else absolute."""
    if images_dir.resolve() == CORPUS_IMAGES.resolve():
        return BUNDLED_IMAGES
    return os.path.abspath(images_dir)


def resolve_images_root(token: str) -> Path:
    return CORPUS_IMAGES if token == BUNDLED_IMAGES else Path(token)


def read_labels(labels: str | os.PathLike | None = None, images: str | os.PathLike | None = None) -> tuple[list[Candidate], Path, Path]:
    """(candidates, labels path, images folder): COCO JSON, or CSV with image and density columns."""
    labels_path = Path(labels) if labels is not None else CORPUS_LABELS
    if not labels_path.exists():
        raise UserError(f"{labels_path}: labels file not found")
    images_dir = Path(images) if images is not None else default_images_dir(labels_path)
    if not images_dir.is_dir():
        raise UserError(f"{images_dir}: images folder not found; pass {flag_mark('images')}")
    cands = [Candidate(image=im["file_name"], path=im["path"], objects=im["objects"], split=im["split"],
                       label=im["label"]) for im in labelled_images(labels_path, images_dir, split=None)]
    if not cands:
        raise UserError(f"{labels_path}: lists no images")
    return cands, labels_path, images_dir


def _eval_hashes(cands: list[Candidate]) -> dict[str, str]:
    """SHA-256 -> path of the labels' own eval split (the images the user evaluates on)."""
    out = {}
    for c in cands:
        if c.split == "eval":
            out.setdefault(sha256_file(c.path), str(c.path))
    return out


def _check_cells(per_cell: int, count_bins: Sequence[int], seed: int = 0) -> None:
    """The cell parameters: images per cell within 1..MAX_PER_CELL, object-count edges distinct and >= 2, and the
    selection seed one RandomState takes (0 .. 2**32 - 1)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 32:
        raise ParameterError("seed", "must be a whole number from 0 to 4294967295 (2**32 - 1)", seed)
    if per_cell < 1:
        raise ParameterError("per_cell", "must be at least 1", per_cell)
    if per_cell > MAX_PER_CELL:
        raise ParameterError("per_cell", f"more than the maximum of {MAX_PER_CELL} images per cell", per_cell)
    if any(b < 2 for b in count_bins) or len(set(count_bins)) != len(count_bins):
        raise ParameterError("count_bins", f"object-count edges must be distinct integers >= 2 (got {list(count_bins)})")


def build(name: str, labels: str | os.PathLike | None = None, images: str | os.PathLike | None = None,
          per_cell: int = 12, seed: int = 0, count_bins: Sequence[int] = (), allow_short: bool = False,
          skip_bad: bool = False, spec: dict | None = None, model: str | None = None,
          strata: str = "auto", progress: bool = False) -> CalibSet:
    """Select the calibration set (nothing is written; see `write`).

    strata: "objects", "label" or "auto" (quantbench.inputs.strata).
    """
    _check_cells(per_cell, count_bins, seed)
    count_bins = sorted(count_bins)
    cands, labels_path, images_dir = read_labels(labels, images)
    eval_sha = _eval_hashes(cands)
    pool = sorted((c for c in cands if c.split != "eval"), key=lambda c: c.image)
    if not pool:
        raise UserError(f"{labels_path}: every image is in the eval split; nothing left to calibrate on")
    if per_cell > len(pool):
        raise UserError(f"{flag_mark('per_cell')} {per_cell}: more than the {len(pool)} images in the calibration pool of "
                        f"{labels_path}; no cell could be filled, even with {flag_mark('allow_short')}")
    mode = resolve_mode(strata, [c.label for c in pool])
    usable, skipped, dup = _measure(pool, eval_sha, mode, count_bins, skip_bad, progress)
    classes, absent, medians, by_cell = _lighting_cells(usable, mode, count_bins)
    if not classes:
        raise UserError(f"{labels_path}: no readable image left to calibrate on")
    rows, cell_info, short = _select(by_cell, classes, per_cell, seed)
    if short and not allow_short:
        detail = ", ".join(f"{cell} has {n}" for cell, n in short)
        raise UserError(f"{labels_path}: too few candidates for {per_cell} per cell ({detail}); "
                        f"lower {flag_mark('per_cell')}, add images, or pass {flag_mark('allow_short')} to record the shortfall")
    for c in skipped:
        rows.append(_row(c, "", seed, "skipped", c.error, per_cell, 0))

    recipe = {
        "name": name,
        "labels": str(labels_path) if labels_path.resolve() != CORPUS_LABELS.resolve() else BUNDLED_LABELS,
        "labels_sha256": sha256_file(labels_path),
        "images_dir": images_root_token(images_dir),
        "per_cell": per_cell,
        "seed": seed,
        "count_bins": count_bins,
        "selection": "sklearn.utils.resample(replace=False) per cell, candidates sorted by SHA-256, "
                     "one RandomState(seed) across cells in sorted order",
        "strata": {"kind": mode, "density": classes, "absent": absent,
                   "lighting": ["dark (< stratum median)", "bright (>= stratum median)"]},
        "luminance": LUMA_FORMULA,
        "lighting_medians": medians,
        "excluded_split": "eval",
        "eval_images_checked": len(eval_sha),
        "pool": len(pool),
        "duplicates_dropped": dup,
        "skipped_bad": len(skipped),
        "selected": len([r for r in rows if r["status"] == "selected"]),
        "allow_short": allow_short,
        "cells": cell_info,
        "model": model,
        "preprocess": spec,
    }
    return CalibSet(name=name, rows=rows, recipe=recipe, cells=cell_info)


def _measure(pool: list[Candidate], eval_sha: dict, mode: str, count_bins: list, skip_bad: bool,
             progress: bool) -> tuple[list[Candidate], list[Candidate], int]:
    """Hash, decode and measure every pool image: (usable candidates, skipped bad ones, duplicates dropped).

    Sets each usable candidate's sha256, luminance and stratum; the first of identical images is kept.
    """
    import sys

    from tqdm import tqdm

    skipped, seen, dup = [], {}, 0
    for c in tqdm(pool, desc="calibration set: measuring luminance", unit="img", disable=not progress,
                  file=sys.stderr, dynamic_ncols=True):
        try:
            c.sha256 = sha256_file(c.path)
        except OSError as exc:
            if not skip_bad:
                raise UserError(f"{c.path}: not readable ({exc}); fix it or pass {flag_mark('skip_bad')}") from None
            c.error = f"not readable ({exc.strerror or exc})"
            skipped.append(c)
            continue
        if c.sha256 in eval_sha:
            raise UserError(f"{c.path}: same bytes as evaluation image {eval_sha[c.sha256]} "
                            f"(SHA-256 {c.sha256[:12]}...); calibration must not overlap the eval split, "
                            "remove the duplicate from the labels")
        try:
            rgb = load_rgb(c.path)
        except UserError as exc:
            if not skip_bad:
                raise UserError(f"{marked(exc)}; fix or remove it, or pass {flag_mark('skip_bad')}") from None
            c.error = str(exc).split(": ", 1)[-1]
            skipped.append(c)
            continue
        if c.sha256 in seen:
            dup += 1
            continue
        seen[c.sha256] = c
        c.luminance = luminance(rgb)
        c.density = stratum_of(c.objects, c.label, mode, count_bins)
    return list(seen.values()), skipped, dup


def _lighting_cells(usable: list[Candidate], mode: str, count_bins: list) -> tuple[list, list, dict, dict]:
    """(strata present, strata absent, per stratum its median luminance, {"<stratum>/<dark|bright>": candidates}).

    A stratum the data lack entirely (no empty image at all) is absent, not short; each stratum
    splits at its own median luminance.
    """
    present = {c.density for c in usable}
    possible = density_classes(count_bins) if mode == "objects" else sorted(present)
    classes = [d for d in possible if d in present]
    absent = [d for d in possible if d not in present]
    medians: dict[str, float | None] = {}
    by_cell: dict[str, list[Candidate]] = {}
    for d in classes:
        members = [c for c in usable if c.density == d]
        med = float(np.median([c.luminance for c in members]))
        medians[d] = med
        for c in members:
            light = "dark" if c.luminance < med else "bright"
            by_cell.setdefault(f"{d}/{light}", []).append(c)
    return classes, absent, medians, by_cell


def _select(by_cell: dict, classes: list, per_cell: int, seed: int) -> tuple[list[dict], list[dict], list]:
    """Draw `per_cell` images per cell (see the module docstring): (manifest rows, per-cell info, short cells)."""
    rs = np.random.RandomState(seed)
    rows, cell_info, short = [], [], []
    for cell in sorted(f"{d}/{light}" for d in classes for light in ("bright", "dark")):
        members = sorted(by_cell.get(cell, []), key=lambda c: (c.sha256, c.image))
        k = min(per_cell, len(members))
        chosen = draw(members, k, rs) if k else []
        if len(members) < per_cell:
            short.append((cell, len(members)))
        info = {"cell": cell, "wanted": per_cell, "available": len(members), "selected": k,
                "shortfall": per_cell - k,
                "luma_min": min((c.luminance for c in chosen), default=None),
                "luma_max": max((c.luminance for c in chosen), default=None),
                "pool_luma_min": min((c.luminance for c in members), default=None),
                "pool_luma_max": max((c.luminance for c in members), default=None)}
        cell_info.append(info)
        for c in sorted(chosen, key=lambda c: c.image):
            rows.append(_row(c, cell, seed, "selected", "", per_cell, len(members)))
    return rows, cell_info, short


def draw(members: list, k: int, rs: np.random.RandomState) -> list:
    """k of `members` without replacement: the draw sklearn.utils.resample(replace=False, n_samples=k) makes with
    the same RandomState (the index shuffled, its first k), without importing scikit-learn, which took 2 s (9 s
    on a loaded machine) of every calibrate (scipy.stats and pandas with it)."""
    order = np.arange(len(members))
    rs.shuffle(order)
    return [members[i] for i in order[:k]]


def _row(c: Candidate, cell: str, seed: int, status: str, note: str, wanted: int, available: int) -> dict:
    density, _, lighting = cell.partition("/")
    return {"path": c.image, "sha256": c.sha256, "split": c.split, "objects": c.objects,
            "density": density or c.density, "luminance": c.luminance, "lighting": lighting, "cell": cell,
            "seed": seed, "status": status, "note": note, "cell_wanted": wanted, "cell_available": available}


def manifest_bytes(rows: list[dict]) -> bytes:
    import io

    import pyarrow.parquet as pq

    table = arrowrows.to_arrow("calib_manifest", rows)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", write_statistics=False)
    return buf.getvalue()


def write_files(calset: CalibSet, folder: Path) -> dict:
    """Write manifest.parquet then recipe.json (with the manifest's hash) into `folder`."""
    data = manifest_bytes(calset.rows)
    with atomic_path(folder / MANIFEST) as tmp:
        tmp.write_bytes(data)
    recipe = dict(calset.recipe, manifest_sha256=sha256_bytes(data))
    atomic_write_json(folder / RECIPE, recipe)
    calset.recipe = recipe
    return recipe


def write(calset: CalibSet, root: str | os.PathLike = CALIB_SETS_DIR, force: bool = False) -> Path:
    """calib_sets/<name>/ written completely in a temporary folder, then moved into place."""
    dest = Path(root) / calset.name
    with staging_folder(dest) as tmp:
        write_files(calset, tmp)
        publish_folder(tmp, dest, force=force, what="calibration set")
    return dest


def load(folder: str | os.PathLike) -> tuple[list[Path], dict, "object"]:
    """(selected image paths, recipe, manifest table) of a written calibration set."""
    import pyarrow.parquet as pq

    folder = Path(folder)
    mpath, rpath = folder / MANIFEST, folder / RECIPE
    if not mpath.exists() or not rpath.exists():
        raise UserError(f"{folder}: not a calibration set (needs {MANIFEST} and {RECIPE}); run `quantbench calibrate`")
    try:
        recipe = json.loads(rpath.read_text())
        table = pq.read_table(mpath)
    except Exception as exc:
        raise UserError(f"{folder}: unreadable calibration set ({exc})") from None
    root = resolve_images_root(recipe["images_dir"])
    rows = table.to_pylist()
    paths = [root / r["path"] for r in rows if r["status"] == "selected"]
    return paths, recipe, table
