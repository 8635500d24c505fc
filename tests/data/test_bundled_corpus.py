"""The bundled fixture corpus: reproducible pixels and sane labels."""

import hashlib
import importlib.util
import statistics
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from quantbench.inputs.assets import CORPUS_DIR, CORPUS_IMAGES, CORPUS_LABELS
from quantbench.inputs.fixtures import annotations_by_image, load_coco
from quantbench.inputs.preprocess import load_rgb, luminance

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("make_corpus", REPO / "scripts" / "make_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def coco():
    return load_coco(CORPUS_LABELS, CORPUS_IMAGES)


def _decoded_sha(path):
    with Image.open(path) as im:
        return hashlib.sha256(np.asarray(im.convert("RGB"), dtype=np.uint8).tobytes()).hexdigest()


def _sample(coco):
    """Two litter and two negative images from each split, spread over the corpus."""
    picks = []
    for split in ("train", "val", "eval"):
        ims = [im for im in coco["images"] if im["split"] == split]
        for neg in (False, True):
            group = [im for im in ims if im["negative"] == neg]
            picks += [group[0], group[len(group) // 2]]
    return picks


def test_regenerated_sample_has_committed_pixels(gen, coco):
    anns = annotations_by_image(coco)
    for im in _sample(coco):
        index = im["id"] - 1
        assert gen.file_name(index) == im["file_name"]
        rgb, boxes, meta = gen.render_scene(index)
        assert rgb.shape == (128, 128, 3) and rgb.dtype == np.uint8
        assert hashlib.sha256(rgb.tobytes()).hexdigest() == _decoded_sha(CORPUS_IMAGES / im["file_name"]), im["file_name"]
        assert meta["split"] == im["split"] and meta["negative"] == im["negative"]
        assert meta["ground"] == im["ground"]
        assert abs(meta["luma"] - im["luma"]) <= 0.011
        assert [(b["category_id"], b["bbox"]) for b in boxes] == \
            [(a["category_id"], a["bbox"]) for a in anns[im["id"]]]


def test_check_option_detects_a_changed_image(gen, tmp_path):
    (tmp_path / "images").mkdir()
    rgb, _, _ = gen.render_scene(0)
    Image.fromarray(rgb).save(tmp_path / "images" / gen.file_name(0))
    assert gen.main(["--out", str(tmp_path), "--check", "1"]) == 0
    rgb = rgb.copy()
    rgb[5, 7, 1] ^= 1
    Image.fromarray(rgb).save(tmp_path / "images" / gen.file_name(0))
    assert gen.main(["--out", str(tmp_path), "--check", "1"]) == 1


def test_labels_are_sane(coco):
    images = coco["images"]
    assert len(images) >= 400
    assert len({im["file_name"] for im in images}) == len(images)
    splits = Counter(im["split"] for im in images)
    assert set(splits) == {"train", "val", "eval"}
    assert splits["train"] >= 300 and splits["val"] >= 40 and splits["eval"] >= 100
    assert splits["train"] + splits["val"] >= 200

    cats = {c["id"]: c["name"] for c in coco["categories"]}
    assert cats == {1: "bottle", 2: "can", 3: "cup", 4: "wrapper", 5: "bag", 6: "cigarette_butt"}
    per_cat = Counter(a["category_id"] for a in coco["annotations"])
    assert all(per_cat[c] >= 50 for c in cats), per_cat

    by = annotations_by_image(coco)
    negatives = [im for im in images if im["negative"]]
    assert 0.4 <= len(negatives) / len(images) <= 0.6
    for im in images:
        n = len(by[im["id"]])
        if im["negative"]:
            assert n == 0, im["file_name"]
        else:
            assert 1 <= n <= 8, im["file_name"]
        assert im["width"] == im["height"] == 128
        assert im["ground"] in {"grass", "pavement", "gravel", "sand", "soil"}
    assert len({im["ground"] for im in images}) == 5

    for a in coco["annotations"]:
        x, y, w, h = a["bbox"]
        assert 0 <= x and 0 <= y and w > 0 and h > 0 and x + w <= 128 and y + h <= 128
        assert a["iscrowd"] == 0 and a["area"] > 0
    sides = [max(a["bbox"][2:]) for a in coco["annotations"]]
    assert min(sides) <= 10 and max(sides) >= 40

    lumas = [im["luma"] for im in images]
    assert min(lumas) <= 40 and max(lumas) >= 200
    # Every density x brightness cell of the calibration pool (train+val) is populated.
    pool = [im for im in images if im["split"] in ("train", "val")]
    for neg in (False, True):
        cls = [im["luma"] for im in pool if im["negative"] == neg]
        med = statistics.median(cls)
        assert sum(v <= med for v in cls) >= 12 and sum(v > med for v in cls) >= 12


def test_recorded_luma_matches_pixels(coco):
    for im in coco["images"][::97]:
        assert abs(luminance(load_rgb(CORPUS_IMAGES / im["file_name"])) - im["luma"]) <= 0.011


def test_corpus_fits_the_size_budget():
    total = sum(p.stat().st_size for p in CORPUS_DIR.rglob("*") if p.is_file())
    assert total <= 20 * 1024 * 1024
