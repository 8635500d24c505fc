"""Accuracy against the labels, per variant x host, from the decisions the flips use.

The decisions are the equiv analysis' own (``EquivResult.decoded``: the one
decoder of quantbench.analysis.decode), so an accuracy figure and a flip count
can never disagree about what a model served. The labels are the COCO labels the
fixtures were built from: the `fixtures` table (source image, annotations JSON,
stratum, split, preprocessing recipe) plus, for detectors, the labels file
itself (image sizes, category names), found where `equiv` read it and checked
against the table's annotations before it is trusted.

- classifier (``classifier-softmax``): top-1 accuracy of the argmax class. The
  label of an image is its one annotation without a box (a classifier's COCO
  labels), named by its category; or, when the sidecar says ``label_mode``,
  ``binary`` (classes[1] when the image has any annotation, else classes[0]) or
  ``dominant`` (the category of the largest box, classes[0] when none), the
  rules the bundled litter-cnn was trained with.
- detectors (``detr-sigmoid``, ``yolo``, ``nms-boxes``, a plug-in returning
  boxes): AP50 and AP50:95 from pycocotools' COCOeval (quantbench.analysis.metrics) over
  every decoded decision ranked by score, served or not; boxes are mapped from
  the model input back to the image's pixels by the inverse of the fixture's
  resize (stretch, letterbox, center-crop: quantbench.inputs.preprocess.boxes_to_image).
  The box frame is normalised for detr-sigmoid and input pixels for yolo; for
  nms-boxes and plug-ins the sidecar decode block says it (``"box_frame":
  "normalized"`` or ``"input-pixels"``). Classes map to categories by name.
- text recognisers (``ctc``): exact match of the decoded string and character
  error rate, against a ``"text"`` field of each image entry of the labels file
  (images without one are left out and counted in a note).

Differences between hosts or variants carry a paired bootstrap interval over the
images (``differences``; seeded): top-1, exact match and CER from per-image values,
AP50 and AP50:95 recomputed from COCOeval's one matching for each resample
(quantbench.analysis.metrics.weighted_ap), their resamples kept with the score.

Whenever a figure cannot be computed honestly the answer is a reason, never a
guess: ``{"computed": False, "why": ...}``.

A score is a pure function of the plan (metric, fixtures, labels, boxes), the
fixtures' recipes and image sizes, and the decisions scored, so it is keyed by
their content (``score_key``, with METRIC_VERSION): byte-identical hosts are
scored once, and ``ScoreCache`` keeps the scores of the last report under the
results folder, so an unchanged rerun evaluates nothing. Its entries carry their key and
the SHA-256 of their score: an edited or misfiled entry is scored again, never shown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from quantbench.store import partread
from quantbench.analysis.decode import DecodeSpec
from quantbench.inputs.assets import CORPUS_IMAGES, CORPUS_LABELS
from quantbench.errors import UserError
from quantbench.inputs.fixtures import annotations_by_image, default_images_dir, labels_coco
from quantbench.fsutil import atomic_write_json, content_key, sha256_file
from quantbench.analysis.metrics import coco_matches, edit_distance, text_accuracy, weighted_ap
from quantbench.analysis.resultcache import seal, sealed
from quantbench.inputs.preprocess import Geometry, boxes_to_image, input_hw, upright_size

METRIC_VERSION = 2   # of plan() and score(): a change of what a figure means bumps it
CACHE_FILE = ".cache/accuracy.json"   # under the results folder (hidden: no release archive holds it)
BOOTSTRAP_RESAMPLES = 1000   # paired bootstrap of an accuracy difference: resamples of the images,
BOOTSTRAP_SEED = 0           # drawn with this seed (the same interval on every run),
BOOTSTRAP_LEVEL = 0.95       # and the interval's coverage


@dataclass
class FixtureTruth:
    fixture_id: str
    source: str
    image_sha256: str
    annotations: list
    stratum: str
    split: str
    preprocess: dict
    size: tuple | None = None          # (height, width) of the source image, when known
    image_path: str | None = None      # the source image file, when found with the recorded hash
    text: str | None = None            # the image's "text" label (a text recogniser's truth), when it has one
    geometry: dict | None = None       # where the image went in the input, as the fixture row records it


@dataclass
class Truth:
    fixtures: dict                      # fixture_id -> FixtureTruth
    categories: dict | None = None      # COCO category id -> name (from the labels file), None if not read
    labels_file: str = ""
    note: str = ""                      # why the labels file could not be used
    mismatched: list = field(default_factory=list)   # fixtures whose annotations differ from the file's


def _json_value(v, default):
    if v is None:
        return default
    if isinstance(v, (list, dict)):
        return v
    try:
        return json.loads(v)
    except (TypeError, ValueError):
        return default


def _ann_key(a: dict) -> tuple:
    bbox = a.get("bbox")
    return (a.get("image_id"), a.get("category_id"), None if bbox is None else tuple(float(x) for x in bbox))


def load_truth(fixture_ids, tables_root, labels=None, images=None) -> Truth:
    """The ground truth of `fixture_ids`: the fixtures table rows, checked against the labels file.

    `labels`: the COCO JSON the fixtures were built from (None: the bundled corpus, as `run`
    and `equiv` default); `images`: its images folder (None: images/ beside it).
    """
    ids = sorted(set(fixture_ids))
    cols = ["fixture_id", "source", "image_sha256", "labels", "stratum", "split", "preprocess", "geometry"]
    t = partread.read("fixtures", root=tables_root, columns=cols, filter={"fixture_id": ids})
    fx = {}
    for r in t.to_pylist():
        fx[r["fixture_id"]] = FixtureTruth(
            fixture_id=r["fixture_id"], source=r["source"] or "", image_sha256=r["image_sha256"] or "",
            annotations=list(_json_value(r["labels"], [])), stratum=r["stratum"] or "", split=r["split"] or "",
            preprocess=dict(_json_value(r["preprocess"], {})), geometry=_json_value(r["geometry"], None))
    return _checked_truth(fx, labels, images)


def truth_of_fixtures(fixtures, preprocess: dict, labels=None, images=None) -> Truth:
    """load_truth's Truth from the Fixture objects themselves (a search writes no fixtures table): each one's
    annotations, stratum and split, `preprocess` their input recipe, checked against the labels file alike."""
    fx = {f.fixture_id: FixtureTruth(fixture_id=f.fixture_id, source=f.source or "", image_sha256=f.image_sha256 or "",
                                     annotations=list(f.labels or []), stratum=f.stratum or "", split=f.split or "",
                                     preprocess=dict(preprocess or {}), geometry=f.geometry) for f in fixtures}
    return _checked_truth(fx, labels, images)


def _checked_truth(fx: dict, labels, images) -> Truth:
    """`fx` ({fixture id: FixtureTruth}) checked against the labels file, with its categories, sizes and images."""
    labels_path = Path(labels) if labels else CORPUS_LABELS
    images_dir = Path(images) if images else (CORPUS_IMAGES if labels_path == CORPUS_LABELS
                                              else default_images_dir(labels_path))
    truth = Truth(fixtures=fx, labels_file=str(labels_path))
    try:
        coco = labels_coco(labels_path, images_dir, check_files=False)
    except UserError as exc:
        truth.note = str(exc)
        return truth
    by_name = {im["file_name"]: im for im in coco["images"]}
    anns = annotations_by_image(coco)
    truth.categories = {c["id"]: str(c.get("name", c["id"])) for c in coco["categories"]}
    for f in fx.values():
        im = by_name.get(f.source)
        if im is None or sorted(map(_ann_key, anns.get(im["id"], []))) != sorted(map(_ann_key, f.annotations)):
            truth.mismatched.append(f.fixture_id)
            continue
        if isinstance(im.get("text"), str):
            f.text = im["text"]
        path = images_dir / f.source
        if path.is_file() and sha256_file(path) == f.image_sha256:
            f.image_path = str(path)
        if isinstance(im.get("width"), int) and isinstance(im.get("height"), int):
            f.size = (im["height"], im["width"])
        elif f.image_path:
            f.size = upright_size(f.image_path)   # as load_rgb decoded it: EXIF orientation applied
        elif f.geometry:
            f.size = tuple(f.geometry["image_size"])   # as the fixture recorded it when it was made
    if truth.mismatched and len(truth.mismatched) == len(fx):
        truth.note = f"{labels_path} does not hold the fixtures' labels (another labels file made them)"
        truth.categories = None
    return truth


# --------------------------------------------------------------------------- per model


@dataclass
class Plan:
    """What scoring a model needs, decided once per model: the metric and each fixture's truth."""

    metric: str                         # "top-1", "AP" or "text"
    fixtures: list                      # fixture ids scored
    labels: dict = field(default_factory=dict)       # top-1: fixture -> class index; text: fixture -> string
    gt: dict = field(default_factory=dict)           # AP: fixture -> [N,5] x1,y1,x2,y2,category_id (pixels)
    category_of: dict = field(default_factory=dict)  # AP: class index -> category id
    frame: str = ""
    note: str = ""                      # caveats shown with the figures


