"""Flips against a reference, count concealment, margins, and the two gates."""

import math

import numpy as np
import pytest

from quantbench.analysis.decisions import band_label, compare, concealed, margin_summary, summarize
from quantbench.analysis.decode import DecodeSpec, decode
from quantbench.analysis.gates import TensorGate, disagreement, failures_and_max, parse_gates
from quantbench.errors import UserError


def logit(p):
    return math.log(p / (1 - p))


SPEC = DecodeSpec(kind="detr-sigmoid", outputs={"logits": "l", "boxes": "b"}, threshold=0.4, top_k=100,
                  classes=["bottle", "can", "bag"])


def detr_out(rows):
    """rows: (class, prob, box cxcywh) per query."""
    logits = np.full((1, len(rows), 3), -20.0, np.float32)
    boxes = np.zeros((1, len(rows), 4), np.float32)
    for q, (c, p, box) in enumerate(rows):
        logits[0, q, c] = logit(p)
        boxes[0, q] = box
    return {"l": logits, "b": boxes}


B = (0.5, 0.5, 0.2, 0.2)


def test_equal_totals_conceal_flips():
    # fp32 keeps q0, q1, q2; int8 keeps q0, q2, q3: 3 against 3, but q1 and q3 flipped
    ref = decode(SPEC, detr_out([(0, 0.9, B), (1, 0.41, B), (2, 0.7, B), (0, 0.38, B)]))
    cand = decode(SPEC, detr_out([(0, 0.9, B), (1, 0.39, B), (2, 0.7, B), (0, 0.42, B)]))
    fc = compare(SPEC, ref, cand)
    assert (fc.ref_total, fc.total) == (3, 3)
    assert [(f.kind, f.ref_slot, f.ref_kept, f.kept) for f in fc.flips] == [
        ("threshold", 1, True, False), ("threshold", 3, False, True)]
    s = summarize("own-fp32", "x86", "dynamic", "x86", "fp32", [fc], 0.4)
    assert s.flips == 2 and s.ref_total == s.total == 3 and s.concealed
    assert s.images_disagree == 1
    # fp32 margins: 0.41 - 0.4 and 0.38 - 0.4
    assert s.margins["half_width"] == pytest.approx(0.02, abs=1e-6)
    assert s.margins["band"] == pytest.approx([0.38, 0.41], abs=1e-6)
    assert sum(s.margins["bands"].values()) == 2 and set(s.margins["bands"]) <= {"[0,0.01)", "[0.01,0.02)", "[0.02,0.05)"}


def test_class_flip_and_box_shift():
    ref = decode(SPEC, detr_out([(0, 0.9, B), (1, 0.8, B), (2, 0.1, B)]))
    cand = decode(SPEC, detr_out([(1, 0.9, B), (1, 0.8, (0.6, 0.5, 0.2, 0.2)), (2, 0.1, (0.9, 0.9, 0.1, 0.1))]))
    fc = compare(SPEC, ref, cand)
    kinds = [(f.kind, f.ref_slot) for f in fc.flips]
    # q0 class 0 -> 1; q1 box moved by half its width: IoU = 0.1*0.2 / (0.04+0.04-0.02) = 1/3; q2 not kept anywhere
    assert kinds == [("class", 0), ("box-shift", 1)]
    assert fc.flips[1].iou == pytest.approx(1 / 3, rel=1e-5)
    s = summarize("own-fp32", "pi", "dynamic", "pi", "fp32", [fc], 0.4)
    assert s.by_kind == {"threshold": 0, "class": 1, "box-shift": 1}
    # equal totals (2 vs 2) with flips -> concealed
    assert s.concealed


