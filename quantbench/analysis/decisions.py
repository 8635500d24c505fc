"""Decision flips between a reference run (fp32) and a candidate, count concealment, margins.

A *flip* is one served decision that differs:
  ``threshold``  kept on one side only;
  ``class``      kept on both sides with a different class;
  ``box-shift``  kept on both, same class, but the box (or region) moved: IoU < 0.9;
  ``text``       (``ctc``) the decoded string changed.
Detector queries and classifier outputs compare slot by slot (the same graph,
the same query); NMS'd boxes (``nms-boxes``, ``yolo``) and map regions compare
by matching (IoU >= 0.5). A decode plug-in's decisions compare by matching when
it returns boxes, else slot by slot by slot id (a slot present on one side only
counts as not served on the other).

Totals (how many decisions each side serves) are reported next to the flips,
because equal totals conceal flips: 202 against 202 detections hid 112 changed
decisions in the motivating study. A comparison is *concealed* when the totals
differ by at most one while flips are non-zero.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from quantbench.analysis.decode import (FLIP_KINDS, IOU_MATCH, IOU_SHIFT, DecodeSpec, Decoded, iou,
                                        label_regions)
from quantbench.errors import UserError

# |margin| band edges (fp32 score distance to the threshold)
BAND_EDGES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
CONCEAL_TOLERANCE = 1


@dataclass
class Flip:
    kind: str
    ref_slot: int          # -1: only the candidate served it
    slot: int              # -1: only the reference served it
    ref_cls: int
    cls: int
    ref_score: float       # NaN when the reference has no such decision
    score: float
    ref_kept: bool
    kept: bool
    iou: float             # NaN when not applicable
    margin: float          # reference (fp32) signed distance to the decision boundary; NaN if unknown
    ref_text: str | None = None   # ctc: the reference's decoded string
    text: str | None = None       # ctc: the candidate's

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class FixtureComparison:
    ref_total: int
    total: int
    flips: list = field(default_factory=list)
    flipped_pixels: int | None = None          # threshold-map only
    flipped_pixel_regions: int | None = None   # threshold-map only: connected regions of flipped pixels

    @property
    def agrees(self) -> bool:
        return not self.flips


def _flip(kind, ref: Decoded | None, i: int, cand: Decoded | None, j: int, iou_v=math.nan) -> Flip:
    return Flip(
        kind=kind,
        ref_slot=int(ref.slot[i]) if ref is not None and i >= 0 else -1,
        slot=int(cand.slot[j]) if cand is not None and j >= 0 else -1,
        ref_cls=int(ref.cls[i]) if i >= 0 else -1,
        cls=int(cand.cls[j]) if j >= 0 else -1,
        ref_score=float(ref.score[i]) if i >= 0 else math.nan,
        score=float(cand.score[j]) if j >= 0 else math.nan,
        ref_kept=bool(ref.kept[i]) if i >= 0 else False,
        kept=bool(cand.kept[j]) if j >= 0 else False,
        iou=float(iou_v),
        margin=float(ref.margin[i]) if i >= 0 else math.nan,
    )


def _compare_aligned(ref: Decoded, cand: Decoded) -> list[Flip]:
    if ref.slot.shape != cand.slot.shape:
        raise ValueError(f"slot counts differ: {ref.slot.size} vs {cand.slot.size}; not the same graph")
    flips = []
    one_side = ref.kept ^ cand.kept
    both = ref.kept & cand.kept
    ious = iou(ref.box, cand.box) if ref.box is not None else np.ones(ref.slot.size)
    for q in np.flatnonzero(one_side | both).tolist():
        if one_side[q]:
            flips.append(_flip("threshold", ref, q, cand, q, ious[q] if ref.box is not None else math.nan))
        elif ref.cls[q] != cand.cls[q]:
            flips.append(_flip("class", ref, q, cand, q, ious[q] if ref.box is not None else math.nan))
        elif ref.box is not None and ious[q] < IOU_SHIFT:
            flips.append(_flip("box-shift", ref, q, cand, q, ious[q]))
    return flips


def _greedy_match(pair_iou: np.ndarray, allowed: np.ndarray) -> list[tuple[int, int, float]]:
    """Pairs (i, j, iou) by descending IoU (ties: lower i, then lower j), each index used once."""
    ii, jj = np.nonzero(allowed & (pair_iou >= IOU_MATCH))
    if ii.size == 0:
        return []
    vals = pair_iou[ii, jj]
    order = np.lexsort((jj, ii, -vals))
    used_i, used_j, out = set(), set(), []
    for k in order.tolist():
        i, j = int(ii[k]), int(jj[k])
        if i in used_i or j in used_j:
            continue
        used_i.add(i)
        used_j.add(j)
        out.append((i, j, float(vals[k])))
    return out


def _compare_nms(ref: Decoded, cand: Decoded) -> list[Flip]:
    n, m = ref.slot.size, cand.slot.size
    pair = iou(ref.box[:, None, :], cand.box[None, :, :]) if n and m else np.zeros((n, m))
    same_cls = ref.cls[:, None] == cand.cls[None, :]
    flips = []
    matched = _greedy_match(pair, same_cls)
    mi = {i for i, _, _ in matched}
    mj = {j for _, j, _ in matched}
    for i, j, v in matched:
        if ref.kept[i] != cand.kept[j]:
            flips.append(_flip("threshold", ref, i, cand, j, v))
        elif ref.kept[i] and v < IOU_SHIFT:
            flips.append(_flip("box-shift", ref, i, cand, j, v))
    # leftovers served on both sides at the same place with another class: class flips
    ri = [i for i in range(n) if i not in mi and ref.kept[i]]
    cj = [j for j in range(m) if j not in mj and cand.kept[j]]
    cross = []
    if ri and cj:
        sub = pair[np.ix_(ri, cj)]
        cross = [(ri[a], cj[b], v) for a, b, v in _greedy_match(sub, np.ones_like(sub, dtype=bool))]
    ci = {i for i, _, _ in cross}
    cjs = {j for _, j, _ in cross}
    for i, j, v in cross:
        flips.append(_flip("class", ref, i, cand, j, v))
    for i in ri:
        if i not in ci:
            flips.append(_flip("threshold", ref, i, cand, -1))
    for j in cj:
        if j not in cjs:
            flips.append(_flip("threshold", ref, -1, cand, j))
    flips.sort(key=lambda f: (f.ref_slot if f.ref_slot >= 0 else n + f.slot, f.slot))
    return flips


def _compare_map(spec: DecodeSpec, ref: Decoded, cand: Decoded) -> FixtureComparison:
    if ref.mask.shape != cand.mask.shape:
        raise ValueError(f"map shapes differ: {ref.mask.shape} vs {cand.mask.shape}")
    n, m = ref.slot.size, cand.slot.size
    rl, cl = ref.labels.ravel(), cand.labels.ravel()
    size_r = np.bincount(rl, minlength=n + 1)[1:]
    size_c = np.bincount(cl, minlength=m + 1)[1:]
    both = (rl > 0) & (cl > 0)
    inter = np.zeros((n, m))
    if both.any():
        np.add.at(inter, (rl[both] - 1, cl[both] - 1), 1)
    union = size_r[:, None] + size_c[None, :] - inter
    pair = np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)
    matched = _greedy_match(pair, np.ones_like(pair, dtype=bool))
    mi = {i for i, _, _ in matched}
    mj = {j for _, j, _ in matched}
    flips = [_flip("box-shift", ref, i, cand, j, v) for i, j, v in matched if v < IOU_SHIFT]
    flips += [_flip("threshold", ref, i, cand, -1) for i in range(n) if i not in mi]
    prob = ref.prob.ravel()
    for j in range(m):
        if j in mj:
            continue
        f = _flip("threshold", ref, -1, cand, j)
        # the reference's best value over the pixels the candidate served: how far below it was
        f.margin = float(prob[cl == j + 1].max() - spec.threshold)
        flips.append(f)
    flips.sort(key=lambda f: (f.ref_slot if f.ref_slot >= 0 else n + f.slot, f.slot))
    xor = ref.mask ^ cand.mask
    return FixtureComparison(ref_total=n, total=m, flips=flips, flipped_pixels=int(np.count_nonzero(xor)),
                             flipped_pixel_regions=label_regions(xor)[1])


def _on_slots(d: Decoded, slots: np.ndarray) -> Decoded:
    """`d` re-indexed on `slots` (sorted ids); a slot `d` lacks is not served (class -1, score NaN)."""
    pos = {int(q): i for i, q in enumerate(d.slot.tolist())}
    idx = np.array([pos.get(int(q), -1) for q in slots], dtype=np.int64)
    have = idx >= 0

    def take(a, fill):
        out = np.full((slots.size,) + a.shape[1:], fill, dtype=a.dtype)
        out[have] = a[idx[have]]
        return out

    return Decoded(slot=slots.astype(np.int64), cls=take(d.cls, -1), score=take(d.score, np.nan),
                   kept=take(d.kept, False), margin=take(d.margin, np.nan))


def _compare_plugin(spec: DecodeSpec, ref: Decoded, cand: Decoded) -> list[Flip]:
    if (ref.box is None) != (cand.box is None):
        raise UserError(f"decode plug-in {spec.kind}: returned 'box' on one run and not the other; "
                        f"return boxes always (compared by matching) or never (compared by slot)")
    if ref.box is not None:
        return _compare_nms(ref, cand)
    if ref.slot.shape == cand.slot.shape and np.array_equal(ref.slot, cand.slot):
        return _compare_aligned(ref, cand)
    slots = np.union1d(ref.slot, cand.slot)
    return _compare_aligned(_on_slots(ref, slots), _on_slots(cand, slots))


def flip_kinds(spec: DecodeSpec) -> tuple:
    """The flip kinds a decoder's comparisons count."""
    return spec.decoder_kind.flips