def _classifier_labels(sidecar: dict, classes: list, truth: Truth, fids: list) -> tuple[dict, str]:
    mode = (sidecar or {}).get("label_mode")
    names = {str(c): i for i, c in enumerate(classes)}
    out, skipped = {}, 0
    for f in fids:
        ft = truth.fixtures[f]
        anns = ft.annotations
        if mode == "binary":
            if len(classes) != 2:
                return {}, f"label_mode binary needs 2 classes, the sidecar names {len(classes)}"
            out[f] = int(bool(anns))
            continue
        if mode == "dominant":
            if truth.categories is None:
                return {}, f"label_mode dominant needs the category names of the labels file ({truth.note})"
            boxed = [a for a in anns if a.get("bbox") is not None]
            if not boxed:
                out[f] = 0
                continue
            best = max(sorted(boxed, key=lambda a: a.get("id", 0)), key=lambda a: a["bbox"][2] * a["bbox"][3])
            name = truth.categories.get(best.get("category_id"))
            if name not in names:
                return {}, f"category {name!r} is not one of the sidecar's classes"
            out[f] = names[name]
            continue
        if mode is not None:
            return {}, f"sidecar label_mode {mode!r} is not binary or dominant"
        if len(anns) != 1 or anns[0].get("bbox") is not None:
            skipped += 1
            continue
        cid = anns[0].get("category_id")
        name = truth.categories.get(cid) if truth.categories else None
        name = name if name is not None else ft.stratum   # the stratum is the one label's clean name
        if str(name) not in names:
            return {}, f"label {name!r} is not one of the sidecar's classes ({', '.join(map(str, classes[:6]))})"
        out[f] = names[str(name)]
    if not out:
        n_empty = sum(1 for f in fids if not truth.fixtures[f].annotations)
        if n_empty == len(fids):
            return {}, f"no labels: none of the {len(fids)} images carries an annotation"
        return {}, (f"labels are not one class per image ({skipped} of {len(fids)} images carry boxes or several "
                    "annotations); a classifier needs one annotation without a box per image, or a sidecar "
                    "'label_mode' (binary or dominant)")
    return out, "" if not skipped else f"{skipped} of {len(fids)} images without one label are left out"


