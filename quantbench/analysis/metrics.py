"""Detection quality against COCO labels: AP50, AP50:95, precision and recall at a threshold; and
recognised text against its labels (exact match, character error rate: ``text_accuracy``).

Kept independent of any model: detections are plain arrays, one per image, of rows
``[x1, y1, x2, y2, score, class_id]`` in pixels (class_id = COCO category id), and
ground truth is the COCO JSON itself.

- ``coco_ap``: the maintained COCO evaluator (pycocotools' ``COCOeval``,
  bbox, area "all", 100 detections per image): AP at IoU 0.5 and AP averaged over
  IoU 0.50:0.95, each the mean over the classes that have at least one
  ground-truth box in the evaluated images (101-point interpolated precision).
  Its evaluation and accumulation of that one cell are restated on the box arrays
  (pycocotools' IoU and parameters, COCOeval's orders, greedy matching and
  arithmetic): the same bits as an unmodified COCOeval, which a test pins.
- ``precision_recall``: detections with score >= threshold, matched greedily per
  image and class in descending score order to the unmatched ground-truth box of
  highest IoU (IoU >= 0.5); each ground-truth box matches at most once.

``decode_detr`` turns a DETR-style sigmoid head into such arrays with the one
decoder the flips use (``quantbench.analysis.decode``, kind ``detr-sigmoid``),
and ``corpus_sha256`` names the exact labels + images a figure was measured on,
so a reported number can be traced to its data.
"""

from __future__ import annotations

import hashlib
import json
import os
import types
from pathlib import Path

import numpy as np

from quantbench.analysis.decode import DecodeSpec, decode, iou
from quantbench.errors import ParameterError
from quantbench.fsutil import sha256_file

IOU_THRESHOLD = 0.5   # precision_recall's match


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of xyxy boxes: [N,4] x [M,4] -> [N,M] (float64), by the flips' ``analysis.decode.iou``."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    return iou(a[:, None, :], b[None, :, :])


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
        ious = box_iou(dets[d_idx, :4], g[:, :4])
        taken = np.zeros(len(g), bool)
        for row, di in enumerate(d_idx):
            cand = np.where(taken, -1.0, ious[row])
            j = int(np.argmax(cand))
            if cand[j] >= iou_threshold:
                taken[j] = True
                tp[di] = True
    return tp


def _only_reported(params) -> None:
    """COCOeval's params cut to what coco_ap reads: area "all" and the most detections per image.

    COCOeval evaluates each image x class x area range on its own, all with the last (largest)
    maxDets, and accumulates each area x maxDets cell from those evaluations alone, so the
    cell read is computed by the same arithmetic on the same values whether or not the small,
    medium and large ranges and the 1 and 10 detection cells are computed beside it; they
    were three quarters of the evaluation and eleven twelfths of the accumulation.
    """
    k = list(params.areaRngLbl).index("all")
    params.areaRng = [params.areaRng[k]]
    params.areaRngLbl = ["all"]
    params.maxDets = [sorted(params.maxDets)[-1]]


def _match(starts: list, ious, dt_ids: list, gt_ids: list, gtIg: list, dtm, dtIg) -> None:
    """COCOeval's greedy matching at each IoU threshold (`starts`: min(threshold, 1 - 1e-10) each, as it starts
    the search), filling dtm and dtIg in place, over only the detections whose best IoU reaches the lowest
    threshold. No box is a crowd (every COCO annotation here has iscrowd 0): a box matches once per threshold.

    The matching walks every IoU threshold x detection x ground-truth box in Python, but a
    detection whose every IoU is below the lowest threshold matches nothing at any threshold
    (each box fails ``ious[dind, gind] < iou``) and changes no state: skipping it leaves every
    array as the full walk leaves it. Most of a detector's decisions (every query, ranked by
    score) overlap no labelled box, so the walk is a fraction of COCOeval's.
    """
    can = np.flatnonzero(~np.all(ious < min(starts), axis=1)).tolist()   # NaN IoUs stay in
    ious = ious.tolist()   # the same doubles, compared as floats
    for tind, start in enumerate(starts):
        taken = [False] * len(gt_ids)
        for dind in can:
            iou, m, row = start, -1, ious[dind]
            for gind in range(len(gt_ids)):
                if taken[gind]:
                    continue
                if m > -1 and gtIg[m] == 0 and gtIg[gind] == 1:
                    break
                if row[gind] < iou:
                    continue
                iou = row[gind]
                m = gind
            if m == -1:
                continue
            dtIg[tind, dind] = gtIg[m]
            dtm[tind, dind] = gt_ids[m]
            taken[m] = True