def _compare_text(ref: Decoded, cand: Decoded) -> list[Flip]:
    """ctc: slot by slot, a text flip where the strings differ."""
    flips = []
    for i, (a, b) in enumerate(zip(ref.text, cand.text)):
        if a != b:
            f = _flip("text", ref, i, cand, i)
            f.ref_text, f.text = a, b
            flips.append(f)
    return flips


# how two runs' decisions compare, by the name a decode kind carries (DecoderKind.compare): the flips, or
# (map) the whole fixture comparison
COMPARERS = {"aligned": lambda spec, ref, cand: _compare_aligned(ref, cand),
             "matched": lambda spec, ref, cand: _compare_nms(ref, cand),
             "text": lambda spec, ref, cand: _compare_text(ref, cand),
             "plugin": _compare_plugin,
             "map": _compare_map}


def compare(spec: DecodeSpec, ref: Decoded, cand: Decoded) -> FixtureComparison:
    """The flips of `cand` against `ref` on one fixture, compared as the decode kind says."""
    got = COMPARERS[spec.decoder_kind.compare](spec, ref, cand)
    if isinstance(got, FixtureComparison):
        return got
    return FixtureComparison(ref_total=ref.total, total=cand.total, flips=got)


def concealed(ref_total: int, total: int, flips: int, tolerance: int = CONCEAL_TOLERANCE) -> bool:
    """Totals (nearly) match while decisions changed: a count check would wave this through."""
    return flips > 0 and abs(ref_total - total) <= tolerance