def _top1_plan(spec, sidecar: dict | None, truth: Truth, fids: list, boxed: bool) -> Plan | str:
    """classifier: top-1 against each image's one label (or the sidecar's label_mode)."""
    labels, why = _classifier_labels(sidecar or {}, list(spec.classes), truth, fids)
    if not labels:
        return why
    return Plan(metric="top-1", fixtures=sorted(labels), labels=labels, note=why)


def _text_plan(spec, sidecar: dict | None, truth: Truth, fids: list, boxed: bool) -> Plan | str:
    """ctc: score against the "text" label of each image that has one."""
    if truth.categories is None:
        return (f"the labels file the fixtures came from was not read ({truth.note}); its images' \"text\" "
                "fields are the truth; pass --fixtures LABELS.json to `quantbench report`")
    labels = {f: truth.fixtures[f].text for f in fids
              if f not in truth.mismatched and truth.fixtures[f].text is not None}
    if not labels:
        return f"no text labels: none of the {len(fids)} images has a \"text\" field in {truth.labels_file}"
    left = len(fids) - len(labels)
    return Plan(metric="text", fixtures=sorted(labels), labels=labels,
                note=f"{left} of {len(fids)} images without a text label are left out" if left else "")


def plan(spec, sidecar: dict | None, truth: Truth | None, fixture_ids, boxed: bool = True) -> Plan | str:
    """How to score one model's decisions against the labels (the plan its decode kind names), or the reason
    it cannot be done.

    `boxed`: the decisions carry boxes (a plug-in returning none is not asked for their frame)."""
    fids = sorted(fixture_ids)
    kind = spec.decoder_kind
    if not kind.decides:
        return kind.unscored
    if truth is None:
        return "no labels were given to the report"
    missing = [f for f in fids if f not in truth.fixtures]
    if missing:
        return f"{len(missing)} fixtures are not in the fixtures table"
    if kind.metric is None:
        return kind.unscored
    return PLANS[kind.metric](spec, sidecar, truth, fids, boxed)


