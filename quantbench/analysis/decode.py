"""Output tensors -> the decisions a product serves, as the model's sidecar says.

Four decoders, all on one fixture (batch of one) at a time:

``detr-sigmoid``       per query: argmax over the named class columns, sigmoid
                       score, kept when score >= threshold and the query is in
                       the top-k by score; no NMS. Slot = query index, so two
                       runs of the same graph compare query by query, exactly.
``classifier-softmax`` top-1 of the softmax; kept when the top-1 probability is
                       >= the threshold (always kept without one). One slot.
``threshold-map``      element-wise ``p >= threshold`` on a probability map
                       (segmentation, text detection); slots are the connected
                       regions (4-connectivity) of the mask.
``nms-boxes``          detections already NMS'd by the model (boxes, scores,
                       labels); kept at the threshold; compared by matching
                       (same class, IoU >= 0.5).

Scores are computed in float64 from the raw outputs, so the decoder adds no
rounding of its own. ``Decoded.margin`` is the signed distance to the decision
boundary: score - threshold, or (classifier without a threshold) the gap between
the top-1 and top-2 probabilities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from quantbench.errors import UserError

KINDS = ("detr-sigmoid", "classifier-softmax", "threshold-map", "nms-boxes")

# role -> default output name, per kind
DEFAULT_OUTPUTS = {
    "detr-sigmoid": {"logits": "pred_logits", "boxes": "pred_boxes"},
    "classifier-softmax": {"logits": "logits"},
    "threshold-map": {"map": "map"},
    "nms-boxes": {"boxes": "boxes", "scores": "scores", "labels": "labels"},
}
DEFAULT_THRESHOLD = {"detr-sigmoid": 0.5, "classifier-softmax": None, "threshold-map": 0.5, "nms-boxes": 0.5}
IOU_MATCH = 0.5   # nms-boxes / regions: a detection matches when IoU >= this
IOU_SHIFT = 0.9   # a matched (or same-query) box with IoU below this is a box shift


@dataclass
class DecodeSpec:
    kind: str
    outputs: dict                   # role -> output name
    threshold: float | None = None
    top_k: int | None = None
    classes: list = field(default_factory=list)
    box_format: str = "cxcywh"      # detr boxes; nms-boxes default xyxy

    def as_dict(self) -> dict:
        return {"kind": self.kind, "outputs": dict(sorted(self.outputs.items())), "threshold": self.threshold,
                "top_k": self.top_k, "classes": list(self.classes), "box_format": self.box_format}

    def class_name(self, c: int) -> str:
        return str(self.classes[c]) if 0 <= c < len(self.classes) else ("" if c < 0 else str(c))


def spec_from_sidecar(sidecar: dict | None, kind: str | None = None, threshold: float | None = None,
                      source: str = "sidecar") -> DecodeSpec:
    """The decode spec: the sidecar's "decode" block, overridden by --decode / --threshold."""
    block = dict((sidecar or {}).get("decode") or {})
    side_kind = block.get("kind")
    kind = kind or side_kind
    if not kind:
        raise UserError(f"{source}: no decode kind; pass --decode ({', '.join(KINDS)}) or add a 'decode' block")
    if kind not in KINDS:
        raise UserError(f"--decode {kind}: unknown decode kind; choose one of {', '.join(KINDS)}")
    outputs = dict(DEFAULT_OUTPUTS[kind])
    if side_kind == kind or side_kind is None:
        for role in outputs:
            if isinstance(block.get(role), str):
                outputs[role] = block[role]
    thr = threshold if threshold is not None else (block.get("threshold", DEFAULT_THRESHOLD[kind])
                                                   if side_kind in (kind, None) else DEFAULT_THRESHOLD[kind])
    if thr is None and kind in ("detr-sigmoid", "threshold-map", "nms-boxes"):
        thr = DEFAULT_THRESHOLD[kind]
    if thr is not None and not (isinstance(thr, (int, float)) and not isinstance(thr, bool) and math.isfinite(thr)):
        where = "--threshold" if threshold is not None else f"{source}: decode 'threshold'"
        raise UserError(f"{where} {thr!r}: must be a finite number (nan or inf would make every "
                        "comparison false)")
    top_k = block.get("top_k") if side_kind in (kind, None) else None
    box_format = block.get("box_format", "cxcywh" if kind == "detr-sigmoid" else "xyxy")
    return DecodeSpec(kind=kind, outputs=outputs, threshold=None if thr is None else float(thr),
                      top_k=None if top_k is None else int(top_k), classes=list((sidecar or {}).get("classes") or []),
                      box_format=box_format)


