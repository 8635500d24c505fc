"""The bundled detector litter-detr-tiny really detects, and quantbench.analysis.metrics counts right.

The model tests run the committed ONNX in a real onnxruntime session over the whole
eval split and hold it to the figures its sidecar (and docs/demo.md) report.
"""

import json

import numpy as np
import pytest

from quantbench.analysis import metrics
from quantbench.inputs.assets import CORPUS_IMAGES, CORPUS_LABELS, MODELS_DIR
from quantbench.inputs.sidecarfile import load_sidecar
from quantbench.inputs.fixtures import build_fixtures, load_coco
from quantbench.inputs.preprocess import input_spec

MODEL = MODELS_DIR / "litter-detr-tiny.onnx"
MARGIN = 0.02  # a threshold decision may move under another CPU's float rounding


@pytest.fixture(scope="module")
def sidecar():
    return load_sidecar(MODEL)


@pytest.fixture(scope="module")
def eval_run(sidecar):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(MODEL), so, providers=["CPUExecutionProvider"])
    coco = load_coco(CORPUS_LABELS, CORPUS_IMAGES)
    ids = {im["file_name"]: im["id"] for im in coco["images"]}
    spec = input_spec(sidecar)
    fixtures = build_fixtures(spec, split="eval")
    dec = sidecar["decode"]
    raw, dets_all, dets_served = {}, {}, {}
    for fx in fixtures:
        logits, boxes = sess.run([dec["logits"], dec["boxes"]], {spec["name"]: fx.array})
        image_id = ids[fx.source]
        raw[image_id] = (logits, boxes)
        dets_all[image_id] = metrics.decode_detr(logits[0], boxes[0], 0.0, dec["top_k"], (128, 128))
        dets_served[image_id] = metrics.decode_detr(logits[0], boxes[0], dec["threshold"], dec["top_k"], (128, 128))
    gt = metrics.ground_truth(coco, "eval")
    return {"raw": raw, "all": dets_all, "served": dets_served, "gt": gt, "coco": coco}


def test_eval_split_is_large_enough(eval_run):
    assert len(eval_run["gt"]) >= 30
    assert sum(len(g) for g in eval_run["gt"].values()) >= 30


def test_precision_and_recall_match_the_reported_figures(eval_run, sidecar):
    thr = sidecar["decode"]["threshold"]
    pr = metrics.precision_recall(eval_run["served"], eval_run["gt"], thr)
    reported = sidecar["metrics"]
    assert pr["recall"] >= reported[f"eval_recall_at_{thr}"] - MARGIN, pr
    assert pr["precision"] >= reported[f"eval_precision_at_{thr}"] - MARGIN, pr
    assert pr["tp"] > 0, pr  # it serves real detections at the recommended threshold


def test_ap50_is_acceptable_and_as_reported(eval_run, sidecar):
    ap = metrics.coco_ap(eval_run["all"], eval_run["gt"])
    assert ap["ap50"] >= 0.3, ap
    assert abs(ap["ap50"] - sidecar["metrics"]["eval_ap50"]) <= 0.01, ap
    assert sidecar["metrics"]["eval_images"] == len(eval_run["gt"])


def test_outputs_are_raw_logits_and_normalised_boxes(eval_run):
    logits, boxes = next(iter(eval_run["raw"].values()))
    assert logits.dtype == np.float32 and boxes.dtype == np.float32
    assert logits.min() < 0.0  # raw logits, not probabilities
    assert boxes.min() >= 0.0 and boxes.max() <= 1.0


def test_graph_is_a_detr(sidecar):
    import onnx

    assert MODEL.stat().st_size <= 5 * 1024 * 1024
    model = onnx.load(str(MODEL))
    ops = {n.op_type for n in model.graph.node}
    assert {"Conv", "MatMul", "Softmax"} <= ops
    assert "LayerNormalization" in ops or {"ReduceMean", "Sqrt", "Div"} <= ops
    assert ops & {"Relu", "Gelu"}
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17
    shapes = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output}
    q = shapes["pred_logits"][1]
    assert q >= 30
    assert shapes["pred_logits"] == [1, q, len(sidecar["classes"])]
    assert shapes["pred_boxes"] == [1, q, 4]
    assert [i.name for i in model.graph.input] == [sidecar["input"]["name"]]