def _ap_plan(spec, sidecar: dict | None, truth: Truth, fids: list, boxed: bool) -> Plan | str:
    """detectors: AP of the boxes, mapped back to the images' pixels, against the COCO boxes."""
    classes = list(spec.classes)
    frame, why = spec.decoder_kind.ap_frame(dict((sidecar or {}).get("decode") or {}), boxed)
    if frame is None:
        return why
    if not any(truth.fixtures[f].annotations for f in fids):
        return f"no ground-truth boxes: none of the {len(fids)} images carries an annotation"
    if truth.categories is None:
        return (f"the COCO labels the fixtures came from were not read ({truth.note}); "
                "pass --fixtures LABELS.json (and --images DIR) to `quantbench report`")
    bad = [f for f in fids if f in truth.mismatched]
    if bad:
        return f"{len(bad)} of {len(fids)} fixtures' labels differ from {truth.labels_file}"
    plugins = [f for f in fids if truth.fixtures[f].preprocess.get("plugin")]
    if plugins:
        return "the input is made by a preprocessing plug-in: its geometry is unknown, boxes cannot be mapped back"
    nosize = [f for f in fids if truth.fixtures[f].size is None]
    if nosize:
        return f"{len(nosize)} images have no width/height in {truth.labels_file} and were not found"
    agnostic = spec.decoder_kind.class_agnostic   # a map's regions against every labelled box, as one category
    by_name = {name: cid for cid, name in truth.categories.items()}
    category_of = {0: 1} if agnostic else {i: by_name[str(c)] for i, c in enumerate(classes) if str(c) in by_name}
    if not category_of:
        return "none of the sidecar's classes names a category of the labels"
    gt = {}
    for f in fids:
        rows = [[*a["bbox"][:2], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3],
                 1 if agnostic else a["category_id"]]
                for a in truth.fixtures[f].annotations if a.get("bbox") is not None]
        gt[f] = np.asarray(rows, np.float64).reshape(-1, 5)
    unnamed = [] if agnostic else [str(c) for i, c in enumerate(classes) if i not in category_of]
    note = f"classes without a category of the same name, left out: {', '.join(unnamed[:5])}" if unnamed else ""
    return Plan(metric="AP", fixtures=fids, gt=gt, category_of=category_of, frame=frame, note=note)


PLANS = {"top-1": _top1_plan, "text": _text_plan, "AP": _ap_plan}   # by DecoderKind.metric


def score(p: Plan, decoded: dict, truth: Truth) -> dict:
    """The plan's metric over `decoded` ({fixture_id: Decoded}): {"metric", "value", "ap50_95", "images"}; for AP
    also "resampled": AP50 and AP50:95 on each bootstrap resample of the images (``resample_weights``; None where
    a resample holds no box), which ``differences`` pairs."""
    if p.metric == "text":
        got = text_accuracy({f: decoded[f].text[0] for f in p.fixtures}, p.labels)
        return {"metric": "text", "ap50_95": None, **got}
    if p.metric == "top-1":
        hits = [int(decoded[f].cls[0]) == p.labels[f] for f in p.fixtures]
        return {"metric": "top-1", "value": float(np.mean(hits)), "ap50_95": None, "images": len(hits),
                "correct": int(sum(hits))}
    m = coco_matches(_detections(p, decoded, truth), p.gt)
    ap50, ap = weighted_ap(m, resample_weights(len(p.fixtures)))
    resampled = {fig: [None if x != x else x for x in v.tolist()]   # x != x: NaN, no box drawn
                 for fig, v in (("AP50", ap50), ("AP50:95", ap))}
    return {"metric": "AP", "value": m["ap"]["ap50"], "ap50_95": m["ap"]["ap50_95"], "images": len(p.fixtures),
            "resampled": resampled}


