"""Detection quality against COCO labels: AP50, precision and recall at a threshold.

Kept independent of any model: detections are plain arrays, one per image, of rows
``[x1, y1, x2, y2, score, class_id]`` in pixels (class_id = COCO category id), and
ground truth is the COCO JSON itself. Matching is at IoU >= 0.5, per class.

- ``ap50``: all-point interpolated average precision (the area under the monotone
  precision envelope, as in PASCAL VOC 2010+ and the COCO evaluator before its
  101-point sampling), computed per class, then the mean over the classes that
  have at least one ground-truth box in the evaluated images.
- ``precision_recall``: detections with score >= threshold, matched greedily per
  image and class in descending score order to the unmatched ground-truth box of
  highest IoU; each ground-truth box matches at most once.

``decode_detr`` turns a DETR-style sigmoid head (``detr-sigmoid`` decode kind) into
such arrays, and ``corpus_sha256`` names the exact labels + images a figure was
measured on, so a reported number can be traced to its data.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from quantbench.fsutil import sha256_file

IOU_THRESHOLD = 0.5


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of xyxy boxes: [N,4] x [M,4] -> [N,M] (float64)."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    area_a = np.clip(a[:, 2] - a[:, 0], 0, None) * np.clip(a[:, 3] - a[:, 1], 0, None)
    area_b = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = np.clip(rb - lt, 0, None)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def ground_truth(coco: dict, split: str | None = None) -> dict:
    """COCO JSON -> {image_id: [N,5] float64 array of x1, y1, x2, y2, category_id}.

    Every image of `split` (all images if None) gets an entry, empty if it has no boxes,
    so images without litter count their false positives.
    """
    ids = [im["id"] for im in coco["images"] if split is None or im.get("split") == split]
    rows = {i: [] for i in ids}
    for ann in coco.get("annotations", []):
        if ann["image_id"] in rows:
            x, y, w, h = ann["bbox"]
            rows[ann["image_id"]].append([x, y, x + w, y + h, ann["category_id"]])
    return {i: np.asarray(r, np.float64).reshape(-1, 5) for i, r in rows.items()}


def _as_dets(d) -> np.ndarray:
    return np.asarray(d, np.float64).reshape(-1, 6)


def _order(scores: np.ndarray) -> np.ndarray:
    """Descending score order, ties broken by position (deterministic)."""
    return np.argsort(-scores, kind="stable")


def _match_image(dets: np.ndarray, gts: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Greedy per-class matching in one image; returns a true-positive flag per det row."""
    tp = np.zeros(len(dets), bool)
    for cls in np.unique(dets[:, 5]):
        d_idx = np.nonzero(dets[:, 5] == cls)[0]
        g = gts[gts[:, 4] == cls]
        if len(g) == 0:
            continue
        d_idx = d_idx[_order(dets[d_idx, 4])]
        iou = box_iou(dets[d_idx, :4], g[:, :4])
        taken = np.zeros(len(g), bool)
        for row, di in enumerate(d_idx):
            cand = np.where(taken, -1.0, iou[row])
            j = int(np.argmax(cand))
            if cand[j] >= iou_threshold:
                taken[j] = True
                tp[di] = True
    return tp


def average_precision(recall: np.ndarray, precision: np.ndarray) -> float:
    """All-point interpolated AP from a precision/recall curve in score order."""
    r = np.concatenate([[0.0], recall, [1.0]])
    p = np.concatenate([[0.0], precision, [0.0]])
    p = np.maximum.accumulate(p[::-1])[::-1]
    steps = np.nonzero(r[1:] != r[:-1])[0]
    return float(np.sum((r[steps + 1] - r[steps]) * p[steps + 1]))


