"""Each decoder against hand-computed expectations, and the decode-kind checks."""

import math

import numpy as np
import pytest

from quantbench.analysis.decode import (DecodeSpec, check_outputs, cxcywh_to_xyxy, decode, iou, label_regions,
                                        spec_from_sidecar)
from quantbench.errors import ParameterError, UserError


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


def test_a_classifier_with_fewer_class_names_than_logits_is_refused():
    """8 logits and a 2-name 'classes' list: the top-1 was taken over the first 2 logits alone (another decision
    than the model's, without a word); now one error naming the output and both counts."""
    logits = np.arange(8, dtype=np.float32)[None, :]
    spec = DecodeSpec(kind="classifier-softmax", outputs={"logits": "logits"}, threshold=None, classes=["a", "b"])
    with pytest.raises(ParameterError) as exc:
        decode(spec, {"logits": logits})
    assert str(exc.value) == ("decode='classifier-softmax': output 'logits' has 8 classes; the sidecar's 'classes' "
                              "names 2: name one class per output column")


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
        spec_from_sidecar(side, kind="yolo9000")
    # no --decode and no decode block: no decisions, but not an error (classes still compare)
    none = spec_from_sidecar({}, source="model m sidecar")
    assert none.kind == "none" and "no decode block" in none.note
    assert spec_from_sidecar(side, kind="none").kind == "none"
    # threshold-map on a single-output model takes that output
    m = check_outputs(spec_from_sidecar(None, kind="threshold-map"), ["seg"])
    assert m.outputs == {"map": "seg"}


# --- yolo raw heads (third-party detectors) ------------------------------------------------------------------


def yolo_head(dets, n=8, n_cls=3, channels_first=True, objectness=None):
    """A raw Ultralytics head: dets = [(anchor, cx, cy, w, h, class, prob)], every other anchor empty."""
    obj = objectness is not None
    a = np.zeros((n, 4 + obj + n_cls), np.float32)
    for k, (i, cx, cy, w, h, c, p) in enumerate(dets):
        a[i, :4] = [cx, cy, w, h]
        if obj:
            a[i, 4] = objectness[k]
        a[i, 4 + obj + c] = p
    return (a.T if channels_first else a)[None]


def test_yolov8_raw_head_decodes_instead_of_failing_the_nms_boxes_shape_check():
    out = yolo_head([(2, 50, 50, 20, 20, 1, 0.9)])
    side = {"classes": ["a", "b", "c"], "decode": {"kind": "nms-boxes", "boxes": "output0", "scores": "output0",
                                                   "labels": "output0"}}
    with pytest.raises(UserError, match="expected 1 dims"):
        decode(check_outputs(spec_from_sidecar(side), ["output0"]), {"output0": out})
    side["decode"] = {"kind": "yolo", "output": "output0"}
    spec = check_outputs(spec_from_sidecar(side), ["output0"])
    d = decode(spec, {"output0": out})
    assert d.total == 1 and d.cls.tolist() == [1] and d.slot.tolist() == [2]
    np.testing.assert_allclose(d.box[0], [40, 40, 60, 60])


YOLO_SIDE = {"classes": ["a", "b", "c"], "decode": {"kind": "yolo", "output": "output0"}}


def yolo_decode(out, side=YOLO_SIDE, **kw):
    spec = check_outputs(spec_from_sidecar(side, **kw), ["output0"])
    return decode(spec, {"output0": out})


def test_yolo_layouts_agree_and_boxes_are_xyxy_pixels():
    dets = [(1, 100, 60, 40, 20, 0, 0.8), (5, 10, 10, 4, 4, 2, 0.3)]
    first = yolo_decode(yolo_head(dets, n=16))
    last = yolo_decode(yolo_head(dets, n=16, channels_first=False))
    for d in (first, last):
        assert d.slot.tolist() == [1, 5] and d.cls.tolist() == [0, 2] and d.kept.tolist() == [True, True]
        np.testing.assert_allclose(d.box, [[80, 50, 120, 70], [8, 8, 12, 12]])
        np.testing.assert_allclose(d.score, [0.8, 0.3], rtol=1e-6)
        np.testing.assert_allclose(d.margin, [0.8 - 0.25, 0.3 - 0.25], rtol=1e-5)
    # without classes the smaller axis holds the channels
    assert yolo_decode(yolo_head(dets, n=16), side={"decode": {"kind": "yolo"}}).slot.tolist() == [1, 5]
    # an explicit layout wins
    side = {"classes": ["a", "b", "c"], "decode": {"kind": "yolo", "layout": "channels-last"}}
    assert yolo_decode(yolo_head(dets, n=16, channels_first=False), side=side).slot.tolist() == [1, 5]


def test_yolo_class_aware_nms_ties_and_max_det():
    # anchors 0 and 1: same class, IoU 0.6 -> 1 suppressed; anchor 2: same place, other class -> kept;
    # anchors 3 and 4: identical boxes and scores (a tie) -> the lower index survives
    dets = [(0, 50, 50, 20, 20, 0, 0.9), (1, 54, 50, 20, 20, 0, 0.8), (2, 50, 50, 20, 20, 1, 0.7),
            (3, 200, 200, 10, 10, 2, 0.6), (4, 200, 200, 10, 10, 2, 0.6)]
    d = yolo_decode(yolo_head(dets, n=16))
    assert iou(np.array([40, 40, 60, 60.]), np.array([44, 40, 64, 60.])) == pytest.approx(16 / 24)
    assert d.slot.tolist() == [0, 2, 3] and d.cls.tolist() == [0, 1, 2]
    # suppression is IoU > iou: two 20x20 boxes 10 px apart overlap by exactly 1/3
    pair = yolo_head([(0, 10, 10, 20, 20, 0, 0.9), (6, 20, 10, 20, 20, 0, 0.5)], n=16)
    at = {"classes": ["a", "b", "c"], "decode": {"kind": "yolo", "iou": 1 / 3}}
    assert yolo_decode(pair, side=at).slot.tolist() == [0, 6]
    at["decode"]["iou"] = 0.33
    assert yolo_decode(pair, side=at).slot.tolist() == [0]
    capped = yolo_decode(yolo_head(dets, n=16), side={"classes": ["a", "b", "c"],
                                                      "decode": {"kind": "yolo", "max_det": 2}})
    assert capped.slot.tolist() == [0, 2]