def test_sidecar_describes_model_and_corpus(sidecar):
    coco = json.loads(CORPUS_LABELS.read_text())
    cats = [c["name"] for c in sorted(coco["categories"], key=lambda c: c["id"])]
    assert sidecar["classes"] == cats
    assert sidecar["input"]["shape"] == [1, 3, 128, 128]
    assert sidecar["decode"]["kind"] == "detr-sigmoid"
    assert sidecar["decode"]["threshold"] == 0.4 and sidecar["decode"]["top_k"] == 100
    # trained on exactly the bundled corpus
    assert sidecar["training"]["corpus_sha256"] == metrics.corpus_sha256(CORPUS_LABELS, CORPUS_IMAGES)


# ---------------------------------------------------------------- metrics on hand-made boxes

GT = {1: np.array([[10, 10, 30, 30, 1], [50, 50, 90, 80, 2]], float),
      2: np.array([[0, 0, 20, 40, 1]], float),
      3: np.zeros((0, 5))}


def perfect():
    return {i: np.array([[*g[:4], 0.9, g[4]] for g in gts]).reshape(-1, 6) for i, gts in GT.items()}


def test_perfect_detections_score_one():
    assert metrics.coco_ap(perfect(), GT)["ap50"] == pytest.approx(1.0)
    pr = metrics.precision_recall(perfect(), GT, 0.4)
    assert (pr["precision"], pr["recall"], pr["fp"], pr["fn"]) == (1.0, 1.0, 0, 0)


def test_false_positive_lowers_precision_and_ap_when_ranked_first():
    dets = perfect()
    dets[3] = np.array([[5, 5, 25, 25, 0.95, 1]])  # on the empty image, most confident
    pr = metrics.precision_recall(dets, GT, 0.4)
    assert pr["precision"] == pytest.approx(3 / 4) and pr["recall"] == 1.0
    ap = metrics.coco_ap(dets, GT)
    # class 1: FP first, then 2 TPs -> precision envelope 2/3 over all recall
    assert ap["per_class"][1] == pytest.approx(2 / 3)
    assert ap["per_class"][2] == pytest.approx(1.0)
    # the same FP below the threshold changes nothing at the threshold, and ranked
    # last it leaves AP at 1.0
    dets[3][0, 4] = 0.3
    assert metrics.precision_recall(dets, GT, 0.4)["precision"] == 1.0
    assert metrics.coco_ap(dets, GT)["ap50"] == pytest.approx(1.0)


def test_duplicate_wrong_class_and_poor_overlap_are_false_positives():
    dets = perfect()
    dets[1] = np.vstack([dets[1], [10, 10, 30, 30, 0.8, 1]])  # duplicate
    dets[2] = np.array([[0, 0, 20, 40, 0.9, 2]])  # wrong class
    pr = metrics.precision_recall(dets, GT, 0.4)
    assert (pr["tp"], pr["fp"], pr["fn"]) == (2, 2, 1)
    shifted = {2: np.array([[12, 0, 32, 40, 0.9, 1]])}  # IoU 8*40/(2*800-320) = 0.25
    assert metrics.precision_recall(shifted, {2: GT[2]}, 0.4)["tp"] == 0
    ok = {2: np.array([[4, 0, 24, 40, 0.9, 1]])}  # IoU 16/24 = 0.667
    assert metrics.precision_recall(ok, {2: GT[2]}, 0.4)["tp"] == 1


def test_missed_object_halves_recall_and_ap():
    dets = perfect()
    dets[2] = np.zeros((0, 6))
    dets[1] = dets[1][1:]  # keep only the class-2 box
    pr = metrics.precision_recall(dets, GT, 0.4)
    assert pr["recall"] == pytest.approx(1 / 3) and pr["precision"] == 1.0
    ap = metrics.coco_ap(dets, GT)
    assert ap["per_class"] == pytest.approx({1: 0.0, 2: 1.0}) and ap["ap50"] == pytest.approx(0.5)