def band_label(abs_margin: float) -> str:
    if math.isnan(abs_margin):
        return "unknown"
    lo = 0.0
    for edge in BAND_EDGES:
        if abs_margin < edge:
            return f"[{lo:g},{edge:g})"
        lo = edge
    return f"[{lo:g},inf)"


def band_labels() -> list[str]:
    edges = (0.0,) + BAND_EDGES
    return [f"[{a:g},{b:g})" for a, b in zip(edges, edges[1:])] + [f"[{BAND_EDGES[-1]:g},inf)", "unknown"]


def margin_summary(margins, threshold: float | None) -> dict:
    """Flips by fp32 confidence band, and the narrowest band around the threshold holding every flip.

    `margins` are the fp32 signed distances to the decision boundary of each
    flip. The band is [threshold + min(0, min margin), threshold + max(0, max margin)];
    `half_width` is the largest |margin| (the symmetric band). Unknown margins
    (a candidate-only detection the fp32 model never emitted) are counted apart.
    """
    m = np.asarray(list(margins), dtype=np.float64)
    known = m[~np.isnan(m)]
    bands = {b: 0 for b in band_labels()}
    for v in m.tolist():
        bands[band_label(abs(v))] += 1
    out = {"flips": int(m.size), "unknown": int(m.size - known.size),
           "bands": {k: v for k, v in bands.items() if v}, "threshold": threshold}
    if known.size:
        lo, hi = float(min(0.0, known.min())), float(max(0.0, known.max()))
        out["half_width"] = float(np.abs(known).max())
        base = threshold if threshold is not None else 0.0
        out["band"] = [base + lo, base + hi]
    else:
        out["half_width"] = None
        out["band"] = None
    return out


