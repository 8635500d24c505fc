"""Calibration-set builder: strata, determinism, eval overlap, bad input (stand-in corpora, no model)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from calib_helpers import make_corpus
from quantbench.calibset import builder
from quantbench.errors import UserError
from quantbench.inputs.preprocess import luminance
from quantbench.inputs.strata import density_label


@pytest.fixture
def corpus(tmp_path):
    return make_corpus(tmp_path / "corpus", n_litter=20, n_negative=20, n_eval=4)


def build(labels, images, **kw):
    kw.setdefault("per_cell", 5)
    return builder.build("t", labels, images, **kw)


def test_luminance_is_rec709_luma():
    rgb = np.zeros((4, 4, 3), np.uint8)
    rgb[..., 1] = 200
    assert luminance(rgb) == pytest.approx(0.7152 * 200)
    rgb[:2, :, 0] = 100  # half the pixels get red too
    assert luminance(rgb) == pytest.approx(0.7152 * 200 + 0.2126 * 50)


def test_strata_are_balanced_by_density_and_class_median(corpus):
    labels, images = corpus
    cs = build(labels, images)
    sel = cs.selected
    assert len(sel) == 20
    assert {r["cell"] for r in sel} == {"objects/bright", "objects/dark", "empty/bright", "empty/dark"}
    assert all(sum(r["cell"] == c for r in sel) == 5 for c in {r["cell"] for r in sel})
    assert not [r for r in sel if r["split"] == "eval"]
    coco = json.loads(labels.read_text())
    names = {im["file_name"]: im for im in coco["images"]}
    for density in ("objects", "empty"):
        med = cs.recipe["lighting_medians"][density]
        pool = [im for im in coco["images"] if im["split"] != "eval" and im["negative"] == (density == "empty")]
        lumas = [luminance(np.asarray(__import__("PIL.Image", fromlist=["Image"]).open(images / im["file_name"]).convert("RGB")))
                 for im in pool]
        assert med == pytest.approx(float(np.median(lumas)))  # the median of that density class only
        for r in sel:
            if r["density"] == density:
                assert (r["luminance"] < med) == (r["lighting"] == "dark")
                assert names[r["path"]]["negative"] == (density == "empty")
                assert (r["objects"] == 0) == (density == "empty")


def test_selection_is_deterministic_and_seeded(corpus, tmp_path):
    labels, images = corpus
    a = builder.manifest_bytes(build(labels, images, seed=3).rows)
    b = builder.manifest_bytes(build(labels, images, seed=3).rows)
    assert a == b
    # the order of the labels file does not matter
    coco = json.loads(labels.read_text())
    coco["images"].reverse()
    rev = tmp_path / "rev.json"
    rev.write_text(json.dumps(coco))
    assert builder.manifest_bytes(build(rev, images, seed=3).rows) == a
    other = build(labels, images, seed=4).selected
    assert {r["sha256"] for r in other} != {r["sha256"] for r in build(labels, images, seed=3).selected}


def test_the_draw_is_sklearns_resample_without_replacement():
    """builder.draw makes sklearn.utils.resample's draw (recorded in every recipe) from one RandomState carried
    across cells, without importing scikit-learn in calibrate."""
    from sklearn.utils import resample

    for seed in (0, 7, 1234):
        ours, theirs = np.random.RandomState(seed), np.random.RandomState(seed)
        for n, k in ((1, 1), (5, 3), (12, 12), (40, 12), (3, 3), (100, 1)):
            members = [f"img{i}" for i in range(n)]
            assert builder.draw(members, k, ours) == list(resample(members, replace=False, n_samples=k,
                                                                   random_state=theirs)), (seed, n, k)


def test_count_bins_split_objects(corpus):
    labels, images = corpus
    cs = build(labels, images, per_cell=2, count_bins=[2])
    assert {r["density"] for r in cs.selected} == {"objects-1", "objects-2+", "empty"}
    assert all((r["objects"] >= 2) == (r["density"] == "objects-2+") for r in cs.selected if r["objects"])
    assert density_label(5, [2, 4]) == "objects-4+" and density_label(3, [2, 4]) == "objects-2-3"


def test_short_cell_is_an_error_unless_allowed(corpus):
    labels, images = corpus
    with pytest.raises(UserError, match=r"too few candidates for 20 per cell \(.*has \d+.*allow_short"):
        build(labels, images, per_cell=20)
    cs = build(labels, images, per_cell=20, allow_short=True)
    assert all(c["shortfall"] > 0 for c in cs.cells)
    assert all(r["cell_available"] < r["cell_wanted"] == 20 for r in cs.selected)
    assert len(cs.selected) == sum(c["available"] for c in cs.cells)


def test_eval_overlap_by_sha256_is_an_error(corpus):
    labels, images = corpus
    coco = json.loads(labels.read_text())
    ev = next(im for im in coco["images"] if im["split"] == "eval")
    shutil.copyfile(images / ev["file_name"], images / "copy_of_eval.png")
    coco["images"].append({"id": 999, "file_name": "copy_of_eval.png", "width": 16, "height": 16, "split": "train",
                           "negative": True})
    labels.write_text(json.dumps(coco))
    with pytest.raises(UserError, match=f"copy_of_eval.png: same bytes as evaluation image .*{ev['file_name']}"):
        build(labels, images)


def test_corrupt_image_named_or_skipped(corpus, tmp_path):
    labels, images = corpus
    coco = json.loads(labels.read_text())
    victim = next(im for im in coco["images"] if im["split"] == "train")["file_name"]
    (images / victim).write_bytes(b"\x89PNG\r\n\x1a\n not really")
    with pytest.raises(UserError, match=f"{victim}: not a readable image.*skip_bad"):
        build(labels, images)
    cs = build(labels, images, skip_bad=True)
    skipped = [r for r in cs.rows if r["status"] == "skipped"]
    assert [r["path"] for r in skipped] == [victim] and skipped[0]["note"]
    assert cs.recipe["skipped_bad"] == 1
    folder = builder.write(cs, tmp_path / "sets")
    paths, recipe, table = builder.load(folder)
    assert len(paths) == 20 and victim not in {p.name for p in paths}
    assert table.num_rows == 21 and recipe["manifest_sha256"]


def test_missing_image_and_bad_labels(corpus, tmp_path):
    labels, images = corpus
    coco = json.loads(labels.read_text())
    coco["images"].append({"id": 1000, "file_name": "ghost.png", "split": "train"})
    labels.write_text(json.dumps(coco))
    with pytest.raises(UserError, match="references missing image .*ghost.png"):
        build(labels, images)
    bad = tmp_path / "bad.csv"
    bad.write_text("file,count\na.png,1\n")
    with pytest.raises(UserError, match="needs an 'image' column and a 'density', 'label' or 'text' column"):
        build(bad, images)


def test_csv_labels(corpus, tmp_path):
    labels, images = corpus
    coco = json.loads(labels.read_text())
    counts = {}
    for a in coco["annotations"]:
        counts[a["image_id"]] = counts.get(a["image_id"], 0) + 1
    lines = ["image,density,split"] + [f"{im['file_name']},{counts.get(im['id'], 0)},{im['split']}" for im in coco["images"]]
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text("\n".join(lines) + "\n")
    from_csv = build(csv_path, images, seed=1)
    from_coco = build(labels, images, seed=1)
    assert [(r["path"], r["cell"]) for r in from_csv.selected] == [(r["path"], r["cell"]) for r in from_coco.selected]


def test_write_refuses_a_different_set_unless_forced(corpus, tmp_path):
    labels, images = corpus
    root = tmp_path / "sets"
    builder.write(build(labels, images, seed=1), root)
    builder.write(build(labels, images, seed=1), root)  # identical: fine
    with pytest.raises(UserError, match="already holds different calibration set.*force"):
        builder.write(build(labels, images, seed=2), root)
    builder.write(build(labels, images, seed=2), root, force=True)
    assert json.loads((root / "t" / "recipe.json").read_text())["seed"] == 2
    assert [p.name for p in root.iterdir()] == ["t"]  # no staging leftovers


# ---- strata from the user's data (issue: the demo's vocabulary leaked into user runs) ----------


def _drop_annotations(labels):
    coco = json.loads(labels.read_text())
    coco["annotations"] = []
    for im in coco["images"]:
        im.pop("negative", None)
    labels.write_text(json.dumps(coco))


def test_a_set_without_empty_images_needs_no_allow_short(corpus):
    """A stratum the data lack entirely is left out and recorded, not a shortfall."""
    labels, images = corpus
    coco = json.loads(labels.read_text())
    with_objects = {a["image_id"] for a in coco["annotations"]}
    coco["images"] = [im for im in coco["images"] if im["id"] in with_objects or im["split"] == "eval"]
    labels.write_text(json.dumps(coco))
    cs = build(labels, images, per_cell=3)
    assert {c["cell"] for c in cs.cells} == {"objects/bright", "objects/dark"}
    assert cs.recipe["strata"]["absent"] == ["empty"] and cs.recipe["strata"]["kind"] == "objects"
    assert len(cs.selected) == 6


def test_a_set_of_only_empty_images(corpus):
    labels, images = corpus
    _drop_annotations(labels)
    cs = build(labels, images, per_cell=4)
    assert {c["cell"] for c in cs.cells} == {"empty/bright", "empty/dark"}
    assert cs.recipe["strata"]["absent"] == ["objects"]


def test_classifier_labels_stratify_by_label(corpus):
    """COCO labels of a classifier: one annotation per image, no bbox; strata are the label values."""
    labels, images = corpus
    coco = json.loads(labels.read_text())
    coco["categories"] = [{"id": 1, "name": "up"}, {"id": 2, "name": "down"}]
    coco["annotations"] = [{"id": im["id"], "image_id": im["id"], "category_id": 1 + im["id"] % 2}
                           for im in coco["images"]]
    for im in coco["images"]:
        im.pop("negative", None)
    labels.write_text(json.dumps(coco))
    cs = build(labels, images, per_cell=3)
    assert cs.recipe["strata"]["kind"] == "label"
    assert {c["cell"] for c in cs.cells} == {"up/bright", "up/dark", "down/bright", "down/dark"}
    by_id = {im["file_name"]: im["id"] for im in coco["images"]}
    assert all(r["density"] == ("up" if by_id[r["path"]] % 2 == 0 else "down") for r in cs.selected)
    # object strata on the same labels when asked
    assert {c["cell"].split("/")[0] for c in build(labels, images, per_cell=3, strata="objects").cells} == {"objects"}


def test_csv_label_column(corpus, tmp_path):
    labels, images = corpus
    coco = json.loads(labels.read_text())
    lines = ["image,label,split"] + [f"{im['file_name']},{'cat' if im['id'] % 2 else 'dog'},{im['split']}"
                                     for im in coco["images"]]
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text("\n".join(lines) + "\n")
    cs = build(csv_path, images, per_cell=2)
    assert {c["cell"] for c in cs.cells} == {"cat/bright", "cat/dark", "dog/bright", "dog/dark"}
    with pytest.raises(UserError, match="strata label: some images do not carry exactly one label"):
        build(labels, images, strata="label")


def test_eval_disjointness_counts_only_the_users_eval_split(corpus):
    labels, images = corpus
    coco = json.loads(labels.read_text())
    n_eval = sum(1 for im in coco["images"] if im["split"] == "eval")
    assert build(labels, images).recipe["eval_images_checked"] == n_eval  # not the bundled corpus's 120
