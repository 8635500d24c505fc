"""COCO width/height are checked against the image as it is decoded: upright, its EXIF orientation applied.

A phone photo is stored sideways with an EXIF orientation tag; quantbench's pixels are the upright image
(preprocess.load_rgb), and docs/your-model.md asks for labels (width, height, boxes) in that upright frame. So
the size a labels file is checked against is the upright one (orientations 5-8 turn the image by 90 degrees:
width and height swap), the same one the pixels have, and the size remembered for the next check
(fixtures.ImageSizes) is that one too, never the stored one.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from calib_helpers import make_corpus, tiny_model
from cli_helpers import digest, one_line
from quantbench.cli import main
from quantbench.errors import UserError
from quantbench.inputs.fixtures import ImageSizes, load_coco
from quantbench.inputs.preprocess import load_rgb

STORED_W, STORED_H = 24, 16   # as the JPEG's pixels are stored; orientation 6 shows them 16 wide, 24 high


def _sideways_jpeg(path, orientation: int, seed: int = 0) -> None:
    """A real JPEG written by PIL, STORED_W x STORED_H, with an EXIF orientation tag."""
    px = np.random.default_rng(seed).integers(0, 255, (STORED_H, STORED_W, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(px).save(path, format="JPEG", quality=95, exif=exif)


@pytest.fixture
def corpus(workdir, monkeypatch):
    """The corpus of tests/calib_helpers with one train and one eval image replaced by a sideways phone JPEG."""
    monkeypatch.setenv("QUANTBENCH_HOME", str(workdir / "home"))
    labels, images = make_corpus(workdir / "data", n_litter=4, n_negative=4, n_eval=2)
    coco = json.loads(labels.read_text())
    for seed, split in enumerate(("train", "eval")):
        im = next(im for im in coco["images"] if im["split"] == split)
        (images / im["file_name"]).unlink()
        im["file_name"] = im["file_name"].replace(".png", ".jpg")
        _sideways_jpeg(images / im["file_name"], 6, seed)
    labels.write_text(json.dumps(coco))
    return workdir, labels, images, tiny_model(workdir / "models" / "mine.onnx")


def _label_size(labels, width: int, height: int) -> None:
    coco = json.loads(labels.read_text())
    for im in coco["images"]:
        if im["file_name"].endswith(".jpg"):
            im["width"], im["height"] = width, height
    labels.write_text(json.dumps(coco))


def _files(wd) -> dict:
    """digest of the working folder but QUANTBENCH_HOME (quantbench's caches, not the user's files)."""
    return {k: v for k, v in digest(wd).items() if not k.startswith("home/")}


def _args(command, model, labels, images):
    if command == "calibrate":
        return ["calibrate", "--model", model, "--labels", labels, "--images", images, "--per-cell", "2",
                "--no-pre-process", "--methods", "dynamic", "--no-progress"]
    return ["equiv", "--hosts", "x86", "--variants", model, "--fixtures", labels, "--images", images,
            "--no-progress"]


@pytest.mark.parametrize("command", ["calibrate", "equiv"])
def test_labels_in_the_upright_frame_are_accepted(corpus, capsys, command):
    wd, labels, images, model = corpus
    _label_size(labels, STORED_H, STORED_W)   # as a viewer shows it (and as the pixels are decoded)
    jpg = next(images.glob("*.jpg"))
    assert load_rgb(jpg).shape == (STORED_W, STORED_H, 3)   # the pixels: upright
    assert main([str(a) for a in _args(command, model, labels, images)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("command", ["calibrate", "equiv"])
def test_labels_in_the_stored_frame_are_refused(corpus, capsys, command):
    """Was: accepted (the check read the stored size), with boxes in another frame than the pixels."""
    wd, labels, images, model = corpus
    _label_size(labels, STORED_W, STORED_H)
    capsys.readouterr()
    before = _files(wd)
    assert main([str(a) for a in _args(command, model, labels, images)]) == 2
    line = one_line(capsys.readouterr().err, command)
    assert str(labels) in line and ".jpg" in line, line
    assert f"width x height {STORED_W}x{STORED_H} in the labels, but the file is {STORED_H}x{STORED_W} upright" \
           in line, line
    assert "EXIF orientation 6" in line, line
    assert _files(wd) == before, "something was written"


@pytest.mark.parametrize("orientation, upright", [(1, (24, 16)), (3, (24, 16)), (5, (16, 24)), (6, (16, 24)),
                                                   (7, (16, 24)), (8, (16, 24))])
def test_the_checked_size_is_the_decoded_size_for_every_orientation(tmp_path, orientation, upright):
    path = tmp_path / "p.jpg"
    _sideways_jpeg(path, orientation)
    h, w = load_rgb(path).shape[:2]
    assert ImageSizes(remember=False).size(path) == (w, h) == upright


def test_the_remembered_size_is_the_upright_one(corpus):
    """The cache of image sizes holds the upright size; a size remembered in the stored frame (by a version that
    read it so, with the file unchanged) is read again, not trusted."""
    wd, labels, images, model = corpus
    _label_size(labels, STORED_H, STORED_W)
    load_coco(labels, images)   # reads and remembers every size
    jpg = str(next(images.glob("*.jpg")).absolute())
    cache = next((wd / "home" / "image-sizes").glob("*.json"))
    assert ImageSizes(images).size(jpg) == (STORED_H, STORED_W)
    known = json.loads(cache.read_text())
    assert known[jpg][5:7] == [STORED_H, STORED_W]
    known[jpg] = known[jpg][:5] + [STORED_W, STORED_H]   # the record an earlier version wrote: the stored size
    cache.write_text(json.dumps(known))
    load_coco(labels, images)   # upright labels: still accepted
    _label_size(labels, STORED_W, STORED_H)
    with pytest.raises(UserError, match=f"{STORED_W}x{STORED_H} in the labels, but the file is "
                                        f"{STORED_H}x{STORED_W} upright"):
        load_coco(labels, images)