def test_identical_runs_agree_and_totals_differing_by_two_are_not_concealed():
    ref = decode(SPEC, detr_out([(0, 0.9, B), (1, 0.8, B), (2, 0.7, B)]))
    assert compare(SPEC, ref, ref).flips == []
    cand = decode(SPEC, detr_out([(0, 0.9, B), (1, 0.1, B), (2, 0.1, B)]))
    fc = compare(SPEC, ref, cand)
    assert len(fc.flips) == 2 and (fc.ref_total, fc.total) == (3, 1)
    assert not concealed(3, 1, 2) and concealed(3, 2, 1) and not concealed(3, 3, 0)


def test_classifier_flip():
    spec = DecodeSpec(kind="classifier-softmax", outputs={"logits": "y"}, threshold=None)
    ref = decode(spec, {"y": np.float32([[2.0, 1.9, 0.0]])})
    cand = decode(spec, {"y": np.float32([[1.9, 2.0, 0.0]])})
    fc = compare(spec, ref, cand)
    assert [f.kind for f in fc.flips] == ["class"] and (fc.ref_total, fc.total) == (1, 1)
    p = np.exp([2.0, 1.9, 0.0]) / np.exp([2.0, 1.9, 0.0]).sum()
    assert fc.flips[0].margin == pytest.approx(p[0] - p[1], rel=1e-5)


def test_nms_boxes_matching():
    spec = DecodeSpec(kind="nms-boxes", outputs={"boxes": "b", "scores": "s", "labels": "c"}, threshold=0.5,
                      box_format="xyxy")
    ref = decode(spec, {"b": np.float32([[0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 50, 50], [60, 0, 70, 10]]),
                        "s": np.float32([0.9, 0.8, 0.7, 0.55]), "c": np.int64([1, 2, 3, 1])})
    # candidate: det 0 same; det 1 reordered and shifted (IoU 0.68 -> box shift); det 2 changed class;
    # det 3 fell below the threshold; a new detection appeared
    cand = decode(spec, {"b": np.float32([[21, 21, 31, 31], [0, 0, 10, 10], [40, 40, 50, 50], [60, 0, 70, 10],
                                          [80, 80, 90, 90]]),
                         "s": np.float32([0.8, 0.9, 0.7, 0.45, 0.6]), "c": np.int64([2, 1, 1, 1, 3])})
    fc = compare(spec, ref, cand)
    got = [(f.kind, f.ref_slot, f.slot) for f in fc.flips]
    assert got == [("box-shift", 1, 0), ("class", 2, 2), ("threshold", 3, 3), ("threshold", -1, 4)]
    assert fc.flips[0].iou == pytest.approx(81 / 119, rel=1e-6)
    assert math.isnan(fc.flips[3].margin)
    assert (fc.ref_total, fc.total) == (4, 4)


def test_threshold_map_flipped_pixels_and_regions():
    spec = DecodeSpec(kind="threshold-map", outputs={"map": "p"}, threshold=0.5)
    ref_p = np.zeros((6, 6), np.float32)
    ref_p[0:2, 0:2] = 0.9            # region A (4 px)
    ref_p[4:6, 4:6] = 0.52           # region B (4 px), lost in candidate
    cand_p = ref_p.copy()
    cand_p[4:6, 4:6] = 0.49
    cand_p[0, 2] = 0.6               # A grows by one pixel: IoU 4/5 -> region shift
    cand_p[3, 0] = 0.7               # new region C (1 px); ref value there is 0.0
    ref, cand = decode(spec, {"p": ref_p}), decode(spec, {"p": cand_p})
    fc = compare(spec, ref, cand)
    assert [(f.kind, f.ref_slot, f.slot) for f in fc.flips] == [("box-shift", 0, 0), ("threshold", 1, -1),
                                                               ("threshold", -1, 1)]
    assert fc.flipped_pixels == 4 + 1 + 1
    assert fc.flipped_pixel_regions == 3
    assert fc.flips[1].margin == pytest.approx(0.02, abs=1e-6)
    assert fc.flips[2].margin == pytest.approx(-0.5)