def test_coco_evaluator_ap50_and_ap50_95_on_a_known_case():
    # one box per image, both right class; IoU 1.0 and IoU 0.6 (a 40x20 box shifted by 5 px... see below)
    gt = {1: np.array([[0, 0, 40, 20, 1]], float), 2: np.array([[0, 0, 40, 20, 1]], float)}
    exact = np.array([[0, 0, 40, 20, 0.9, 1]], float)
    shifted = np.array([[10, 0, 50, 20, 0.8, 1]], float)     # IoU 30/50 = 0.6: a match at 0.50..0.60 only
    ap = metrics.coco_ap({1: exact, 2: shifted}, gt)
    assert ap["ap50"] == pytest.approx(1.0)
    # IoU thresholds 0.50, 0.55, 0.60 find both boxes (AP 1); 0.65..0.95 only the exact one, ranked first: the
    # precision envelope is 1 up to recall 0.5, 0 beyond: 51 of 101 recall points -> 51/101
    assert ap["ap50_95"] == pytest.approx((3 * 1.0 + 7 * 51 / 101) / 10)
    assert metrics.coco_ap({}, gt)["ap50"] == 0.0
    assert metrics.coco_ap({1: exact}, {1: np.zeros((0, 5))})["ap50"] is None


def test_box_iou():
    iou = metrics.box_iou(np.array([[0, 0, 10, 10]]), np.array([[0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 30, 30]]))
    assert iou[0].tolist() == pytest.approx([1.0, 1 / 3, 0.0])


def test_decode_detr_threshold_topk_and_boxes():
    logits = np.array([[-5.0, 2.0], [0.0, -1.0], [3.0, -3.0], [-4.0, -4.0]])
    boxes = np.array([[0.5, 0.5, 0.2, 0.4], [0.1, 0.1, 0.1, 0.1], [0.25, 0.75, 0.5, 0.5], [0.5, 0.5, 1, 1]])
    d = metrics.decode_detr(logits[None], boxes[None], 0.4, 100, (100, 200))
    # query 2 (p=.953, class 1), query 0 (p=.881, class 2), query 1 (p=.5, class 1); query 3 dropped
    assert d[:, 5].tolist() == [1, 2, 1]
    assert d[0, :4].tolist() == pytest.approx([0, 100, 50, 200])
    assert d[1, :4].tolist() == pytest.approx([40, 60, 60, 140])
    assert d[:, 4].tolist() == pytest.approx([1 / (1 + np.exp(-3)), 1 / (1 + np.exp(-2)), 0.5])
    assert len(metrics.decode_detr(logits, boxes, 0.4, 2, (100, 200))) == 2
    assert metrics.decode_detr(logits, boxes, 0.99, 100, (100, 200)).shape == (0, 6)


def test_ground_truth_from_coco_keeps_empty_images():
    coco = {"images": [{"id": 1, "split": "eval"}, {"id": 2, "split": "eval"}, {"id": 3, "split": "train"}],
            "annotations": [{"image_id": 1, "category_id": 4, "bbox": [1, 2, 3, 4]},
                            {"image_id": 3, "category_id": 1, "bbox": [0, 0, 1, 1]}]}
    gt = metrics.ground_truth(coco, "eval")
    assert sorted(gt) == [1, 2]
    assert gt[1].tolist() == [[1, 2, 4, 6, 4]] and gt[2].shape == (0, 5)


