"""The flip gallery: for each comparison with flips, thumbnails of the images that flip.

Each thumbnail is what the model saw (the fixture's input tensor turned back into
pixels with the inverse of its recipe's normalisation), enlarged or reduced to
THUMB pixels on its long side, with the reference run's served boxes in green,
the candidate's in magenta, the flipped decisions drawn thick, and below the
image one line per flip: kind, reference class and score -> candidate class and
score, against the threshold (or, for a classifier without one, the fp32
top-1/top-2 gap). At most PER_COMPARISON images per comparison: the ones whose
flips had the largest fp32 |margin| (the most confident decisions that moved),
ties by source name.

Same inputs, same bytes: Pillow's built-in font, no timestamps or metadata, and
a fixed PNG encoder setting. So a thumbnail is keyed by what it is drawn from
(``thumb_key``: the fixture's tensor hash and recipe, both runs' decisions, the
flips, the caption, VERSION) and not drawn again while its key file matches.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import numpy as np

from quantbench.store import partread
from quantbench.analysis.decode import NONE, kind_of
from quantbench.fsutil import atomic_path, content_key, key_path, write_key
from quantbench.textfmt import num

GALLERY = "report.d/gallery"
VERSION = 2      # of the drawing below and its file: a change of what a thumbnail looks like (or its bytes) bumps it
#: zlib level of the thumbnails: half the time of PNG's default 6 for 14% more bytes (the demo's gallery: 3.3 ms
#: and 37 KiB a thumbnail against 6.3 ms and 33 KiB); a 2-host equiv of the demo draws 96 of them
PNG_LEVEL = 3
PER_COMPARISON = 8
THUMB = 256
REF_COLOR = (0, 200, 0)
CAND_COLOR = (230, 0, 200)


def safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("._") or "x"


def tensor_rgb(arr: np.ndarray, spec: dict) -> np.ndarray:
    """A fixture's input tensor back to HxWx3 uint8 (the inverse of preprocess.to_tensor's arithmetic)."""
    x = np.asarray(arr, dtype=np.float64)
    while x.ndim > 3 and x.shape[0] == 1:
        x = x[0]
    if x.ndim != 3:
        x = x.reshape(x.shape[-2], x.shape[-1])[..., None].repeat(3, axis=2)
    elif spec.get("layout", "NCHW") == "NCHW" or (x.shape[0] in (1, 3) and x.shape[-1] not in (1, 3)):
        x = x.transpose(1, 2, 0)
    if spec.get("transpose_hw"):   # the tensor holds the image with H and W swapped (preprocess.to_tensor)
        x = x.transpose(1, 0, 2)
    if x.shape[-1] == 1:
        x = x.repeat(3, axis=2)
    x = x[..., :3]
    # albumentations' order divides by max_pixel_value where the default multiplies by scale (preprocess.to_tensor)
    scale = 1.0 / float(spec["max_pixel_value"]) if "max_pixel_value" in spec else spec.get("scale")
    if spec.get("plugin") or scale is None:   # unknown arithmetic: stretch the values for display
        lo, hi = float(np.nanmin(x)), float(np.nanmax(x))
        rgb = (x - lo) / (hi - lo if hi > lo else 1.0) * 255.0
    else:
        mean = np.asarray(spec.get("mean", [0, 0, 0]), np.float64)
        std = np.asarray(spec.get("std", [1, 1, 1]), np.float64)
        rgb = (x * std + mean) / float(scale)
    if spec.get("color", "RGB") == "BGR":
        rgb = rgb[..., ::-1]
    return np.clip(np.rint(np.nan_to_num(rgb)), 0, 255).astype(np.uint8)


def box_frame(decode: dict, sidecar: dict | None) -> str | None:
    block = (sidecar or {}).get("decode") or {}
    return kind_of(decode.get("kind") or NONE).frame(block)


def _font(size: int = 11):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:   # Pillow without FreeType sizes
        return ImageFont.load_default()


def flip_line(r: dict) -> str:
    ref = f"{r['ref_class'] or '-'} {num(r['ref_score'], '.3f')}" if r["ref_slot"] >= 0 else "not served"
    cand = f"{r['class_name'] or '-'} {num(r['score'], '.3f')}" if r["slot"] >= 0 else "not served"
    thr = r.get("threshold")
    edge = f"thr {thr:g}" if thr is not None and not (isinstance(thr, float) and math.isnan(thr)) else \
        ("greedy" if r["kind"] == "text" else "top-1")
    return f"{r['kind']}: {ref} -> {cand} ({edge}, fp32 margin {num(r['margin'], '.3f')})"


def draw(rgb: np.ndarray, ref, cand, flips: list, frame: str | None, legend: str) -> "Image.Image":
    """One thumbnail: the image, both runs' served boxes, the flipped ones thick, a caption."""
    from PIL import Image, ImageDraw

    h, w = rgb.shape[:2]
    s = THUMB / max(h, w)
    if s >= 1:
        k = max(1, int(s))
        img = Image.fromarray(rgb).resize((w * k, h * k), Image.NEAREST)
        s = float(k)
    else:
        img = Image.fromarray(rgb).resize((max(1, round(w * s)), max(1, round(h * s))), Image.LANCZOS)
    tw, th = img.size
    font = _font()
    lines = [legend] + [flip_line(r) for r in flips[:6]]
    if len(flips) > 6:
        lines.append(f"... {len(flips) - 6} more flips on this image")
    line_h = 14
    width = max(tw, *(int(math.ceil(font.getlength(t))) + 6 for t in lines))
    canvas = Image.new("RGB", (width, th + 6 + line_h * len(lines)), (255, 255, 255))
    canvas.paste(img, (0, 0))
    d = ImageDraw.Draw(canvas)
    if frame in ("normalized", "input-pixels"):
        scale = np.array([w, h, w, h], np.float64) * s if frame == "normalized" else np.full(4, s)
        flipped_ref = {r["ref_slot"] for r in flips if r["ref_slot"] >= 0}
        flipped_cand = {r["slot"] for r in flips if r["slot"] >= 0}
        for dec, color, flipped in ((ref, REF_COLOR, flipped_ref), (cand, CAND_COLOR, flipped_cand)):
            if dec is None or dec.box is None:
                continue
            for i in range(dec.slot.size):
                q = int(dec.slot[i])
                if not (dec.kept[i] or q in flipped):
                    continue
                x1, y1, x2, y2 = (np.asarray(dec.box[i], np.float64) * scale).tolist()
                if not all(map(math.isfinite, (x1, y1, x2, y2))):
                    continue
                x1, x2 = sorted((x1, x2))
                y1, y2 = sorted((y1, y2))
                d.rectangle([x1, y1, x2, y2], outline=color, width=3 if q in flipped else 1)
                if q in flipped:
                    d.text((x1 + 2, max(0, y1 - 12)), f"{float(dec.score[i]):.2f}", fill=color, font=font)
    y = th + 3
    for i, text in enumerate(lines):
        d.text((3, y), text, fill=(0, 0, 0) if i else (90, 90, 90), font=font)
        y += line_h
    return canvas