def _detections(p: Plan, decoded: dict, truth: Truth) -> dict:
    """AP: each fixture's decisions as coco_ap's [M, 6] rows (x1, y1, x2, y2 in image pixels, score, category)."""
    dets = {}
    cats = np.array([p.category_of.get(i, -1) for i in range(max(p.category_of) + 1)])
    for f in p.fixtures:
        d = decoded[f]
        ft = truth.fixtures[f]
        if d.box is None or not d.slot.size:
            dets[f] = np.zeros((0, 6))
            continue
        box = np.asarray(d.box, np.float64)
        if p.frame == "normalized":
            h, w = Geometry.from_dict(ft.geometry).model_hw() if ft.geometry else input_hw(ft.preprocess)
            box = box * np.array([w, h, w, h], np.float64)
        box = boxes_to_image(box, ft.preprocess, ft.size) if ft.geometry is None else \
            Geometry.from_dict(ft.geometry).to_image(box)   # as the fixture was made
        cls = np.asarray(d.cls)
        ok = (cls >= 0) & (cls < cats.size) & np.isfinite(d.score)
        ok[ok] = cats[cls[ok]] >= 0
        dets[f] = np.concatenate([box[ok], d.score[ok, None], cats[cls[ok]].astype(np.float64)[:, None]], axis=1)
    return dets


def _mean(x: np.ndarray) -> np.ndarray:
    return x.mean(axis=-1)


def _edit_rate(x: np.ndarray) -> np.ndarray:
    """Character error rate of per-image (edits, label characters) pairs: summed edits over summed characters."""
    return x[..., 0].sum(axis=-1) / np.maximum(x[..., 1].sum(axis=-1), 1)


def per_image(p: Plan, decoded: dict) -> dict:
    """{figure: (per-image values in p.fixtures order, the statistic over images, higher is better)}: top-1 hits;
    exact text matches and (edits, characters) for the CER; nothing for AP, which is not a figure over images
    (its resamples come from the matching: ``score``)."""
    if p.metric == "top-1":
        return {"top-1": (np.array([float(int(decoded[f].cls[0]) == p.labels[f]) for f in p.fixtures]), _mean, True)}
    if p.metric != "text":
        return {}
    got = {f: decoded[f].text[0] for f in p.fixtures}
    return {"exact match": (np.array([float(got[f] == p.labels[f]) for f in p.fixtures]), _mean, True),
            "CER": (np.array([[edit_distance(got[f], p.labels[f]), len(p.labels[f])] for f in p.fixtures], np.float64),
                    _edit_rate, False)}