def _rows(arrays: list, width: int, lo: float, hi: float) -> types.SimpleNamespace:
    """The boxes of every image (in order) as COCOeval holds its annotations: ``box`` [N, 4] x, y, w, h, ``id``
    1.. in order, ``image`` (index), ``cls`` (int() of the class, as COCO's category ids), ``ignored`` (area
    w * h outside [lo, hi]: int 0/1), ``score`` (detections); ``order``: the rows by category, image and
    descending score (stable: ties in annotation order, as COCOeval's mergesort), ``rank`` each row's place
    in its category x image there, and ``at``: per (category, image index), its rows in that order."""
    arrays = [np.asarray(a, np.float64).reshape(-1, width) for a in arrays]
    rows = np.concatenate(arrays + [np.zeros((0, width))])
    image = np.concatenate([np.full(len(a), k, np.intp) for k, a in enumerate(arrays)] + [np.zeros(0, np.intp)])
    w, h = rows[:, 2] - rows[:, 0], rows[:, 3] - rows[:, 1]
    area = w * h
    cls = [int(c) for c in rows[:, width - 1].tolist()]
    score = rows[:, 4] if width == 6 else np.zeros(len(rows))
    cls = np.asarray(cls, np.int64)
    order = np.lexsort((-score, image, cls))
    change = (np.diff(cls[order]) != 0) | (np.diff(image[order]) != 0)
    cut = [0, *(np.flatnonzero(change) + 1).tolist(), len(rows)] if len(rows) else [0]
    rank = np.zeros(len(rows), np.intp)
    rank[order] = np.arange(len(rows)) - np.repeat(cut[:-1], np.diff(cut))
    return types.SimpleNamespace(box=np.column_stack([rows[:, 0], rows[:, 1], w, h]), id=np.arange(1, len(rows) + 1),
                                 image=image, cls=cls, score=score, order=order, rank=rank,
                                 ignored=((area < lo) | (area > hi)).astype(np.int64),
                                 at={(int(cls[order[i]]), int(image[order[i]])): order[i:j]
                                     for i, j in zip(cut[:-1], cut[1:])})


def _evaluate_img(p, g: np.ndarray, d: np.ndarray, gts, dts) -> tuple[np.ndarray, np.ndarray]:
    """pycocotools' ``COCOeval.evaluateImg`` (bbox, its 2.0 code, with its ``computeIoU``) of one image x class
    with ground truth `g` and detections `d` (rows of `gts` and `dts`, ``_rows``' order, d cut to the most
    detections per image): (matched, ignored) [T, D], its dtMatches != 0 and its dtIgnore."""
    from pycocotools import mask as mask_utils

    T = len(p.iouThrs)
    g = g[np.argsort(gts.ignored[g], kind="mergesort")]
    dtm, dtIg = np.zeros((T, len(d))), np.zeros((T, len(d)))
    ious = mask_utils.iou(dts.box[d], gts.box[g], [0] * len(g))   # COCOeval's ious[:, gtind]: pair by pair
    _match([min([t, 1 - 1e-10]) for t in p.iouThrs], np.asarray(ious), dts.id[d].tolist(), gts.id[g].tolist(),
           gts.ignored[g].tolist(), dtm, dtIg)
    return dtm != 0, np.logical_or(dtIg, np.logical_and(dtm == 0, dts.ignored[d].astype(bool)[None, :]))


def _ranking(p, c: int, n: int, gts, dts) -> types.SimpleNamespace:
    """Class c's detections over the n images as COCOeval.accumulate ranks them (each image's first maxDets,
    in image order, then a mergesort of the descending scores): ``image`` (index), ``tps``/``fps``/``ignored``
    [T, N] per IoU threshold, ``npig`` (its counted ground-truth boxes) and ``gt`` [n] (per image). An image
    without ground truth of c matches nothing: its detections are false positives, or ignored by their area."""
    kept = dts.order[(dts.cls[dts.order] == c) & (dts.rank[dts.order] < p.maxDets[-1])]
    matched = np.zeros((len(p.iouThrs), len(kept)), bool)
    ignored = np.repeat(dts.ignored[kept].astype(bool)[None, :], len(p.iouThrs), 0)
    start = np.searchsorted(dts.image[kept], np.arange(n + 1))   # kept is in image order
    for (cat, k), g in gts.at.items():
        if cat == c and start[k + 1] > start[k]:
            span = slice(start[k], start[k + 1])
            matched[:, span], ignored[:, span] = _evaluate_img(p, g, kept[span], gts, dts)
    order = np.argsort(-dts.score[kept], kind="mergesort")
    matched, ignored = matched[:, order], ignored[:, order]
    counted = (gts.cls == c) & (gts.ignored == 0)
    return types.SimpleNamespace(image=dts.image[kept][order], tps=matched & ~ignored, fps=~matched & ~ignored,
                                 ignored=ignored, npig=int(np.count_nonzero(counted)),
                                 gt=np.bincount(gts.image[counted], minlength=n).astype(np.float64))