def ap50(detections: dict, gt: dict, iou_threshold: float = IOU_THRESHOLD) -> dict:
    """Mean AP at IoU 0.5 over classes with ground truth; also per class.

    detections: {image_id: [M,6] x1,y1,x2,y2,score,class_id}; images missing from it
    have no detections. gt: from ``ground_truth``; only its images are evaluated.
    Returns {"ap50": float, "per_class": {class_id: ap}, "n_gt": {class_id: count}}.
    """
    scores, flags, classes = [], [], []
    n_gt: dict[int, int] = {}
    for image_id in sorted(gt):
        g = gt[image_id]
        for c in g[:, 4].astype(int):
            n_gt[int(c)] = n_gt.get(int(c), 0) + 1
        d = _as_dets(detections.get(image_id, np.zeros((0, 6))))
        if len(d):
            scores.append(d[:, 4])
            flags.append(_match_image(d, g, iou_threshold))
            classes.append(d[:, 5].astype(int))
    scores = np.concatenate(scores) if scores else np.zeros(0)
    flags = np.concatenate(flags) if flags else np.zeros(0, bool)
    classes = np.concatenate(classes) if classes else np.zeros(0, int)
    per_class = {}
    for c in sorted(n_gt):
        sel = classes == c
        order = _order(scores[sel])
        tp = flags[sel][order].astype(np.float64)
        ctp, cfp = np.cumsum(tp), np.cumsum(1.0 - tp)
        recall = ctp / n_gt[c]
        precision = ctp / np.maximum(ctp + cfp, 1e-12)
        per_class[c] = average_precision(recall, precision) if len(tp) else 0.0
    mean = float(np.mean(list(per_class.values()))) if per_class else 0.0
    return {"ap50": mean, "per_class": per_class, "n_gt": n_gt}


def precision_recall(detections: dict, gt: dict, threshold: float,
                     iou_threshold: float = IOU_THRESHOLD) -> dict:
    """Precision and recall of the detections with score >= threshold (all classes pooled).

    Precision is 1.0 when nothing is detected and recall is 1.0 when there is nothing
    to find, so that an empty image set is not a failure.
    """
    tp = fp = n_gt = 0
    for image_id in sorted(gt):
        g = gt[image_id]
        n_gt += len(g)
        d = _as_dets(detections.get(image_id, np.zeros((0, 6))))
        d = d[d[:, 4] >= threshold]
        flags = _match_image(d, g, iou_threshold)
        tp += int(flags.sum())
        fp += int(len(flags) - flags.sum())
    return {
        "precision": tp / (tp + fp) if tp + fp else 1.0,
        "recall": tp / n_gt if n_gt else 1.0,
        "tp": tp, "fp": fp, "fn": n_gt - tp, "n_gt": n_gt,
    }


def decode_detr(logits: np.ndarray, boxes: np.ndarray, threshold: float, top_k: int,
                image_size: tuple[int, int], class_ids=None) -> np.ndarray:
    """One image's DETR sigmoid head -> [K,6] rows x1,y1,x2,y2,score,class_id in pixels.

    logits [Q,C] (or [1,Q,C]) are raw: score = max sigmoid over classes, class = its
    argmax; queries with score >= threshold are kept, at most top_k, best first.
    boxes [Q,4] are cx, cy, w, h normalised to the image; image_size is (width, height).
    class_ids maps a column to a COCO category id (default: column + 1).
    """
    logits = np.asarray(logits, np.float64).reshape(-1, np.shape(logits)[-1])
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    probs = 1.0 / (1.0 + np.exp(-logits))
    col = probs.argmax(axis=1)
    score = probs[np.arange(len(probs)), col]
    keep = np.nonzero(score >= threshold)[0]
    keep = keep[_order(score[keep])][:top_k]
    w, h = image_size
    cx, cy, bw, bh = boxes[keep].T
    ids = np.arange(1, logits.shape[1] + 1) if class_ids is None else np.asarray(class_ids)
    return np.stack([(cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h,
                     score[keep], ids[col[keep]].astype(np.float64)], axis=1).reshape(-1, 6)


def corpus_sha256(labels_path: str | os.PathLike, images_dir: str | os.PathLike | None = None) -> str:
    """SHA-256 naming a COCO corpus: the labels file bytes, then, for every image it
    references in file-name order, ``<file_name> <sha256 of the file>\\n``."""
    labels_path = Path(labels_path)
    images_dir = Path(images_dir) if images_dir is not None else labels_path.parent / "images"
    data = labels_path.read_bytes()
    names = sorted({im["file_name"] for im in json.loads(data)["images"]})
    h = hashlib.sha256(data)
    for name in names:
        h.update(f"{name} {sha256_file(images_dir / name)}\n".encode())
    return h.hexdigest()
