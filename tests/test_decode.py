"""Each decoder against hand-computed expectations, and the decode-kind checks."""

import math

import numpy as np
import pytest

from quantbench.analysis.decode import (DecodeSpec, check_outputs, decode, iou, label_regions,
                                        spec_from_sidecar)
from quantbench.errors import UserError


def logit(p):
    return math.log(p / (1 - p))


def detr_spec(**kw):
    base = dict(kind="detr-sigmoid", outputs={"logits": "pred_logits", "boxes": "pred_boxes"},
                threshold=0.4, top_k=100, classes=["bottle", "can"])
    base.update(kw)
    return DecodeSpec(**base)


def test_detr_sigmoid_argmax_threshold_topk():
    # 4 queries, 2 named classes + 1 extra column the sidecar does not name (ignored)
    logits = np.array([[
        [logit(0.9), logit(0.2), 50.0],    # q0: class 0, 0.9 kept
        [logit(0.1), logit(0.4), 50.0],    # q1: class 1, exactly 0.4 -> kept (>=)
        [logit(0.39), logit(0.3), 50.0],   # q2: class 0, 0.39 -> dropped
        [logit(0.2), logit(0.7), 50.0],    # q3: class 1, 0.7 kept
    ]], dtype=np.float32)
    boxes = np.array([[[0.5, 0.5, 0.2, 0.4]] * 4], dtype=np.float32)
    d = decode(detr_spec(), {"pred_logits": logits, "pred_boxes": boxes})
    assert d.cls.tolist() == [0, 1, 0, 1]
    np.testing.assert_allclose(d.score, [0.9, 0.4, 0.39, 0.7], rtol=1e-6)
    assert d.kept.tolist() == [True, True, False, True]
    assert d.total == 3
    np.testing.assert_allclose(d.box[0], [0.4, 0.3, 0.6, 0.7], rtol=1e-6)   # cxcywh -> xyxy
    np.testing.assert_allclose(d.margin, np.array([0.9, 0.4, 0.39, 0.7]) - 0.4, atol=1e-6)
    # the demo sidecar's "cxcywh-normalized" is the same layout
    dn = decode(detr_spec(box_format="cxcywh-normalized"), {"pred_logits": logits, "pred_boxes": boxes})
    np.testing.assert_allclose(dn.box, d.box)
    # top-2: only the two best queries can be kept (q0 0.9, q3 0.7)
    d2 = decode(detr_spec(top_k=2), {"pred_logits": logits, "pred_boxes": boxes})
    assert d2.kept.tolist() == [True, False, False, True]


def test_classifier_softmax_top1_and_threshold():
    logits = np.log(np.array([[0.2, 0.5, 0.3]], dtype=np.float64)).astype(np.float32)
    spec = DecodeSpec(kind="classifier-softmax", outputs={"logits": "logits"}, threshold=None, classes=["a", "b", "c"])
    d = decode(spec, {"logits": logits})
    assert d.cls.tolist() == [1] and d.kept.tolist() == [True]
    assert d.score[0] == pytest.approx(0.5, rel=1e-6)
    assert d.margin[0] == pytest.approx(0.2, rel=1e-5)       # top-1 minus top-2 without a threshold
    spec.threshold = 0.6
    d = decode(spec, {"logits": logits})
    assert d.kept.tolist() == [False] and d.margin[0] == pytest.approx(-0.1, rel=1e-5)


def test_label_regions_four_connectivity():
    m = np.array([
        [1, 1, 0, 0, 1],
        [0, 1, 0, 1, 1],
        [0, 0, 1, 0, 0],   # diagonal neighbour of (1,1) and (1,3): separate region under 4-connectivity
        [1, 0, 1, 1, 1],
    ], dtype=bool)
    labels, n = label_regions(m)
    assert n == 4
    assert labels.tolist() == [
        [1, 1, 0, 0, 2],
        [0, 1, 0, 2, 2],
        [0, 0, 3, 0, 0],
        [4, 0, 3, 3, 3],
    ]
    # a U shape joins through its bottom row (union of runs seen earlier as separate)
    u = np.array([[1, 0, 1], [1, 0, 1], [1, 1, 1]], dtype=bool)
    lu, nu = label_regions(u)
    assert nu == 1 and set(lu[u].tolist()) == {1}


def test_threshold_map_regions():
    p = np.zeros((1, 1, 4, 5), np.float32)
    p[0, 0, 0, 0:2] = [0.6, 0.9]
    p[0, 0, 3, 3:5] = [0.55, 0.5]
    spec = DecodeSpec(kind="threshold-map", outputs={"map": "prob"}, threshold=0.5)
    d = decode(spec, {"prob": p})
    assert d.total == 2
    np.testing.assert_allclose(d.score, [0.9, 0.55], rtol=1e-6)
    assert int(d.mask.sum()) == 4


def test_nms_boxes_decoder():
    spec = DecodeSpec(kind="nms-boxes", outputs={"boxes": "boxes", "scores": "scores", "labels": "labels"},
                      threshold=0.5, box_format="xyxy")
    out = {"boxes": np.array([[0, 0, 10, 10], [5, 5, 15, 15]], np.float32),
           "scores": np.array([0.8, 0.3], np.float32), "labels": np.array([2, 1], np.int64)}
    d = decode(spec, out)
    assert d.kept.tolist() == [True, False] and d.cls.tolist() == [2, 1]


def test_iou_hand_values():
    assert iou(np.array([0, 0, 10, 10.]), np.array([5, 0, 15, 10.])) == pytest.approx(50 / 150)
    assert iou(np.array([0, 0, 0, 0.]), np.array([0, 0, 0, 0.])) == 1.0
    assert iou(np.array([0, 0, 1, 1.]), np.array([2, 2, 3, 3.])) == 0.0


def test_spec_from_sidecar_and_mismatch_names_outputs():
    side = {"classes": ["bottle", "can"], "decode": {"kind": "detr-sigmoid", "logits": "pred_logits",
                                                     "boxes": "pred_boxes", "threshold": 0.4, "top_k": 100}}
    s = spec_from_sidecar(side)
    assert (s.kind, s.threshold, s.top_k, s.outputs["logits"]) == ("detr-sigmoid", 0.4, 100, "pred_logits")
    assert spec_from_sidecar(side, threshold=0.3).threshold == 0.3
    with pytest.raises(UserError) as e:
        check_outputs(s, ["logits"])
    assert "pred_logits" in str(e.value) and "'logits'" in str(e.value)
    c = spec_from_sidecar({"decode": {"kind": "classifier-softmax", "logits": "logits", "threshold": None}})
    assert c.threshold is None
    with pytest.raises(UserError, match="unknown decode kind"):
        spec_from_sidecar(side, kind="yolo")
    with pytest.raises(UserError, match="no decode kind"):
        spec_from_sidecar({})
    # threshold-map on a single-output model takes that output
    m = check_outputs(spec_from_sidecar(None, kind="threshold-map"), ["seg"])
    assert m.outputs == {"map": "seg"}