def coco_ap(detections: dict, gt: dict) -> dict:
    """AP50 and AP50:95 of `detections` against `gt` with pycocotools' COCOeval (bbox).

    detections: {image_id: [M,6] x1,y1,x2,y2,score,class_id}; images missing from it
    have no detections. gt: {image_id: [N,5] x1,y1,x2,y2,category_id} (``ground_truth``);
    only its images are evaluated, images without boxes included (their detections
    are false positives). Returns {"ap50", "ap50_95": mean over classes with ground
    truth (None when no image has a box), "per_class": {class_id: AP50},
    "per_class_50_95": {class_id: AP50:95}, "n_gt": {class_id: count}}.
    """
    return _ap_figures(*_evaluated(detections, gt))


def _ap_figures(p, ranked: dict | None, n_gt: dict) -> dict:
    """coco_ap's figures from its evaluation (``_evaluated``: its params and its classes' rankings)."""
    out = {"ap50": 0.0, "ap50_95": 0.0, "per_class": {c: 0.0 for c in sorted(n_gt)},
           "per_class_50_95": {c: 0.0 for c in sorted(n_gt)}, "n_gt": n_gt}
    if not n_gt:
        return {**out, "ap50": None, "ap50_95": None}
    if ranked is None:
        return out
    prec = _precision(p, ranked)

    def mean(a) -> float:
        a = a[a > -1]
        return float(np.mean(a)) if a.size else 0.0

    for k, c in enumerate(p.catIds):
        if c in n_gt:
            out["per_class"][c] = mean(prec[0, :, k])
            out["per_class_50_95"][c] = mean(prec[:, :, k])
    out["ap50"] = mean(prec[0])
    out["ap50_95"] = mean(prec)
    return out


def _precision(p, ranked: dict) -> np.ndarray:
    """pycocotools' ``COCOeval.accumulate`` precision [IoU thresholds, recall points, classes] of the one area x
    max-detections cell evaluated (-1 for a class without ground truth), from the classes' rankings: the same
    running sums, divisions, envelope (the running maximum from the right is its loop's) and recall search."""
    recall = np.asarray(p.recThrs)
    precision = -np.ones((len(p.iouThrs), len(recall), len(p.catIds)))
    for k, c in enumerate(p.catIds):
        r = ranked.get(c)
        if r is None or r.npig == 0:
            continue
        tp = np.cumsum(r.tps, axis=1).astype(dtype=float)
        fp = np.cumsum(r.fps, axis=1).astype(dtype=float)
        rc = tp / r.npig
        pr = np.maximum.accumulate((tp / (fp + tp + np.spacing(1)))[:, ::-1], axis=1)[:, ::-1]
        for t in range(len(p.iouThrs)):
            inds = np.searchsorted(rc[t], recall, side="left")
            q = np.zeros(len(recall))
            q[inds < rc.shape[1]] = pr[t][inds[inds < rc.shape[1]]]
            precision[t, :, k] = q
    return precision


def _evaluated(detections: dict, gt: dict):
    """(COCOeval's params, {class with ground truth: its ranking (``_ranking``)} or None when there is no
    ground-truth box or no detection, {class_id: ground-truth boxes}) of the images of `gt`.

    The evaluation is COCOeval's own (``_evaluate_img``: its per image x class matching, pycocotools' IoU,
    run where an image has both boxes and detections of a class) on the boxes as arrays, for only the cell
    coco_ap reads (``_only_reported``)."""
    from pycocotools.cocoeval import Params

    ids = sorted(gt)
    p = Params(iouType="bbox")
    _only_reported(p)
    gts = _rows([gt[i] for i in ids], 5, *p.areaRng[0])
    n_gt: dict[int, int] = {}
    for c in gts.cls.tolist():
        n_gt[c] = n_gt.get(c, 0) + 1
    dts = _rows([detections.get(i, np.zeros((0, 6))) for i in ids], 6, *p.areaRng[0])
    if not n_gt or not len(dts.cls):
        return p, None, n_gt
    p.catIds = list(np.unique(sorted(set(n_gt) | set(dts.cls.tolist()))))
    return p, {c: _ranking(p, c, len(ids), gts, dts) for c in sorted(n_gt)}, n_gt