def test_yolo_candidates_below_the_threshold_are_decisions_not_served():
    # 0.2 is a candidate (>= 0.25 * 0.5) but not served; 0.1 is not a candidate
    dets = [(0, 50, 50, 20, 20, 0, 0.9), (1, 150, 50, 20, 20, 1, 0.2), (2, 250, 50, 20, 20, 1, 0.1)]
    d = yolo_decode(yolo_head(dets, n=16))
    assert d.slot.tolist() == [0, 1] and d.kept.tolist() == [True, False] and d.total == 1
    assert d.margin[1] == pytest.approx(-0.05, abs=1e-6)
    # --threshold overrides the sidecar; the candidate floor follows it unless the sidecar sets pre_threshold
    d = yolo_decode(yolo_head(dets, n=16), threshold=0.15)
    assert d.slot.tolist() == [0, 1, 2] and d.kept.tolist() == [True, True, False]
    side = {"classes": ["a", "b", "c"], "decode": {"kind": "yolo", "threshold": 0.5, "pre_threshold": 0.5, "iou": 0.7}}
    spec = spec_from_sidecar(side)
    assert (spec.threshold, spec.candidate_threshold, spec.iou, spec.max_det) == (0.5, 0.5, 0.7, 300)
    assert yolo_decode(yolo_head(dets, n=16), side=side).slot.tolist() == [0]
    assert spec.as_dict()["pre_threshold"] == 0.5 and spec.as_dict()["iou"] == 0.7


def test_yolov5_objectness_multiplies_the_class_prob():
    dets = [(0, 50, 50, 20, 20, 1, 0.8), (3, 150, 50, 20, 20, 2, 0.9)]
    out = yolo_head(dets, n=16, channels_first=False, objectness=[0.5, 0.2])   # [1, 16, 5+3]
    d = yolo_decode(out)
    assert d.slot.tolist() == [0, 3] and d.cls.tolist() == [1, 2] and d.kept.tolist() == [True, False]
    np.testing.assert_allclose(d.score, [0.4, 0.18], rtol=1e-6)   # 0.5 * 0.8 served; 0.2 * 0.9 a candidate
    side = {"classes": ["a", "b", "c"], "decode": {"kind": "yolo", "pre_threshold": 0.2}}
    assert yolo_decode(out, side=side).slot.tolist() == [0]


def test_yolo_spec_errors_are_one_line_and_say_what_to_set():
    square = np.zeros((1, 7, 7), np.float32)
    with pytest.raises(UserError, match="cannot tell channels from boxes; set 'layout'"):
        yolo_decode(square, side={"decode": {"kind": "yolo"}})
    with pytest.raises(UserError, match="neither axis has 7 or 8 channels"):
        yolo_decode(np.zeros((1, 22, 30), np.float32))
    for key, value, msg in (("iou", 0, "'iou'"), ("max_det", 0, "'max_det'"), ("layout", "nchw", "'layout'"),
                            ("objectness", "yes", "'objectness'"), ("pre_threshold", 0.9, "above the threshold")):
        with pytest.raises(UserError, match=msg) as e:
            spec_from_sidecar({"decode": {"kind": "yolo", key: value}}, source="m.json")
        assert "\n" not in str(e.value) and "m.json" in str(e.value)
    # a single-output model gets its output whatever the name
    spec = check_outputs(spec_from_sidecar({"decode": {"kind": "yolo"}}), ["out"])
    assert spec.outputs == {"output": "out"}


@pytest.mark.slow
def test_yolo_on_a_real_yolov8n_head():
    """The nudenet wheel's YOLOv8n (fetched and SHA-256-checked as the acceptance suite does)."""
    import onnxruntime as ort

    import real_models as R
    from setup_required import missing_setup

    try:
        model = R.fetch(R.NUDENET)
    except R.FetchError as exc:
        missing_setup(f"nudenet download failed: {exc}")
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).random((1, 3, 320, 320), dtype=np.float32)
    [out] = sess.run(None, {sess.get_inputs()[0].name: x})
    assert out.shape[:2] == (1, 22)
    d = yolo_decode(out, side={"classes": [str(i) for i in range(18)], "decode": {"kind": "yolo", "threshold": 0.01}})
    assert d.slot.size <= 300 and np.all(np.diff(d.score) <= 0)
    assert np.all((d.box[:, 2] >= d.box[:, 0]) & (d.box[:, 3] >= d.box[:, 1]))


def test_single_output_classifier_uses_its_only_output_unless_the_sidecar_names_another():
    """A real classifier's output is rarely called 'logits' (Paddle: 'fetch_name_0')."""
    spec = check_outputs(spec_from_sidecar({"decode": {"kind": "classifier-softmax"}}), ["fetch_name_0"])
    assert spec.outputs == {"logits": "fetch_name_0"}
    named = spec_from_sidecar({"decode": {"kind": "classifier-softmax", "logits": "probs"}})
    with pytest.raises(UserError, match="expects outputs logits='probs'"):
        check_outputs(named, ["fetch_name_0"])