def check_outputs(spec: DecodeSpec, found, single_output_ok: bool = True) -> DecodeSpec:
    """Fail (naming expected and found outputs) when the model's outputs do not fit the decoder.

    A threshold-map decoder on a single-output model uses that output whatever its name.
    """
    found = list(found)
    missing = [(r, n) for r, n in spec.outputs.items() if n not in found]
    if missing and spec.kind == "threshold-map" and single_output_ok and len(found) == 1:
        spec = DecodeSpec(**{**spec.__dict__, "outputs": {"map": found[0]}})
        missing = []
    if missing:
        expected = ", ".join(f"{r}={n!r}" for r, n in spec.outputs.items())
        raise UserError(f"--decode {spec.kind}: expects outputs {expected}; the model has "
                        f"{', '.join(repr(f) for f in found) or 'none'}; pass another --decode or fix the sidecar 'decode' block")
    return spec


@dataclass
class Decoded:
    """The decisions of one run on one fixture; arrays are aligned by slot."""

    slot: np.ndarray                 # int64 slot id (query, detection or region index)
    cls: np.ndarray                  # int64 class id (-1: none)
    score: np.ndarray                # float64 score the threshold is applied to
    kept: np.ndarray                 # bool: served
    margin: np.ndarray               # float64 signed distance to the decision boundary
    box: np.ndarray | None = None    # (n, 4) xyxy, or None
    mask: np.ndarray | None = None   # threshold-map: the boolean mask
    labels: np.ndarray | None = None # threshold-map: region label per element (0 = background; slot = label - 1)
    prob: np.ndarray | None = None   # threshold-map: the map values, float64

    @property
    def total(self) -> int:
        return int(np.count_nonzero(self.kept))


def _squeeze_batch(a: np.ndarray, ndim: int, name: str, kind: str) -> np.ndarray:
    a = np.asarray(a)
    while a.ndim > ndim and a.shape[0] == 1:
        a = a[0]
    if a.ndim != ndim:
        raise UserError(f"--decode {kind}: output {name!r} has shape {list(np.shape(a))}; expected {ndim} dims "
                        f"after dropping a batch of one")
    return a


