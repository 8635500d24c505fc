"""Accuracy differences between hosts or variants come with a paired bootstrap interval over the images, and a
difference the interval cannot tell from zero names no host as nearer the labels."""

import numpy as np
import pytest

from quantbench.report import accuracysection
from quantbench.analysis.accuracy import accuracy_table, difference_interval, resample_images
from report_helpers import _dec, _truth, hand_result

FIX = [f"f{i:02d}" for i in range(20)]


def _result(correct: dict):
    """hand_result over 20 images labelled cat; `correct[(variant_id, host)]` images decided cat, the rest dog."""
    result = hand_result()
    result.variants = result.variants[:2]
    for v in result.variants:
        v["decode"]["classes"] = ["cat", "dog"]
    result.settings["fixtures"] = {v["variant_id"]: FIX for v in result.variants}
    result.decoded = {(h, vid, f): _dec([0 if i < correct[(vid, h)] else 1])
                      for (vid, h) in correct for i, f in enumerate(FIX)}
    truth = _truth({f: [{"image_id": i, "category_id": 7}] for i, f in enumerate(FIX)}, categories={7: "cat", 8: "dog"})
    return result, truth


def _accuracy_text(result, truth) -> str:
    acc = accuracy_table(result, {}, truth)
    return "\n".join(accuracysection.accuracy_lines(result, acc))


def test_a_difference_of_one_image_is_no_measurable_difference_and_names_no_winner():
    # the old line: "Which platform is nearer the truth: fp32: pi nearer the labels (x86 0.500, pi 0.550)"
    result, truth = _result({("v0", "x86"): 10, ("v0", "pi"): 11, ("v1", "x86"): 10, ("v1", "pi"): 10})
    text = _accuracy_text(result, truth)
    assert "nearer the labels" not in text
    line = next(ln for ln in text.splitlines() if ln.startswith("Between hosts"))
    assert "fp32: pi vs x86 top-1 +0.050 (95% interval [+0.000, +0.150] over 20 images): no measurable difference" in line
    assert "dynamic: pi vs x86 top-1 +0.000 (95% interval [+0.000, +0.000] over 20 images): no measurable difference" in line
    assert _accuracy_text(result, truth) == text                      # fixed seed: the same interval every run


def test_a_clear_difference_says_which_is_nearer_with_its_interval():
    result, truth = _result({("v0", "x86"): 10, ("v0", "pi"): 10, ("v1", "x86"): 0, ("v1", "pi"): 20})
    text = _accuracy_text(result, truth)
    assert "dynamic: pi vs x86 top-1 +1.000 (95% interval [+1.000, +1.000] over 20 images): pi nearer the labels" in text
    fp32_line = next(ln for ln in text.splitlines() if ln.startswith("Against fp32 on the same host"))
    assert "dynamic vs fp32 on x86 top-1 -0.500" in fp32_line and "fp32 nearer the labels" in fp32_line


def paired_interval(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """(mean(a) - mean(b), low, high) over the bootstrap's resamples of the images, the same for both sides."""
    idx = resample_images(len(a))
    return difference_interval(a.mean(), a[idx].mean(axis=-1), b.mean(), b[idx].mean(axis=-1))


def test_paired_interval_is_seeded_and_paired():
    a = np.array([1.0, 0, 1, 1, 0, 1, 0, 1])
    assert paired_interval(a, a) == (0.0, 0.0, 0.0)                  # paired: identical outcomes never differ
    assert paired_interval(a, 1 - a) == paired_interval(a, 1 - a)
    diff, lo, hi = paired_interval(a, np.zeros(8))
    assert diff == 0.625 and lo < diff < hi


def test_ap_differences_are_plain_and_name_no_winner():
    r = hand_result()
    a = {"scores": {("fp32", "x86"): {"value": 0.5604}, ("fp32", "pi"): {"value": 0.5601}}, "differences": []}
    lines = accuracysection.difference_lines(r, a, ["fp32"], ["x86", "pi"])
    assert lines[0] == "Between hosts: fp32: pi vs x86 -0.0003 (AP is not a mean over images: no interval)."


def test_text_differences_carry_exact_match_and_cer_intervals():
    from quantbench.analysis.accuracy import FixtureTruth, Truth
    from quantbench.analysis.decode import Decoded

    def said(text):
        return Decoded(slot=np.zeros(1, np.int64), cls=np.zeros(1, np.int64), score=np.ones(1), kept=np.ones(1, bool),
                       margin=np.ones(1), text=[text])

    result = hand_result()
    result.variants = result.variants[:2]
    for v in result.variants:
        v["decode"] = {"kind": "ctc", "threshold": None, "classes": [], "outputs": {}}
    result.settings["fixtures"] = {v["variant_id"]: FIX for v in result.variants}
    result.decoded = {(h, vid, f): said("EXIT" if vid == "v0" else "") for h in ("x86", "pi") for vid in ("v0", "v1")
                      for f in FIX}
    truth = Truth(fixtures={f: FixtureTruth(fixture_id=f, source=f"{f}.png", image_sha256="", annotations=[],
                                            stratum="", split="eval", preprocess={}, text="EXIT") for f in FIX},
                  categories={})
    text = _accuracy_text(result, truth)
    assert "| fp32 | 1.000 (20/20), CER 0.000 | 1.000 (20/20), CER 0.000 |" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("Against fp32 on the same host"))
    assert ("dynamic vs fp32 on x86 exact match -1.000 (95% interval [-1.000, -1.000] over 20 images): "
            "fp32 nearer the labels") in line
    assert ("dynamic vs fp32 on x86 CER +1.000 (95% interval [+1.000, +1.000] over 20 images): "
            "fp32 nearer the labels") in line