def coco_matches(detections: dict, gt: dict) -> dict:
    """coco_ap's matching (COCOeval's, run once), kept so that its AP50 and AP50:95 can be recomputed for any
    weighting of the images without matching again (``weighted_ap``: a bootstrap resample weights each image
    by how often it is drawn).

    For each class with ground truth, in the order COCOeval's accumulation ranks its detections (``matches``, one
    dict per class): ``image`` [N], the image of each detection ranked at or above the class's last true positive
    (those ranked below it change no precision); ``tp`` and ``ignored``, per IoU threshold, the ranks of its true
    positives and of its ignored detections (COCOeval's dtIgnore), every other rank a false positive. ``gt``
    [n, K]: the counted ground-truth boxes per image and class; n the images of `gt` in sorted order. ``ap``:
    coco_ap's figures, from the same evaluation.
    """
    p, ranked, n_gt = _evaluated(detections, gt)
    n, classes = len(gt), sorted(n_gt)
    counts = np.zeros((n, len(classes)))   # without detections: every box (AP 0, as coco_ap says)
    for j, c in enumerate(classes):
        if ranked is not None:
            counts[:, j] = ranked[c].gt
        else:
            for i, g in enumerate(np.asarray(gt[x], np.float64).reshape(-1, 5) for x in sorted(gt)):
                counts[i, j] = np.count_nonzero(g[:, 4] == c)
    matches = [_class_matches(ranked[c]) if ranked is not None else _no_matches(len(p.iouThrs)) for c in classes]
    return {"matches": matches, "gt": counts, "recall": np.asarray(p.recThrs, np.float64),
            "ap": _ap_figures(p, ranked, n_gt)}


def _no_matches(thresholds: int) -> dict:
    """A class's ``coco_matches`` ranking without detections."""
    none = np.zeros(0, np.intp)
    return {"image": none, "tp": [none] * thresholds, "ignored": [none] * thresholds}


def _class_matches(r) -> dict:
    """One class's ``coco_matches`` ranking from its COCOeval ranking (``_ranking``)."""
    tp = [np.flatnonzero(row) for row in r.tps]
    last = max((int(pos[-1]) + 1 for pos in tp if pos.size), default=0)
    return {"image": r.image[:last], "tp": tp, "ignored": [np.flatnonzero(row[:last]) for row in r.ignored]}


def _counts(weights) -> np.ndarray:
    """``weighted_ap``'s weights [R, n] as whole counts [n, R] (int64), or ParameterError."""
    w = np.asarray(weights, np.float64)
    if w.ndim != 2 or not np.all(np.isfinite(w) & (w >= 0) & (w == np.floor(w))):
        raise ParameterError("weights", "must be a [resamples, images] array of whole counts")
    return np.ascontiguousarray(w.T.astype(np.int64))