def test_corpus_sha256_follows_labels_and_pixels(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.png").write_bytes(b"one")
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.png"}]}))
    h1 = metrics.corpus_sha256(labels)
    assert h1 == metrics.corpus_sha256(labels, tmp_path / "images")
    (tmp_path / "images" / "a.png").write_bytes(b"two")
    h2 = metrics.corpus_sha256(labels)
    labels.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.png", "split": "eval"}]}))
    assert len({h1, h2, metrics.corpus_sha256(labels)}) == 3


def test_readme_reports_the_sidecar_figures(sidecar):
    readme = (MODELS_DIR.parents[2] / "docs" / "demo.md").read_text()
    section = readme.split("<!-- section:demo-detector -->")[1].split("<!-- /section:demo-detector -->")[0]
    m = sidecar["metrics"]
    thr = sidecar["decode"]["threshold"]
    row = f"| {m['eval_ap50']:.3f} | {m[f'eval_precision_at_{thr}']:.3f} | {m[f'eval_recall_at_{thr}']:.3f} |"
    assert row in section, row
    assert f"[1,{sidecar['training']['queries']},{len(sidecar['classes'])}]" in section


def _full_cocoeval(detections, gt):
    """AP50 and AP50:95 (area all, 100 detections) from pycocotools' COCOeval with every default cell computed."""
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    ids = sorted(gt)
    gts, dts = [], []
    for n, i in enumerate(ids, 1):
        for x1, y1, x2, y2, c in gt[i].tolist():
            gts.append({"id": len(gts) + 1, "image_id": n, "category_id": int(c), "bbox": [x1, y1, x2 - x1, y2 - y1],
                        "area": (x2 - x1) * (y2 - y1), "iscrowd": 0})
        for x1, y1, x2, y2, s, c in detections[i].tolist():
            dts.append({"id": len(dts) + 1, "image_id": n, "category_id": int(c), "bbox": [x1, y1, x2 - x1, y2 - y1],
                        "area": (x2 - x1) * (y2 - y1), "score": s, "iscrowd": 0})
    cats = [{"id": c} for c in sorted({a["category_id"] for a in gts + dts})]
    images = [{"id": n} for n in range(1, len(ids) + 1)]
    with contextlib.redirect_stdout(io.StringIO()):
        a, b = COCO(), COCO()
        a.dataset = {"images": images, "annotations": gts, "categories": cats}
        b.dataset = {"images": images, "annotations": dts, "categories": cats}
        a.createIndex()
        b.createIndex()
        ev = COCOeval(a, b, "bbox")
        ev.params.imgIds = [im["id"] for im in images]
        ev.evaluate()
        ev.accumulate()
    p = ev.eval["precision"][:, :, :, 0, -1]
    return float(np.mean(p[0][p[0] > -1])), float(np.mean(p[p > -1]))


def test_coco_ap_is_cocoeval_with_every_default_cell():
    # coco_ap evaluates only the cell it reports (area all, 100 detections); the figures are the bits of a
    # COCOeval run computing all 4 area ranges and 1/10/100 detections: boxes of every size, tied scores,
    # more than 100 detections on an image, classes without ground truth, degenerate boxes
    rng = np.random.default_rng(7)
    for trial in range(6):
        gt, dets = {}, {}
        for i in range(12):
            ng, nd = int(rng.integers(0, 5)), int(rng.integers(0, 130))
            xy, wh = rng.uniform(0, 300, (ng, 2)), rng.choice([8.0, 50.0, 150.0]) * rng.uniform(0.5, 1.5, (ng, 2))
            gt[i] = np.concatenate([xy, xy + wh, rng.integers(1, 4, (ng, 1))], 1)
            dxy, dwh = rng.uniform(0, 300, (nd, 2)), rng.uniform(2, 200, (nd, 2))
            k = min(ng, nd)
            dxy[:k], dwh[:k] = xy[:k] + rng.normal(0, 2, (k, 2)), wh[:k]
            if trial == 2:   # degenerate boxes: zero-width detections, a zero-width labelled box
                dwh[: nd // 3, 0] = 0.0
                gt[i][:1, 2] = gt[i][:1, 0]
            score = rng.random((nd, 1)).round(1 if trial % 2 else 6)
            dets[i] = np.concatenate([dxy, dxy + dwh, score, rng.integers(1, 5, (nd, 1))], 1)
        ap = metrics.coco_ap(dets, gt)
        assert (ap["ap50"], ap["ap50_95"]) == _full_cocoeval(dets, gt)
