#!/usr/bin/env python3
"""Generate the bundled fixture corpus: synthetic outdoor scenes with litter.

Writes quantbench/data/corpus/images/scene_NNNN.png (128x128 RGB) and
quantbench/data/corpus/labels.json (COCO, one "split" per image).

Cross-machine determinism is the point: every image has its own PCG64 stream
(seeded with (SEED, index)); per-pixel arithmetic uses only +, -, *, /,
comparisons, floor and clip (exactly rounded in IEEE 754, so SIMD paths agree);
rotations come from a rational parametrisation (no sin/cos at all), and the
exposure gain is computed from an exactly rounded sum (math.fsum). Shapes are
rasterised here with 2x2 supersampling, never with PIL's drawing.

    python scripts/make_corpus.py            # (re)generate everything
    python scripts/make_corpus.py --check 8  # regenerate 8 images, compare pixels
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from quantbench.fsutil import atomic_path, atomic_write_text  # noqa: E402
from quantbench.inputs.preprocess import luminance  # noqa: E402

VERSION = "1"
SEED = 20261129
SIZE = 128
SS = 2  # supersampling factor per axis (Window._box_sum assumes 2)
N_IMAGES = 600
SPLITS = (("train", 400), ("val", 80), ("eval", 120))
CLASSES = ("bottle", "can", "cup", "wrapper", "bag", "cigarette_butt")
GROUNDS = ("grass", "pavement", "gravel", "sand", "soil")
OUT_DIR = REPO / "quantbench" / "data" / "corpus"

# Length range (px) of each class's long axis.
SIZE_RANGE = {
    "bottle": (22.0, 45.0),
    "can": (12.0, 24.0),
    "cup": (12.0, 26.0),
    "wrapper": (10.0, 28.0),
    "bag": (26.0, 45.0),
    "cigarette_butt": (8.0, 12.0),
}


def split_of(index: int) -> str:
    start = 0
    for name, count in SPLITS:
        if index < start + count:
            return name
        start += count
    raise ValueError(f"index {index} beyond the corpus ({start} images)")


def file_name(index: int) -> str:
    return f"scene_{index:04d}.png"


# ---------------------------------------------------------------- geometry


def rotation(rng) -> tuple[float, float]:
    """(cos, sin) of a random angle from t = tan(angle/2): only + * /."""
    t = rng.uniform(-1.0, 1.0)
    c = (1.0 - t * t) / (1.0 + t * t)
    s = 2.0 * t / (1.0 + t * t)
    if rng.random() < 0.5:
        c, s = -c, -s
    return c, s


class Window:
    """A supersampled pixel window around a shape: local coordinates u, v."""

    def __init__(self, cx, cy, radius, cos_a, sin_a):
        self.x0 = max(0, int(math.floor(cx - radius)) - 1)
        self.y0 = max(0, int(math.floor(cy - radius)) - 1)
        self.x1 = min(SIZE, int(math.floor(cx + radius)) + 2)
        self.y1 = min(SIZE, int(math.floor(cy + radius)) + 2)
        self.empty = self.x1 <= self.x0 or self.y1 <= self.y0
        if self.empty:
            return
        xs = (np.arange(self.x0 * SS, self.x1 * SS, dtype=np.float64) + 0.5) / SS
        ys = (np.arange(self.y0 * SS, self.y1 * SS, dtype=np.float64) + 0.5) / SS
        dx = xs[None, :] - cx
        dy = ys[:, None] - cy
        self.u = dx * cos_a + dy * sin_a
        self.v = dy * cos_a - dx * sin_a
        self.xs, self.ys = xs, ys

    @staticmethod
    def _box_sum(a: np.ndarray) -> np.ndarray:
        """Sum of each 2x2 subpixel block, in a fixed order (no reduction kernels)."""
        return ((a[0::2, 0::2] + a[0::2, 1::2]) + a[1::2, 0::2]) + a[1::2, 1::2]

    def coverage(self, mask_ss: np.ndarray) -> np.ndarray:
        """Supersampled boolean/float mask -> per-pixel coverage 0..1."""
        return self._box_sum(np.asarray(mask_ss, dtype=np.float64)) / float(SS * SS)

    def pool(self, values_ss: np.ndarray, mask_ss: np.ndarray) -> np.ndarray:
        """Mean of a supersampled value field over covered subpixels."""
        m = np.asarray(mask_ss, dtype=np.float64)
        vs = self._box_sum(values_ss * m[..., None])
        return vs / np.maximum(self._box_sum(m), 1.0)[..., None]


def sq(x):
    """x * x (an explicit product: no pow on arrays)."""
    return x * x


def tri(x):
    """Triangle wave in 0..1 with period 1 (a sine stand-in without sin)."""
    f = x - np.floor(x)
    return 2.0 * np.abs(f - 0.5)


def value_noise(rng, cell: float, size: int = SIZE) -> np.ndarray:
    """Smooth noise 0..1: a random lattice, bilinearly interpolated."""
    n = int(math.floor(size / cell)) + 2
    grid = rng.random((n + 1, n + 1))
    pos = (np.arange(size, dtype=np.float64) + 0.5) / cell
    i = np.floor(pos).astype(np.int64)
    f = pos - i
    f = f * f * (3.0 - 2.0 * f)  # smoothstep
    gy0 = grid[i, :]
    gy1 = grid[i + 1, :]
    rows = gy0 + (gy1 - gy0) * f[:, None]  # size x (n+1)
    c0 = rows[:, i]
    c1 = rows[:, i + 1]
    return c0 + (c1 - c0) * f[None, :]


def lens(u, v, length, width):
    """Leaf-like lens: intersection of two discs, long axis along u."""
    a = length / 2.0
    b = width / 2.0
    r = (a * a + b * b) / (2.0 * b)
    d = r - b
    return ((u * u + (v - d) * (v - d)) < r * r) & ((u * u + (v + d) * (v + d)) < r * r)


# ---------------------------------------------------------------- canvas


class Canvas:
    def __init__(self):
        self.rgb = np.zeros((SIZE, SIZE, 3), dtype=np.float64)
        self.owner = np.full((SIZE, SIZE), -1, dtype=np.int64)
        self.visible = {}  # object id -> per-pixel visible coverage (full image)

    def blend(self, win: Window, alpha: np.ndarray, color: np.ndarray, owner: int | None = None,
              occlude: bool = True):
        """Composite `color` (h x w x 3 or 3) with coverage `alpha` into the window."""
        sl = (slice(win.y0, win.y1), slice(win.x0, win.x1))
        a = alpha[..., None]
        self.rgb[sl] = self.rgb[sl] * (1.0 - a) + np.asarray(color) * a
        if occlude:
            for vis in self.visible.values():
                vis[sl] = vis[sl] * (1.0 - alpha)
        if owner is not None:
            vis = np.zeros((SIZE, SIZE), dtype=np.float64)
            vis[sl] = alpha
            self.visible[owner] = vis

    def darken(self, win: Window, alpha: np.ndarray, factor, tint=(1.0, 1.0, 1.0)):
        sl = (slice(win.y0, win.y1), slice(win.x0, win.x1))
        mult = 1.0 - alpha[..., None] * (1.0 - np.asarray(tint, dtype=np.float64) * factor)
        self.rgb[sl] = self.rgb[sl] * mult


# ---------------------------------------------------------------- ground


def ground(rng, kind: str) -> np.ndarray:
    n1 = value_noise(rng, 24.0)
    n2 = value_noise(rng, 6.0)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64)
    if kind == "grass":
        base = np.array([0.27, 0.47, 0.16]) * rng.uniform(0.85, 1.15, 3)
        shade = 0.7 + 0.45 * n1 + 0.25 * n2
        img = base * shade[..., None]
        c = Canvas()
        c.rgb = img
        for _ in range(int(rng.integers(90, 140))):
            cx, cy = rng.uniform(0, SIZE, 2)
            ca, sa = rotation(rng)
            ln = rng.uniform(4.0, 10.0)
            win = Window(cx, cy, ln / 2 + 1, ca, sa)
            if win.empty:
                continue
            m = (np.abs(win.u) < ln / 2) & (np.abs(win.v) < 0.45)
            col = base * rng.uniform(0.6, 1.5)
            c.blend(win, win.coverage(m) * 0.8, col, occlude=False)
        return c.rgb
    if kind == "pavement":
        base = np.array([0.50, 0.50, 0.48]) * rng.uniform(0.85, 1.1) * rng.uniform(0.95, 1.05, 3)
        shade = 0.85 + 0.2 * n1 + 0.1 * n2
        img = base * shade[..., None]
        slab = rng.uniform(30.0, 48.0)
        ox, oy = rng.uniform(0, slab, 2)
        gx = tri((xx + ox) / slab)
        gy = tri((yy + oy) / slab)
        joint = ((gx > 1.0 - 2.0 / slab) | (gy > 1.0 - 2.0 / slab)).astype(np.float64)
        img = img * (1.0 - 0.35 * joint[..., None])
        return img
    if kind == "gravel":
        base = np.array([0.45, 0.43, 0.40]) * rng.uniform(0.85, 1.1, 3)
        c = Canvas()
        c.rgb = base * (0.8 + 0.3 * n1)[..., None]
        for _ in range(int(rng.integers(140, 200))):
            cx, cy = rng.uniform(-2, SIZE + 2, 2)
            r = rng.uniform(1.5, 3.2)
            ca, sa = rotation(rng)
            win = Window(cx, cy, r + 1, ca, sa)
            if win.empty:
                continue
            ell = sq(win.u / r) + sq(win.v / (r * 0.75))
            m = ell < 1.0
            col = base * rng.uniform(0.65, 1.35) * rng.uniform(0.92, 1.08, 3)
            c.blend(win, win.coverage(m), col, occlude=False)
        return c.rgb
    if kind == "sand":
        base = np.array([0.78, 0.70, 0.52]) * rng.uniform(0.9, 1.05, 3)
        ca, sa = rotation(rng)
        period = rng.uniform(7.0, 14.0)
        rip = tri((xx * ca + yy * sa) / period + 0.3 * n1)
        shade = 0.88 + 0.12 * rip + 0.12 * n1 + 0.05 * n2
        return base * shade[..., None]
    if kind == "soil":
        base = np.array([0.40, 0.29, 0.19]) * rng.uniform(0.85, 1.15, 3)
        shade = 0.7 + 0.4 * n1 + 0.3 * n2
        img = base * shade[..., None]
        c = Canvas()
        c.rgb = img
        for _ in range(int(rng.integers(25, 50))):
            cx, cy = rng.uniform(0, SIZE, 2)
            r = rng.uniform(0.8, 2.0)
            win = Window(cx, cy, r + 1, 1.0, 0.0)
            if win.empty:
                continue
            m = (win.u * win.u + win.v * win.v) < r * r
            c.blend(win, win.coverage(m), base * rng.uniform(0.45, 0.75), occlude=False)
        return c.rgb
    raise ValueError(kind)


# ---------------------------------------------------------------- litter

PALETTE = {
    "bottle": [(0.20, 0.55, 0.28), (0.45, 0.25, 0.08), (0.72, 0.80, 0.84), (0.30, 0.50, 0.80)],
    "can": [(0.80, 0.10, 0.12), (0.76, 0.76, 0.78), (0.12, 0.25, 0.72), (0.10, 0.55, 0.22), (0.80, 0.65, 0.15)],
    "cup": [(0.93, 0.91, 0.87), (0.60, 0.40, 0.24), (0.95, 0.95, 0.95), (0.85, 0.20, 0.20)],
    "wrapper": [(0.95, 0.85, 0.10), (0.85, 0.15, 0.60), (0.95, 0.45, 0.05), (0.10, 0.75, 0.85), (0.55, 0.20, 0.80)],
    "bag": [(0.88, 0.88, 0.90), (0.10, 0.10, 0.12), (0.25, 0.40, 0.85), (0.85, 0.85, 0.55)],
    "cigarette_butt": [(0.85, 0.58, 0.30)],
}


def jitter(rng, col, amount=0.08):
    return np.clip(np.asarray(col) * rng.uniform(1.0 - amount, 1.0 + amount, 3), 0.0, 1.0)


def litter_shape(rng, cls: str, win: Window, length: float):
    """Boolean mask (supersampled) and a colour field (supersampled, HxWx3)."""
    u, v = win.u, win.v
    L = length
    h, w = u.shape
    col = np.zeros((h, w, 3), dtype=np.float64)
    if cls == "bottle":
        wd = L * rng.uniform(0.25, 0.32)
        neck = L * 0.28
        body_end = L / 2 - neck
        body = (u > -L / 2) & (u < body_end) & (np.abs(v) < wd / 2)
        sh = (u >= body_end) & (u < body_end + neck * 0.35)
        t = (u - body_end) / (neck * 0.35)
        shoulder = sh & (np.abs(v) < wd / 2 - t * wd * 0.28)
        neckm = (u >= body_end) & (u < L / 2 - L * 0.05) & (np.abs(v) < wd * 0.22)
        cap = (u >= L / 2 - L * 0.05) & (u < L / 2) & (np.abs(v) < wd * 0.26)
        mask = body | shoulder | neckm | cap
        base = jitter(rng, PALETTE["bottle"][int(rng.integers(4))])
        shade = 1.0 - 0.5 * sq(v / (wd / 2))
        hl = (np.abs(v + wd * 0.22) < wd * 0.08).astype(np.float64)
        col[:] = base * np.clip(shade, 0.3, 1.0)[..., None]
        col = col + hl[..., None] * 0.35
        label = (u > -L * 0.2) & (u < body_end * 0.6) & (rng.random() < 0.6)
        lab_col = jitter(rng, [(0.9, 0.9, 0.9), (0.85, 0.15, 0.15), (0.95, 0.8, 0.2)][int(rng.integers(3))])
        col = np.where(label[..., None], lab_col * np.clip(shade, 0.4, 1.0)[..., None], col)
        capc = jitter(rng, [(0.15, 0.3, 0.85), (0.95, 0.95, 0.95), (0.85, 0.1, 0.1)][int(rng.integers(3))])
        col = np.where(cap[..., None], capc, col)
        return mask, col, 0.9
    if cls == "can":
        r = L * rng.uniform(0.24, 0.3)
        body = (np.abs(u) < L / 2) & (np.abs(v) < r)
        ends = (sq((u - L / 2) / (r * 0.35)) + sq(v / r) < 1.0) | (sq((u + L / 2) / (r * 0.35)) + sq(v / r) < 1.0)
        mask = body | ends
        base = jitter(rng, PALETTE["can"][int(rng.integers(5))])
        shade = 1.05 - 0.75 * sq(v / r)
        col[:] = base * np.clip(shade, 0.2, 1.1)[..., None]
        band = (np.abs(u - L * rng.uniform(-0.2, 0.2)) < L * 0.1)
        bandc = jitter(rng, [(0.95, 0.95, 0.95), (0.1, 0.1, 0.1), (0.95, 0.85, 0.1)][int(rng.integers(3))])
        col = np.where(band[..., None], bandc * np.clip(shade, 0.2, 1.1)[..., None], col)
        spec = (np.abs(v + r * 0.35) < r * 0.12).astype(np.float64)
        col = col + spec[..., None] * 0.45
        rim = ends & ~body | (np.abs(np.abs(u) - L / 2) < 0.6)
        col = np.where(rim[..., None], np.array([0.78, 0.78, 0.8]) * np.clip(shade, 0.4, 1.0)[..., None], col)
        return mask, col, 1.0
    if cls == "cup":
        w0 = L * 0.5
        w1 = L * 0.82
        t = (u + L / 2) / L
        half = (w0 + (w1 - w0) * t) / 2
        body = (u > -L / 2) & (u < L / 2) & (np.abs(v) < half)
        rim = sq((u - L / 2) / (L * 0.12)) + sq(v / (w1 / 2)) < 1.0
        inner = sq((u - L / 2) / (L * 0.08)) + sq(v / (w1 / 2 - 1.0)) < 1.0
        mask = body | rim
        base = jitter(rng, PALETTE["cup"][int(rng.integers(4))])
        shade = 1.0 - 0.35 * sq(v / np.maximum(half, 1.0))
        col[:] = base * np.clip(shade, 0.5, 1.0)[..., None]
        sleeve = (np.abs(u) < L * 0.15)
        slc = jitter(rng, [(0.55, 0.38, 0.22), (0.1, 0.45, 0.25), (0.2, 0.2, 0.2)][int(rng.integers(3))])
        if rng.random() < 0.7:
            col = np.where(sleeve[..., None], slc * np.clip(shade, 0.5, 1.0)[..., None], col)
        col = np.where(inner[..., None], base * 0.45, col)
        return mask, col, 1.0
    if cls == "wrapper":
        a = L / 2
        b = L * rng.uniform(0.25, 0.38)
        k = rng.uniform(0.6, 1.2)
        edge_u = a * (0.88 + 0.12 * tri(v * k))
        edge_v = b * (0.85 + 0.15 * tri(u * k * 1.3))
        mask = (np.abs(u) < edge_u) & (np.abs(v) < edge_v)
        c1 = jitter(rng, PALETTE["wrapper"][int(rng.integers(5))])
        c2 = jitter(rng, PALETTE["wrapper"][int(rng.integers(5))]) * 0.6
        stripes = tri((u + v) / rng.uniform(4.0, 7.0)) > 0.55
        col[:] = np.where(stripes[..., None], c2, c1)
        crinkle = 0.8 + 0.4 * tri(u * 0.9 + v * 0.5)
        col = col * crinkle[..., None]
        foil = (tri(u * 0.7 - v * 1.1) > 0.85).astype(np.float64)
        col = col + foil[..., None] * 0.35
        return mask, col, 1.0
    if cls == "bag":
        mask = np.zeros_like(u, dtype=bool)
        for j in range(4):
            ou = rng.uniform(-0.22, 0.22) * L
            ov = rng.uniform(-0.15, 0.15) * L
            ra = L * rng.uniform(0.22, 0.32)
            rb = L * rng.uniform(0.16, 0.26)
            mask |= sq((u - ou) / ra) + sq((v - ov) / rb) < 1.0
        handle = (np.abs(np.abs(v) - L * 0.12) < 1.0) & (u > L * 0.2) & (u < L * 0.45)
        mask = mask | handle
        base = jitter(rng, PALETTE["bag"][int(rng.integers(4))])
        folds = 0.75 + 0.35 * tri(u / rng.uniform(5.0, 9.0) + v / rng.uniform(9.0, 15.0))
        col[:] = base * folds[..., None]
        return mask, col, rng.uniform(0.75, 0.95)
    if cls == "cigarette_butt":
        r = max(1.0, L * 0.13)
        mask = (np.abs(u) < L / 2) & (np.abs(v) < r)
        filt = u < L * 0.1
        tip = u > L / 2 - 1.2
        base = jitter(rng, PALETTE["cigarette_butt"][0])
        col[:] = np.where(filt[..., None], base, np.array([0.93, 0.91, 0.86]))
        col = np.where(tip[..., None], np.array([0.25, 0.22, 0.2]), col)
        return mask, col, 1.0
    raise ValueError(cls)


# ---------------------------------------------------------------- distractors


def draw_leaf(rng, canvas, cx=None, cy=None, length=None):
    cx = rng.uniform(0, SIZE) if cx is None else cx
    cy = rng.uniform(0, SIZE) if cy is None else cy
    ln = rng.uniform(6.0, 20.0) if length is None else length
    wd = ln * rng.uniform(0.3, 0.5)
    ca, sa = rotation(rng)
    win = Window(cx, cy, ln / 2 + 1, ca, sa)
    if win.empty:
        return
    m = lens(win.u, win.v, ln, wd)
    col = jitter(rng, [(0.35, 0.55, 0.15), (0.75, 0.6, 0.15), (0.5, 0.3, 0.12), (0.65, 0.35, 0.1)][int(rng.integers(4))], 0.15)
    field = np.zeros(win.u.shape + (3,))
    field[:] = col
    rib = np.abs(win.v) < 0.4
    field = np.where(rib[..., None], col * 0.7, field)
    canvas.blend(win, win.coverage(m), win.pool(field, m))


def draw_stone(rng, canvas, sun):
    cx, cy = rng.uniform(0, SIZE, 2)
    r = rng.uniform(3.0, 9.0)
    ca, sa = rotation(rng)
    win = Window(cx, cy, r + 3, ca, sa)
    if win.empty:
        return
    rb = r * rng.uniform(0.6, 0.9)
    sx, sy = sun
    # shadow first
    su = win.u - (sx * ca + sy * sa) * 0.3 * r
    sv = win.v - (sy * ca - sx * sa) * 0.3 * r
    canvas.darken(win, win.coverage(sq(su / r) + sq(sv / rb) < 1.0), 0.6)
    m = sq(win.u / r) + sq(win.v / rb) < 1.0
    base = jitter(rng, [(0.55, 0.55, 0.55), (0.5, 0.44, 0.36), (0.7, 0.68, 0.64), (0.35, 0.35, 0.37)][int(rng.integers(4))], 0.1)
    # lit from the sun side: brightness falls along the shadow direction
    ddx = win.xs[None, :] - cx
    ddy = win.ys[:, None] - cy
    lit = 1.0 - 0.35 * (ddx * sx + ddy * sy) / r
    field = base * np.clip(lit, 0.5, 1.3)[..., None]
    canvas.blend(win, win.coverage(m), win.pool(field, m))


def draw_twig(rng, canvas):
    cx, cy = rng.uniform(0, SIZE, 2)
    ln = rng.uniform(10.0, 40.0)
    wdt = rng.uniform(0.6, 1.4)
    ca, sa = rotation(rng)
    win = Window(cx, cy, ln / 2 + 2, ca, sa)
    if win.empty:
        return
    bend = rng.uniform(-0.02, 0.02)
    m = (np.abs(win.u) < ln / 2) & (np.abs(win.v - bend * win.u * win.u) < wdt)
    col = jitter(rng, (0.38, 0.26, 0.15), 0.2)
    canvas.blend(win, win.coverage(m), col)


def draw_fake_shadow(rng, canvas):
    """A bottle- or can-shaped shadow with nothing casting it (hard negative)."""
    cls = "bottle" if rng.random() < 0.6 else "can"
    L = rng.uniform(*SIZE_RANGE[cls])
    cx, cy = rng.uniform(10, SIZE - 10, 2)
    ca, sa = rotation(rng)
    win = Window(cx, cy, L / 2 + 2, ca, sa)
    if win.empty:
        return
    mask, _, _ = litter_shape(rng, cls, win, L)
    canvas.darken(win, win.coverage(mask), rng.uniform(0.4, 0.65), tint=(0.95, 1.0, 1.1))


# ---------------------------------------------------------------- scene


def _boxes_overlap(a, b, slack):
    return not (a[2] - slack <= b[0] or b[2] - slack <= a[0] or a[3] - slack <= b[1] or b[3] - slack <= a[1])


def render_scene(index: int):
    """Render scene `index` -> (HxWx3 uint8, annotations, meta).

    annotations: [{"category_id", "bbox": [x, y, w, h], "area"}] of the visible extents.
    """
    rng = np.random.Generator(np.random.PCG64([SEED, index]))
    negative = index % 2 == 1
    kind = GROUNDS[int(rng.integers(len(GROUNDS)))]
    canvas = Canvas()
    canvas.rgb = ground(rng, kind)

    # Sun direction (unit vector the shadows fall along) and shadow length.
    sc, ss = rotation(rng)
    sun = (sc, ss)
    daylight = rng.random()  # 0 = dusk, 1 = noon
    shadow_len = 0.08 + 0.35 * (1.0 - daylight)

    # A large cast shadow (tree, wall) across part of the image.
    if rng.random() < 0.45:
        ca, sa = rotation(rng)
        off = rng.uniform(-40.0, 40.0)
        yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64)
        d = (xx - 64.0) * ca + (yy - 64.0) * sa - off
        soft = rng.uniform(2.0, 8.0)
        a = np.clip(0.5 + d / soft, 0.0, 1.0)
        wobble = value_noise(rng, 16.0)
        a = np.clip(a - 0.5 * wobble * (a < 1.0), 0.0, 1.0)
        whole = Window(64.0, 64.0, 70.0, 1.0, 0.0)
        canvas.darken(whole, a, rng.uniform(0.4, 0.7), tint=(0.9, 0.97, 1.12))

    # Distractors under the litter.
    n_leaves = int(rng.integers(2, 9)) if negative else int(rng.integers(0, 5))
    n_stones = int(rng.integers(1, 6)) if negative else int(rng.integers(0, 3))
    n_twigs = int(rng.integers(0, 4)) if negative else int(rng.integers(0, 2))
    n_fake = int(rng.integers(1, 3)) if negative else int(rng.integers(0, 2)) * int(rng.random() < 0.3)
    for _ in range(n_stones):
        draw_stone(rng, canvas, sun)
    for _ in range(n_twigs):
        draw_twig(rng, canvas)
    for _ in range(n_fake):
        draw_fake_shadow(rng, canvas)
    for _ in range(n_leaves):
        draw_leaf(rng, canvas)

    objects = []
    if not negative:
        n_obj = int(rng.integers(1, 9))
        placed = []
        for oid in range(n_obj):
            cls = CLASSES[int(rng.integers(len(CLASSES)))]
            for _attempt in range(12):
                L = rng.uniform(*SIZE_RANGE[cls])
                margin = -L * 0.25  # up to a quarter of the object may leave the frame
                cx = rng.uniform(margin + L * 0.3, SIZE - margin - L * 0.3)
                cy = rng.uniform(margin + L * 0.3, SIZE - margin - L * 0.3)
                box = (cx - L / 2, cy - L / 2, cx + L / 2, cy + L / 2)
                if not any(_boxes_overlap(box, p, L * 0.35) for p in placed):
                    break
            placed.append(box)
            ca, sa = rotation(rng)
            objects.append((oid, cls, L, cx, cy, ca, sa))
        for oid, cls, L, cx, cy, ca, sa in objects:
            win = Window(cx, cy, L / 2 + 2, ca, sa)
            if win.empty:
                continue
            mask, field, opacity = litter_shape(rng, cls, win, L)
            cov = win.coverage(mask)
            # Cast shadow: the same silhouette shifted along the sun direction.
            shift = shadow_len * L
            sw = Window(cx + sun[0] * shift, cy + sun[1] * shift, L / 2 + 2, ca, sa)
            if not sw.empty:
                smask, _, _ = litter_shape(np.random.Generator(np.random.PCG64([SEED, index, oid])), cls, sw, L)
                canvas.darken(sw, sw.coverage(smask), 0.55 + 0.2 * daylight * 0.5)
            canvas.blend(win, cov * opacity, win.pool(field, mask), owner=oid)
            canvas.visible[oid] = canvas.visible[oid] / max(opacity, 1e-9)
        # Leaves blown on top of some litter (partial occlusion).
        for _ in range(int(rng.integers(0, 3))):
            if objects and rng.random() < 0.7:
                o = objects[int(rng.integers(len(objects)))]
                draw_leaf(rng, canvas, o[3] + rng.uniform(-0.4, 0.4) * o[2], o[4] + rng.uniform(-0.4, 0.4) * o[2],
                          rng.uniform(6.0, 12.0))

    # Lighting: colour cast from dusk (warm) to noon (neutral), sometimes cool shade.
    warm = 1.0 - daylight
    cast = np.array([1.0 + 0.25 * warm, 1.0 - 0.02 * warm, 1.0 - 0.35 * warm])
    if rng.random() < 0.25:
        cast = cast * np.array([0.88, 0.97, 1.15])
    img = canvas.rgb * cast
    # Exposure: scale to a target mean luma; the sum is exactly rounded (fsum).
    target = 30.0 + daylight * 190.0 + rng.uniform(-10.0, 10.0)
    luma = img[..., 0] * 0.2126 + img[..., 1] * 0.7152 + img[..., 2] * 0.0722
    mean = math.fsum(luma.ravel().tolist()) / luma.size
    gain = target / max(mean, 1e-6)
    img = np.clip(np.floor(img * gain + 0.5), 0.0, 255.0).astype(np.uint8)

    anns = []
    for oid, cls, L, cx, cy, ca, sa in objects:
        vis = canvas.visible[oid] >= 0.4
        if vis.sum() < 6:
            continue
        ys, xs = np.nonzero(vis)
        x0, x1 = int(xs.min()), int(xs.max()) + 1
        y0, y1 = int(ys.min()), int(ys.max()) + 1
        anns.append({
            "category_id": CLASSES.index(cls) + 1,
            "bbox": [round(float(x0), 2), round(float(y0), 2), round(float(x1 - x0), 2), round(float(y1 - y0), 2)],
            "area": round(float((x1 - x0) * (y1 - y0)), 2),
            "visible_pixels": int(vis.sum()),
        })
    meta = {"ground": kind, "negative": bool(negative), "split": split_of(index),
            "luma": round(luminance(img), 2), "daylight": round(float(daylight), 3)}
    return img, anns, meta


# ---------------------------------------------------------------- output


def pixel_sha256(rgb: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(rgb, dtype=np.uint8).tobytes()).hexdigest()


def decoded_sha256(path) -> str:
    from PIL import Image

    with Image.open(path) as im:
        return pixel_sha256(np.asarray(im.convert("RGB")))


def write_png(path: Path, rgb: np.ndarray):
    from PIL import Image

    with atomic_path(path, suffix=".png") as tmp:
        Image.fromarray(rgb, "RGB").save(tmp, format="PNG", optimize=True)


def generate(out_dir: Path, count: int):
    from tqdm import tqdm

    images_dir = out_dir / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    coco = {"info": {"generator": "scripts/make_corpus.py", "seed": SEED, "version": VERSION,
                     "description": "synthetic outdoor scenes with litter; bbox = visible extent"},
            "images": [], "annotations": [],
            "categories": [{"id": i + 1, "name": n} for i, n in enumerate(CLASSES)]}
    ann_id = 1
    for index in tqdm(range(count), desc="scenes", file=sys.stderr):
        img, anns, meta = render_scene(index)
        name = file_name(index)
        write_png(images_dir / name, img)
        coco["images"].append({"id": index + 1, "file_name": name, "width": SIZE, "height": SIZE,
                               "split": meta["split"], "ground": meta["ground"], "luma": meta["luma"],
                               "negative": meta["negative"]})
        for a in anns:
            coco["annotations"].append({"id": ann_id, "image_id": index + 1, "category_id": a["category_id"],
                                        "bbox": a["bbox"], "area": a["area"], "iscrowd": 0})
            ann_id += 1
    atomic_write_text(out_dir / "labels.json", json.dumps(coco, indent=1) + "\n")
    return coco


def corpus_sha256(out_dir: Path = OUT_DIR) -> str:
    """One hash for the corpus a model was trained on: labels.json, then every image.

    sha256 over the lines "labels.json <sha256>" and "images/<name> <sha256>" (names sorted),
    each followed by a newline; file bytes, as committed.
    """
    from quantbench.fsutil import sha256_file

    out_dir = Path(out_dir)
    h = hashlib.sha256()
    h.update(f"labels.json {sha256_file(out_dir / 'labels.json')}\n".encode())
    for p in sorted((out_dir / "images").glob("*.png")):
        h.update(f"images/{p.name} {sha256_file(p)}\n".encode())
    return h.hexdigest()


def sample_indices(count: int, n: int) -> list[int]:
    """n indices spread evenly over the corpus (mixes splits, litter and negatives)."""
    if n >= count:
        return list(range(count))
    step = count / n
    idx = sorted({int(math.floor(i * step)) + (i % 2) for i in range(n)})
    return [min(i, count - 1) for i in idx]


def check(out_dir: Path, n: int) -> int:
    images_dir = out_dir / "images"
    count = len(sorted(images_dir.glob("scene_*.png")))
    if count == 0:
        print(f"{images_dir}: no scene_*.png images; run scripts/make_corpus.py first", file=sys.stderr)
        return 2
    bad = 0
    for index in sample_indices(count, n):
        img, _, _ = render_scene(index)
        path = images_dir / file_name(index)
        ok = path.exists() and decoded_sha256(path) == pixel_sha256(img)
        bad += not ok
        print(f"{file_name(index)}  {'ok' if ok else 'MISMATCH'}")
    print(f"{n if n < count else count} checked, {bad} mismatched")
    return 1 if bad else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT_DIR, help="corpus folder (images/ and labels.json)")
    p.add_argument("--count", type=int, default=N_IMAGES, help="number of scenes")
    p.add_argument("--check", type=int, metavar="N", default=None,
                   help="regenerate N sample images and compare decoded pixels with the files; exit 1 on mismatch")
    args = p.parse_args(argv)
    if args.check is not None:
        return check(args.out, args.check)
    coco = generate(args.out, args.count)
    n_neg = sum(im["negative"] for im in coco["images"])
    lumas = [im["luma"] for im in coco["images"]]
    print(f"{len(coco['images'])} images ({n_neg} negatives), {len(coco['annotations'])} boxes, "
          f"luma {min(lumas):.1f}..{max(lumas):.1f} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