def test_margin_bands():
    assert band_label(0.005) == "[0,0.01)" and band_label(0.3) == "[0.2,0.5)" and band_label(0.7) == "[0.5,inf)"
    m = margin_summary([0.004, -0.03, float("nan")], 0.4)
    assert m["bands"] == {"[0,0.01)": 1, "[0.02,0.05)": 1, "unknown": 1}
    assert m["band"] == pytest.approx([0.37, 0.404]) and m["half_width"] == pytest.approx(0.03)
    assert margin_summary([], 0.4)["band"] is None


def test_tensor_gate_polygraphy_rule():
    ref = np.float32([1.0, 100.0, 0.0, np.nan, np.inf])
    # element 0: |d|=2e-5 > atol but < rtol*|ref|=... 1e-5*1 -> fails both -> fail
    # element 1: |d|=5e-4 > atol, rtol*100 = 1e-3 -> passes (relative)
    # element 2: |d|=5e-6 < atol -> pass; element 3: NaN vs 1 -> fail; element 4: inf vs finite -> fail
    cand = np.float32([1.00002, 100.0005, 5e-6, 1.0, 3.0])
    assert failures_and_max(ref, cand, 1e-5, 1e-5)[0] == 3
    assert failures_and_max(ref, ref.copy(), 1e-5, 1e-5)[0] == 0
    g = TensorGate()
    g.add_fixture({"y": ref[:3]}, {"y": cand[:3]}, 1e-5, 1e-5)
    assert g.failing == 1 and g.fixtures_failing == 1 and not g.passed
    assert disagreement(False, True).startswith("tensor gate blocks")
    assert disagreement(True, False).startswith("tensor gate passes")
    assert disagreement(True, True) == ""
    assert parse_gates("tensor, decision") == ["tensor", "decision"]
    with pytest.raises(UserError, match="unknown gate"):
        parse_gates("tensor,speed")


def yolo_out(dets, n=32):
    """[1, 4+3, n] raw head; dets = [(anchor, cx, cy, w, h, class, prob)]."""
    a = np.zeros((n, 7), np.float32)
    for i, cx, cy, w, h, c, p in dets:
        a[i, :4] = [cx, cy, w, h]
        a[i, 4 + c] = p
    return {"output0": a.T[None]}


def test_yolo_flips_match_like_nms_boxes_and_a_threshold_flip_is_served_on_one_side_only():
    from quantbench.analysis.decode import check_outputs, spec_from_sidecar

    spec = check_outputs(spec_from_sidecar({"classes": ["a", "b", "c"], "decode": {"kind": "yolo"}}), ["output0"])
    ref = decode(spec, yolo_out([(0, 50, 50, 20, 20, 0, 0.9), (1, 150, 50, 20, 20, 1, 0.26),
                                 (2, 250, 50, 20, 20, 1, 0.8), (3, 350, 50, 20, 20, 2, 0.7)]))
    # det 0 moves by a quarter of its width (box shift); det 1 drops to 0.24 at another anchor (threshold
    # flip, matched: the fp32 margin is known); det 2 changes class; det 3 same; a new box appears at 0.3
    cand = decode(spec, yolo_out([(0, 55, 50, 20, 20, 0, 0.9), (9, 150, 50, 20, 20, 1, 0.24),
                                  (2, 250, 50, 20, 20, 2, 0.8), (3, 350, 50, 20, 20, 2, 0.7),
                                  (4, 450, 50, 20, 20, 0, 0.3)]))
    fc = compare(spec, ref, cand)
    got = [(f.kind, f.ref_slot, f.slot) for f in fc.flips]
    assert got == [("box-shift", 0, 0), ("threshold", 1, 9), ("class", 2, 2), ("threshold", -1, 4)]
    assert fc.flips[1].ref_kept and not fc.flips[1].kept
    assert fc.flips[1].margin == pytest.approx(0.01, abs=1e-6)
    assert fc.flips[0].iou == pytest.approx(15 / 25)
    assert math.isnan(fc.flips[3].margin)
    assert (fc.ref_total, fc.total) == (4, 4)
    assert compare(spec, ref, ref).flips == []