def _sigmoid(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    ex = np.exp(x[~pos])
    out[~pos] = ex / (1.0 + ex)
    return out


def cxcywh_to_xyxy(b: np.ndarray) -> np.ndarray:
    b = np.asarray(b, dtype=np.float64)
    cx, cy, w, h = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of xyxy boxes, element-wise over the leading dims (broadcasting); equal empty boxes -> 1."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    x1 = np.maximum(a[..., 0], b[..., 0])
    y1 = np.maximum(a[..., 1], b[..., 1])
    x2 = np.minimum(a[..., 2], b[..., 2])
    y2 = np.minimum(a[..., 3], b[..., 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area_a = np.clip(a[..., 2] - a[..., 0], 0, None) * np.clip(a[..., 3] - a[..., 1], 0, None)
    area_b = np.clip(b[..., 2] - b[..., 0], 0, None) * np.clip(b[..., 3] - b[..., 1], 0, None)
    union = area_a + area_b - inter
    same = np.all(a == b, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)
    return np.where(same, 1.0, out)


def decode_detr(spec: DecodeSpec, outputs: dict) -> Decoded:
    logits = _squeeze_batch(outputs[spec.outputs["logits"]], 2, spec.outputs["logits"], spec.kind)
    boxes = _squeeze_batch(outputs[spec.outputs["boxes"]], 2, spec.outputs["boxes"], spec.kind)
    q, c = logits.shape
    n_cls = len(spec.classes) or c
    if n_cls > c:
        raise UserError(f"--decode {spec.kind}: output {spec.outputs['logits']!r} has {c} class columns; "
                        f"the sidecar names {n_cls} classes")
    if boxes.shape != (q, 4):
        raise UserError(f"--decode {spec.kind}: output {spec.outputs['boxes']!r} has shape {list(boxes.shape)}; "
                        f"expected [{q}, 4] (one box per query)")
    cols = np.asarray(logits[:, :n_cls], dtype=np.float64)
    cls = np.argmax(cols, axis=1).astype(np.int64)
    score = _sigmoid(cols[np.arange(q), cls])
    kept = score >= spec.threshold
    if spec.top_k is not None and spec.top_k < q:
        order = np.lexsort((np.arange(q), -score))   # score descending, then query index
        in_top = np.zeros(q, dtype=bool)
        in_top[order[: spec.top_k]] = True
        kept &= in_top
    box = cxcywh_to_xyxy(boxes) if spec.box_format.startswith("cxcywh") else np.asarray(boxes, dtype=np.float64)
    return Decoded(slot=np.arange(q, dtype=np.int64), cls=cls, score=score, kept=kept,
                   margin=score - spec.threshold, box=box)


def decode_classifier(spec: DecodeSpec, outputs: dict) -> Decoded:
    logits = _squeeze_batch(outputs[spec.outputs["logits"]], 1, spec.outputs["logits"], spec.kind)
    x = np.asarray(logits, dtype=np.float64)
    n_cls = len(spec.classes) or x.size
    if n_cls > x.size:
        raise UserError(f"--decode {spec.kind}: output {spec.outputs['logits']!r} has {x.size} classes; "
                        f"the sidecar names {n_cls}")
    x = x[:n_cls]
    p = np.exp(x - x.max())
    p /= p.sum()
    top = int(np.argmax(p))
    score = float(p[top])
    if spec.threshold is None:
        second = float(np.partition(p, -2)[-2]) if p.size > 1 else 0.0
        kept, margin = True, score - second
    else:
        kept, margin = score >= spec.threshold, score - spec.threshold
    return Decoded(slot=np.zeros(1, np.int64), cls=np.array([top], np.int64), score=np.array([score]),
                   kept=np.array([kept]), margin=np.array([margin]))


def label_regions(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """Connected components (4-connectivity) of a boolean mask over its last two axes.

    Leading axes (channels) are labelled independently. Labels are 1..n in
    raster order of each region's first pixel; 0 is background. Works on runs
    of each row with a union-find, so the Python loop is over runs, not pixels.
    """
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim < 2:
        mask = mask.reshape(1, -1)
    h, w = mask.shape[-2:]
    planes = mask.reshape(-1, h, w)
    labels = np.zeros(planes.shape, dtype=np.int64)
    parent: list[int] = []

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    runs = []  # (plane, row, start, stop, run id)
    for p in range(planes.shape[0]):
        prev: list = []
        for r in range(h):
            row = planes[p, r]
            if not row.any():
                prev = []
                continue
            d = np.diff(np.concatenate([[0], row.view(np.int8), [0]]))
            starts = np.flatnonzero(d == 1)
            stops = np.flatnonzero(d == -1)
            cur = []
            j = 0
            for s, e in zip(starts.tolist(), stops.tolist()):
                rid = len(parent)
                parent.append(rid)
                while j < len(prev) and prev[j][1] <= s:
                    j += 1
                k = j
                while k < len(prev) and prev[k][0] < e:
                    a, b = find(prev[k][2]), find(rid)
                    if a != b:
                        parent[max(a, b)] = min(a, b)
                    k += 1
                cur.append((s, e, rid))
                runs.append((p, r, s, e, rid))
            prev = cur
    roots: dict[int, int] = {}
    for p, r, s, e, rid in runs:
        root = find(rid)
        if root not in roots:
            roots[root] = len(roots) + 1
        labels[p, r, s:e] = roots[root]
    return labels.reshape(mask.shape), len(roots)


def decode_map(spec: DecodeSpec, outputs: dict) -> Decoded:
    prob = np.asarray(outputs[spec.outputs["map"]], dtype=np.float64)
    if prob.ndim < 2:
        raise UserError(f"--decode {spec.kind}: output {spec.outputs['map']!r} has shape {list(prob.shape)}; "
                        f"expected a map of at least 2 dims")
    mask = prob >= spec.threshold
    labels, n = label_regions(mask)
    score = np.full(n, -np.inf)
    np.maximum.at(score, labels.ravel()[mask.ravel()] - 1, prob.ravel()[mask.ravel()])
    return Decoded(slot=np.arange(n, dtype=np.int64), cls=np.zeros(n, np.int64), score=score,
                   kept=np.ones(n, dtype=bool), margin=score - spec.threshold, mask=mask, labels=labels, prob=prob)


def decode_nms(spec: DecodeSpec, outputs: dict) -> Decoded:
    boxes = _squeeze_batch(outputs[spec.outputs["boxes"]], 2, spec.outputs["boxes"], spec.kind)
    scores = _squeeze_batch(outputs[spec.outputs["scores"]], 1, spec.outputs["scores"], spec.kind)
    labels = _squeeze_batch(outputs[spec.outputs["labels"]], 1, spec.outputs["labels"], spec.kind)
    n = scores.shape[0]
    if boxes.shape != (n, 4) or labels.shape != (n,):
        raise UserError(f"--decode {spec.kind}: boxes {list(boxes.shape)}, scores {list(scores.shape)}, "
                        f"labels {list(labels.shape)} do not describe the same detections ([N,4], [N], [N])")
    score = np.asarray(scores, dtype=np.float64)
    box = cxcywh_to_xyxy(boxes) if spec.box_format.startswith("cxcywh") else np.asarray(boxes, dtype=np.float64)
    return Decoded(slot=np.arange(n, dtype=np.int64), cls=np.asarray(labels).astype(np.int64), score=score,
                   kept=score >= spec.threshold, margin=score - spec.threshold, box=box)


_DECODERS = {"detr-sigmoid": decode_detr, "classifier-softmax": decode_classifier,
             "threshold-map": decode_map, "nms-boxes": decode_nms}


def decode(spec: DecodeSpec, outputs: dict) -> Decoded:
    """Decode one fixture's outputs (name -> array)."""
    return _DECODERS[spec.kind](spec, outputs)