def _random_detections(seed: int, images: int = 12):
    """A detector's decisions over `images` images: hits and near-misses of the labelled boxes, stray boxes,
    classes without labels, more than 100 detections on some images; scores without ties."""
    rng = np.random.default_rng(seed)
    gt, dets = {}, {}
    for i in range(images):
        corner = rng.uniform(0, 200, (int(rng.integers(0, 5)), 2))
        gt[i] = np.column_stack([corner, corner + rng.uniform(5, 100, corner.shape), rng.integers(1, 4, len(corner))])
        stray = rng.uniform(0, 300, (int(rng.integers(0, 125)), 2))
        boxes = np.vstack([gt[i][:, :4] + rng.normal(0, 3, (len(corner), 4)),
                           np.column_stack([stray, stray + rng.uniform(2, 150, stray.shape)])])
        cls = np.concatenate([gt[i][:, 4], rng.integers(1, 5, len(stray))])
        dets[i] = np.column_stack([boxes, rng.random(len(boxes)), cls])
    return dets, gt


def test_ap_recomputed_from_one_matching_is_coco_ap_on_every_weighting_of_the_images():
    from quantbench.analysis import metrics

    for seed in (0, 7):
        dets, gt = _random_detections(seed)
        m = metrics.coco_matches(dets, gt)
        ap = metrics.coco_ap(dets, gt)
        assert (m["ap"]["ap50"], m["ap"]["ap50_95"]) == (ap["ap50"], ap["ap50_95"])
        counts = np.random.default_rng(seed).integers(0, 3, (3, len(gt))).astype(np.float64)
        ap50, ap5095 = metrics.weighted_ap(m, np.vstack([np.ones(len(gt)), counts]))
        assert (ap50[0], ap5095[0]) == (pytest.approx(ap["ap50"], rel=1e-12), pytest.approx(ap["ap50_95"], rel=1e-12))
        for r, w in enumerate(counts, 1):   # an image drawn twice is that image twice, under another id
            copies = [(i, c) for i in sorted(gt) for c in range(int(w[i]))]
            want = metrics.coco_ap({x: dets[x[0]] for x in copies}, {x: gt[x[0]] for x in copies})
            assert (ap50[r], ap5095[r]) == (pytest.approx(want["ap50"], rel=1e-12),
                                            pytest.approx(want["ap50_95"], rel=1e-12))


def _detector_result(box_of: dict):
    """hand_result as a detr-sigmoid detector over 20 images of one labelled cat; `box_of[(variant_id, host)]`
    (image index -> normalised box) decides each run's single cat detection."""
    from report_helpers import _truth

    result = hand_result()
    result.variants = result.variants[:2]
    for v in result.variants:
        v["decode"] = {"kind": "detr-sigmoid", "threshold": 0.5, "classes": ["cat"], "outputs": {}}
    result.settings["fixtures"] = {v["variant_id"]: FIX for v in result.variants}
    result.decoded = {(h, vid, f): _dec([0], score=[0.9 - i / 100], box=[box(i)])
                      for (vid, h), box in box_of.items() for i, f in enumerate(FIX)}
    # image 200 x 100 stretched into 100 x 50; the cat at [20, 10, 60, 30] pixels = [0.1, 0.1, 0.3, 0.3] normalised
    truth = _truth({f: [{"image_id": i, "category_id": 7, "bbox": [20, 10, 40, 20]}] for i, f in enumerate(FIX)},
                   categories={7: "cat"})
    return result, truth


def test_ap_differences_carry_a_paired_bootstrap_interval():
    exact = lambda i: [0.1, 0.1, 0.3, 0.3]                         # noqa: E731
    missed_half = lambda i: [0.1, 0.1, 0.3, 0.3] if i % 2 else [0.6, 0.6, 0.8, 0.8]   # noqa: E731
    result, truth = _detector_result({("v0", "x86"): exact, ("v0", "pi"): exact,
                                      ("v1", "x86"): exact, ("v1", "pi"): missed_half})
    text = _accuracy_text(result, truth)
    line = next(ln for ln in text.splitlines() if ln.startswith("Between hosts"))
    assert "fp32: pi vs x86 AP50 +0.000 (95% interval [+0.000, +0.000] over 20 images): no measurable difference" in line
    # half the cats missed, the misses ranked first: AP 0.252 against 1.000
    assert "dynamic: pi vs x86 AP50 -0.748 (95% interval [-0.908, -0.413] over 20 images): x86 nearer the labels" in line
    assert "dynamic: pi vs x86 AP50:95 -0.748 (95% interval" in line
    acc = accuracy_table(result, {}, truth)["m"]
    d = next(d for d in acc["differences"] if d["a"] == ("dynamic", "pi") and d["b"] == ("dynamic", "x86")
             and d["figure"] == "AP50")
    scores = acc["scores"]
    assert d["diff"] == scores[("dynamic", "pi")]["value"] - scores[("dynamic", "x86")]["value"]   # coco_ap's
    assert d["low"] < d["diff"] < d["high"] < 0
    assert _accuracy_text(result, truth) == text                      # fixed seed: the same interval every run