def _recall_steps(recall: np.ndarray, npig: np.ndarray):
    """(table, row): table[row[r], c] = searchsorted(recall, c / npig[r], "right"), the recall points that c of
    npig[r] boxes found reach, for every count c <= max(npig); the same division and search as on each count,
    done once per distinct pair."""
    values, row = np.unique(npig, return_inverse=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        found = np.arange(int(values.max()) + 1, dtype=np.float64)[None, :] / values[:, None].astype(np.float64)
    return np.searchsorted(recall, found, side="right"), row.reshape(-1)


def _ranked(wt: np.ndarray, c: dict) -> tuple[np.ndarray, np.ndarray]:
    """(ranked [U, R], at [U]): the weighted detections of class ranking `c` ranked at or above each rank `at`
    that is a true positive at some IoU threshold (summed a stretch of ranks at a time: no [N, R] running sum)."""
    at = np.unique(np.concatenate(c["tp"]))
    starts = np.concatenate([[0], at[:-1] + 1])
    return np.cumsum(np.add.reduceat(wt[c["image"][:at[-1] + 1]], starts, axis=0), axis=0, dtype=np.int64), at


def _class_ap(wt: np.ndarray, c: dict, npig: np.ndarray, recall: np.ndarray) -> list:
    """One class's summed interpolated precision [R] per IoU threshold (``weighted_ap``), None where it found
    nothing. Counts are exact integers, so tp and fp are the dense products' [R, n] @ [n, P] to the bit; the
    arrays are [P, R], summed over P as C-ordered [R, P] rows, as they always were."""
    out = [None] * len(c["tp"])
    if not c["image"].size:
        return out
    ranked, at = _ranked(wt, c)
    table, row = _recall_steps(recall, npig)
    for t, (pos, ign) in enumerate(zip(c["tp"], c["ignored"])):
        if not pos.size:
            continue
        hits = np.cumsum(wt[c["image"][pos]], axis=0, dtype=np.int64)
        misses = ranked[np.searchsorted(at, pos)] - hits
        if ign.size:   # ignored detections are neither
            skipped = np.cumsum(wt[c["image"][ign]], axis=0, dtype=np.int64)
            misses -= np.concatenate([np.zeros((1, wt.shape[1]), np.int64), skipped])[np.searchsorted(ign, pos)]
        tp, fp = hits.astype(np.float64), misses.astype(np.float64)
        pr = tp / (fp + tp + np.spacing(1))
        best = np.maximum.accumulate(pr[::-1], axis=0)[::-1]
        reach = np.diff(table[row[None, :], hits], axis=0, prepend=0)
        out[t] = np.ascontiguousarray((best * reach).T).sum(axis=1)
    return out


def weighted_ap(m: dict, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(AP50, AP50:95) of ``coco_matches`` `m` with image i counted weights[r, i] times, per row r of `weights`
    ([R, n] whole counts); all ones gives coco_ap's figures (to rounding), NaN where no weighted image has a box.

    COCOeval's interpolated precision at recall point x is the best precision of any true positive reaching
    recall >= x (precision peaks at true positives), so only the true positives are visited. Tied scores of one
    image drawn twice count as one step (COCOeval would rank the copies one after the other)."""
    wt = _counts(weights)
    boxes = (np.asarray(m["gt"]).T.astype(np.int64) @ wt).astype(np.float64)   # [K, R]
    valid = boxes > 0
    recall = m["recall"]
    total = np.zeros((wt.shape[1], len(m["matches"][0]["tp"]) if m["matches"] else 1))
    for k, c in enumerate(m["matches"]):
        for t, got in enumerate(_class_ap(wt, c, boxes[k], recall)):
            if got is not None:
                total[:, t] += np.where(valid[k], got, 0.0)
    nv = valid.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ap50 = np.where(nv > 0, total[:, 0] / (nv * recall.size), np.nan)
        ap = np.where(nv > 0, total.sum(axis=1) / (nv * recall.size * total.shape[1]), np.nan)
    return ap50, ap




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

    The decisions are those of ``quantbench.analysis.decode`` (kind ``detr-sigmoid``,
    the decoder the flips use): score = sigmoid of the best class logit, class = its
    argmax, served when score >= threshold and in the top_k; rows best first (ties:
    lower query). boxes [Q,4] are cx, cy, w, h normalised to the image; image_size is
    (width, height). class_ids maps a column to a COCO category id (default: column + 1).
    """
    logits = np.asarray(logits).reshape(-1, np.shape(logits)[-1])
    boxes = np.asarray(boxes).reshape(-1, 4)
    spec = DecodeSpec(kind="detr-sigmoid", outputs={"logits": "logits", "boxes": "boxes"},
                      threshold=float(threshold), top_k=int(top_k))
    d = decode(spec, {"logits": logits, "boxes": boxes})
    keep = np.flatnonzero(d.kept)
    keep = keep[np.lexsort((keep, -d.score[keep]))]
    w, h = image_size
    ids = np.arange(1, logits.shape[1] + 1) if class_ids is None else np.asarray(class_ids)
    box = d.box[keep] * np.array([w, h, w, h], np.float64)
    return np.concatenate([box, d.score[keep, None], ids[d.cls[keep]].astype(np.float64)[:, None]],
                          axis=1).reshape(-1, 6)


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions of characters) between two strings."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def text_accuracy(predicted: dict, truth: dict) -> dict:
    """Recognised strings against their labels ({image: str} each): exact-match fraction ("value"), matches
    ("correct"), and character error rate ("cer": edit distance summed over images / label characters)."""
    keys = sorted(truth)
    hits = sum(predicted[k] == truth[k] for k in keys)
    chars = sum(len(truth[k]) for k in keys)
    edits = sum(edit_distance(predicted[k], truth[k]) for k in keys)
    return {"value": hits / len(keys) if keys else None, "correct": hits, "images": len(keys),
            "cer": edits / chars if chars else (0.0 if not edits else None)}


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