def resample_images(n: int, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """The bootstrap's resamples of n images: [resamples, n] positions drawn with replacement (seeded)."""
    return np.random.default_rng(seed).integers(0, n, (resamples, n))


def resample_weights(n: int, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """``resample_images`` as counts: [resamples, n], how often each resample draws each image."""
    drawn = (np.arange(resamples)[:, None] * n + resample_images(n, resamples, seed)).reshape(-1)
    return np.bincount(drawn, minlength=resamples * n).reshape(resamples, n).astype(np.float64)


def difference_interval(a: float, ra, b: float, rb, level: float = BOOTSTRAP_LEVEL) -> tuple[float, float, float]:
    """(a - b, low, high): the percentile interval of the paired resamples' differences (NaN ones left out)."""
    d = np.asarray(ra, np.float64) - np.asarray(rb, np.float64)
    d = d[~np.isnan(d)]
    lo, hi = np.quantile(d, [(1 - level) / 2, 1 - (1 - level) / 2]) if d.size else (np.nan, np.nan)
    return float(a - b), float(lo), float(hi)


def _figures(p: Plan, decoded: dict, sc: dict | None) -> dict:
    """{figure: (value, its value on each resample, higher is better)} of one variant x host; AP from its score."""
    if p.metric == "AP":
        got = (sc or {}).get("resampled")
        if not isinstance(got, dict):
            return {}
        return {fig: (sc[key], np.array([np.nan if x is None else x for x in got[fig]], np.float64), True)
                for fig, key in (("AP50", "value"), ("AP50:95", "ap50_95"))}
    idx = resample_images(len(p.fixtures))
    return {fig: (stat(v), stat(v[idx]), higher) for fig, (v, stat, higher) in per_image(p, decoded).items()}


def differences(p: Plan, result, variants: list, reference: str, scores: dict | None = None) -> list[dict]:
    """Accuracy differences with their paired bootstrap interval over the images, per figure (AP's from the
    resamples of `scores`, {(variant, host): score}): each variant on each other host against it on the reference
    host, and each variant against fp32 on the same host."""
    outcome = {}
    for v in variants:
        for h in result.hosts:
            got = {f: result.decoded.get((h, v["variant_id"], f)) for f in p.fixtures}
            if all(d is not None for d in got.values()):
                outcome[(v["variant"], h)] = _figures(p, got, (scores or {}).get((v["variant"], h)))
    pairs = [((v["variant"], h), (v["variant"], reference)) for v in variants for h in result.hosts if h != reference]
    pairs += [((v["variant"], h), ("fp32", h)) for v in variants if v["variant"] != "fp32" for h in result.hosts]
    out = []
    for a, b in pairs:
        for figure, (va, ra, higher) in outcome.get(a, {}).items() if outcome.get(b) else ():
            diff, lo, hi = difference_interval(va, ra, *outcome[b][figure][:2])
            out.append({"a": a, "b": b, "figure": figure, "higher_better": higher, "diff": diff, "low": lo,
                        "high": hi, "images": len(p.fixtures)})
    return out


def plan_key(p: Plan, truth: Truth) -> str:
    """What score() reads besides the decisions, hashed once per model: the plan and each scored
    fixture's recipe and image size."""
    return content_key([p.metric, p.fixtures, p.labels, {f: g.tolist() for f, g in p.gt.items()},
                        sorted(p.category_of.items()), p.frame,
                        {f: [truth.fixtures[f].preprocess, truth.fixtures[f].size] for f in p.fixtures}])


def score_key(plan: str, decoded: dict) -> str:
    """The content key of one score: METRIC_VERSION, ``plan_key`` and every scored decision's digest."""
    return content_key([METRIC_VERSION, plan, [[f, d.digest()] for f, d in sorted(decoded.items())]])


def _is_score(d) -> bool:
    """`d` has the shape score() returns (a cache entry is checked before it is shown)."""
    def real_or_none(x):
        return x is None or (isinstance(x, (int, float)) and not isinstance(x, bool))

    if not isinstance(d, dict) or d.get("metric") not in ("top-1", "AP", "text"):
        return False
    if not (real_or_none(d.get("value")) and real_or_none(d.get("ap50_95")) and isinstance(d.get("images"), int)):
        return False
    return (set(d) <= {"metric", "value", "ap50_95", "images", "correct", "cer", "resampled"}
            and real_or_none(d.get("correct")) and real_or_none(d.get("cer")) and _is_resampled(d.get("resampled")))


def _is_resampled(r) -> bool:
    """None, or AP50 and AP50:95 on each of the bootstrap's resamples (numbers, or None: no box drawn)."""
    return r is None or (isinstance(r, dict) and set(r) == {"AP50", "AP50:95"} and all(
        isinstance(v, list) and len(v) == BOOTSTRAP_RESAMPLES
        and all(x is None or (isinstance(x, (int, float)) and not isinstance(x, bool)) for x in v) for v in r.values()))


class ScoreCache:
    """Scores by content key: those of the last report (read from `path`), and those used now.

    ``save`` keeps only the scores this report used, so the file stays the size of one report.
    `computed` counts the scores evaluated rather than found. Each entry is
    ``{"key": its content key, "seal": this machine's seal of key and score, "score": ...}`` (like the
    equiv cache, quantbench.analysis.resultcache): results folders travel, so an entry filed under
    another key, or not sealed here (forged with a recomputed checksum, or brought from elsewhere), is a miss
    and scored again: the cache never decides a reported figure alone.
    """

    FORMAT = 3   # 3: entries sealed (resultcache.seal), not checksummed

    def __init__(self, path=None):
        self.path = Path(path) if path is not None else None
        self.known, self.used, self.computed = {}, {}, 0
        if self.path is not None:
            try:
                data = json.loads(self.path.read_text())
                if isinstance(data, dict) and data.get("version") == METRIC_VERSION and data.get("format") == self.FORMAT:
                    self.known = {k: e["score"] for k, e in dict(data.get("scores") or {}).items()
                                  if _sealed(k, e)}
            except (OSError, ValueError, TypeError, AttributeError):   # missing or damaged: computed again
                pass

    def get(self, key: str, compute):
        if key not in self.used:
            found = self.known.get(key)
            if not _is_score(found):   # absent, or a damaged file's entry: never trusted
                found = compute()
                self.computed += 1
            self.used[key] = found
        return dict(self.used[key])

    def save(self) -> None:
        if self.path is not None and self.used != self.known:
            scores = {k: {"key": k, "seal": seal(_sealed_bytes(k, v)), "score": v} for k, v in self.used.items()}
            if any(e["seal"] is None for e in scores.values()):   # nothing to seal with here: nothing kept
                return
            atomic_write_json(self.path, {"version": METRIC_VERSION, "format": self.FORMAT, "scores": scores},
                              indent=None)


def _sealed_bytes(key: str, score: dict) -> bytes:
    return f"{key}\n{content_key(score)}".encode()


def _sealed(key: str, entry) -> bool:
    """A cache entry filed under `key` that says it is of `key` and that this machine sealed."""
    return (isinstance(entry, dict) and entry.get("key") == key and isinstance(entry.get("score"), dict)
            and sealed(_sealed_bytes(key, entry["score"]), entry.get("seal")))


def accuracy_table(result, sidecars: dict, truth: Truth | None, cache: ScoreCache | None = None) -> dict:
    """Per model: {"plan": Plan | reason, "scores": {(variant, host): score dict}} from an EquivResult.

    `sidecars`: model -> the fp32 variant's sidecar (classes, decode block, label_mode);
    `cache`: where scores of the same content are found (None: a fresh one; hosts with
    identical decisions are still scored once).
    """
    cache = cache if cache is not None else ScoreCache()

    out = {}
    for model in dict.fromkeys(v["model"] for v in result.variants):
        vs = [v for v in result.variants if v["model"] == model]
        dd = vs[0]["decode"]
        spec = DecodeSpec(kind=dd["kind"], outputs=dd.get("outputs") or {}, threshold=dd.get("threshold"),
                          classes=dd.get("classes") or [])
        fids = result.settings["fixtures"].get(vs[0]["variant_id"], [])
        boxed = any(d.box is not None for (_, vid, _), d in result.decoded.items() if vid == vs[0]["variant_id"])
        try:
            pl = plan(spec, sidecars.get(model), truth, fids, boxed=boxed)
        except (KeyError, TypeError, ValueError, IndexError) as exc:   # malformed labels: a reason, not a crash
            pl = f"labels not usable ({type(exc).__name__}: {exc})"
        scores = {}
        if isinstance(pl, Plan):
            data = plan_key(pl, truth)
            for v in vs:
                for h in result.hosts:
                    got = {f: result.decoded.get((h, v["variant_id"], f)) for f in pl.fixtures}
                    if any(d is None for d in got.values()):
                        continue
                    try:
                        scores[(v["variant"], h)] = cache.get(score_key(data, got), lambda: score(pl, got, truth))
                    except ValueError as exc:
                        pl = f"boxes cannot be mapped back to the images ({exc})"
                        scores = {}
                        break
                if not isinstance(pl, Plan):
                    break
        diffs = differences(pl, result, vs, result.settings["reference"], scores) if isinstance(pl, Plan) else []
        out[model] = {"plan": pl, "scores": scores, "differences": diffs}
    return out


def report_accuracy(result, root, fixtures=None, images=None, results_dir=None) -> dict:
    """The report's accuracy per model x variant x host (quantbench.analysis.accuracy), from the
    labels the fixtures were built from: `fixtures` (COCO JSON; None: the bundled corpus) and `images`.

    `results_dir`: the scores are kept in its CACHE_FILE and found there again (None: no cache)."""
    ids = sorted({f for fx in result.settings["fixtures"].values() for f in fx})
    try:
        truth = load_truth(ids, root, fixtures, images)
    except UserError as exc:
        return {m: {"plan": f"labels not readable ({exc})", "scores": {}}
                for m in dict.fromkeys(v["model"] for v in result.variants)}
    cache = ScoreCache(Path(results_dir) / CACHE_FILE if results_dir is not None else None)
    out = accuracy_table(result, result.sidecars, truth, cache)
    cache.save()
    return out