def thumb_key(fixture_id: str, recipe: dict, ref, cand, flips: list, frame: str | None, legend: str) -> str:
    """Everything ``draw`` is given, hashed; the pixels by the fixture id (the input tensor's hash) and recipe."""
    return content_key([VERSION, THUMB, fixture_id, recipe, None if ref is None else ref.digest(),
                        None if cand is None else cand.digest(), flips, frame, legend])


def save_png(img, path: Path, key: str | None = None) -> Path:
    """Write the thumbnail, and with `key` the key file saying what it was drawn from."""
    with atomic_path(path, suffix=".png") as tmp:
        img.save(tmp, format="PNG", optimize=False, compress_level=PNG_LEVEL)
    if key is not None:
        write_key(path, key)
    return path


def _recipe(spec) -> dict:
    """A fixtures row's preprocess column as a dict (stored as JSON text)."""
    return spec if isinstance(spec, dict) else json.loads(spec or "{}")


def fixture_recipes(fixture_ids, tables_root) -> dict:
    """{fixture_id: preprocessing recipe} of the fixtures in the fixtures table (no tensor read)."""
    ids = sorted(set(fixture_ids))
    if not ids:
        return {}
    t = partread.read("fixtures", root=tables_root, columns=["fixture_id", "preprocess"],
                    filter={"fixture_id": ids})
    out = {}
    for r in t.to_pylist():
        out[r["fixture_id"]] = _recipe(r["preprocess"])   # as fixture_pixels: the last row
    return out


def fixture_pixels(fixture_ids, tables_root) -> dict:
    """{fixture_id: HxWx3 uint8} of the fixtures' input tensors, read from the fixtures table."""
    ids = sorted(set(fixture_ids))
    if not ids:
        return {}
    t = partread.read("fixtures", root=tables_root, columns=["fixture_id", "dtype", "shape", "tensor", "preprocess"],
                    filter={"fixture_id": ids})
    out = {}
    for r in t.to_pylist():
        if r["tensor"] is None:
            continue
        arr = np.frombuffer(r["tensor"], dtype=np.dtype(r["dtype"])).reshape(list(r["shape"]))
        out[r["fixture_id"]] = tensor_rgb(arr, _recipe(r["preprocess"]))
    return out


def prune(folder: Path, keep: set) -> None:
    """Remove the gallery's PNGs (and their key files) not shown by this render (a stale thumbnail would mislead)."""
    if folder.is_dir():
        for p in folder.glob("*.png"):
            if p.name not in keep:
                for q in (p, key_path(p)):
                    try:
                        os.unlink(q)
                    except OSError:
                        pass
        for q in folder.glob(".*.png.key"):
            if q.name[1:-len(".key")] not in keep:
                try:
                    os.unlink(q)
                except OSError:
                    pass