@dataclass
class ComparisonSummary:
    """One candidate (host, variant) against one reference (host, variant), over all fixtures."""

    comparison: str        # own-fp32 | ref-fp32 | ref-same
    host: str
    variant: str
    ref_host: str
    ref_variant: str
    fixtures: int
    ref_total: int
    total: int
    flips: int
    by_kind: dict
    images_disagree: int
    concealed: bool
    margins: dict
    flipped_pixels: int | None = None
    flipped_pixel_regions: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(comparison: str, host: str, variant: str, ref_host: str, ref_variant: str,
              per_fixture: list[FixtureComparison], threshold: float | None,
              kinds: tuple = FLIP_KINDS, totals_fixed: bool = False,
              margin_kinds: tuple | None = None) -> ComparisonSummary:
    """One comparison's figures. `totals_fixed`: every image serves exactly one decision (the decoder's
    DecoderKind.totals_fixed), so equal totals are by construction and never flagged as concealing flips.
    `margin_kinds`: the flip kinds whose margins make the margin band (DecoderKind.margin_flips; None: every kind
    but box-shift: a box that moved crossed no threshold, so its fp32 score's distance to one says nothing)."""
    flips = [f for fc in per_fixture for f in fc.flips]
    by_kind = {k: 0 for k in kinds}
    for f in flips:
        by_kind[f.kind] += 1
    ref_total = sum(fc.ref_total for fc in per_fixture)
    total = sum(fc.total for fc in per_fixture)
    px = [fc.flipped_pixels for fc in per_fixture if fc.flipped_pixels is not None]
    pr = [fc.flipped_pixel_regions for fc in per_fixture if fc.flipped_pixel_regions is not None]
    return ComparisonSummary(
        comparison=comparison, host=host, variant=variant, ref_host=ref_host, ref_variant=ref_variant,
        fixtures=len(per_fixture), ref_total=ref_total, total=total, flips=len(flips), by_kind=by_kind,
        images_disagree=sum(1 for fc in per_fixture if not fc.agrees),
        concealed=not totals_fixed and concealed(ref_total, total, len(flips)),
        margins=margin_summary([f.margin for f in flips
                                if (f.kind != "box-shift" if margin_kinds is None else f.kind in margin_kinds)],
                               threshold),
        flipped_pixels=sum(px) if px else None,
        flipped_pixel_regions=sum(pr) if pr else None,
    )
