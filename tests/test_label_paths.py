"""Reading labels (COCO JSON or CSV) for calibration sets and eval fixtures.

Every image a labels file names must resolve (symlinks followed) inside the images
folder: `../` escapes, absolute paths and symlinks out are refused before any file is
opened. A CSV saved with a UTF-8 byte-order mark reads like one without. COCO width and
height that disagree with the image file are an error (boxes and accuracy are in the
labelled image's pixels), like every other label the reader cannot trust.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from calib_helpers import make_corpus, tiny_model
from quantbench.cli import main
from test_hostile import digest, one_line


@pytest.fixture
def corpus(workdir):
    labels, images = make_corpus(workdir / "data", n_litter=4, n_negative=4, n_eval=2)
    outside = workdir / "outside"
    outside.mkdir()
    (outside / "secret.png").write_bytes((images / "img_000.png").read_bytes())
    model = tiny_model(workdir / "models" / "mine.onnx")
    return workdir, labels, images, model


def _calibrate_args(model, labels, images):
    return ["calibrate", "--model", model, "--labels", labels, "--images", images, "--per-cell", "2",
            "--no-pre-process", "--methods", "dynamic", "--no-progress"]


def _equiv_args(model, labels, images):
    return ["equiv", "--hosts", "x86", "--variants", model, "--fixtures", labels, "--images", images, "--no-progress"]


def _refused(capsys, wd, args, command, *expect) -> str:
    capsys.readouterr()
    before = digest(wd)
    assert main([str(a) for a in args]) == 2
    line = one_line(capsys.readouterr().err, command)
    for e in expect:
        assert e in line, line
    assert digest(wd) == before, "something was written"
    return line


def _set_file_name(labels: Path, name: str, split: str) -> None:
    coco = json.loads(labels.read_text())
    im = next(im for im in coco["images"] if im["split"] == split)
    im["file_name"] = name
    labels.write_text(json.dumps(coco))


def _escape(wd: Path, images: Path, how: str) -> str:
    if how == "dot-dot":
        return "../../outside/secret.png"
    if how == "absolute":
        return "/etc/passwd"
    os.symlink(wd / "outside" / "secret.png", images / "link.png")
    return "link.png"


@pytest.mark.parametrize("how", ["dot-dot", "absolute", "symlink"])
@pytest.mark.parametrize("command", ["calibrate", "equiv"])
def test_coco_file_names_must_stay_inside_the_images_folder(corpus, capsys, how, command):
    wd, labels, images, model = corpus
    name = _escape(wd, images, how)
    _set_file_name(labels, name, "train" if command == "calibrate" else "eval")
    args = (_calibrate_args if command == "calibrate" else _equiv_args)(model, labels, images)
    _refused(capsys, wd, args, command, str(labels), repr(name), "not a file inside", str(images))


@pytest.mark.parametrize("how", ["dot-dot", "absolute", "symlink"])
@pytest.mark.parametrize("command", ["calibrate", "equiv"])
def test_csv_images_must_stay_inside_the_images_folder(corpus, capsys, how, command):
    wd, labels, images, model = corpus
    name = _escape(wd, images, how)
    table = wd / "data" / "labels.csv"
    rows = [("img_001.png", "1", "train"), ("img_002.png", "0", "train"), ("img_003.png", "0", "eval"),
            (name, "1", "train" if command == "calibrate" else "eval")]
    with open(table, "w", newline="") as fh:
        csv.writer(fh).writerows([("image", "density", "split"), *rows])
    args = (_calibrate_args if command == "calibrate" else _equiv_args)(model, table, images)
    _refused(capsys, wd, args, command, str(table), repr(name), "not a file inside", str(images))


def test_csv_with_a_utf8_byte_order_mark_is_read(corpus, capsys):
    wd, labels, images, model = corpus
    coco = json.loads(labels.read_text())
    table = wd / "data" / "labels.csv"
    with open(table, "w", newline="", encoding="utf-8-sig") as fh:  # Excel's "CSV UTF-8"
        w = csv.writer(fh)
        w.writerow(["image", "label", "split"])
        for im in coco["images"]:
            w.writerow([im["file_name"], "neg" if im["negative"] else "pos", im["split"]])
    assert table.read_bytes().startswith(b"\xef\xbb\xbf")
    assert main([str(a) for a in _calibrate_args(model, table, images)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("command", ["calibrate", "equiv"])
def test_coco_width_height_unlike_the_image_is_refused(corpus, capsys, command):
    wd, labels, images, model = corpus
    coco = json.loads(labels.read_text())
    im = next(im for im in coco["images"] if im["split"] == ("train" if command == "calibrate" else "eval"))
    im["width"], im["height"] = 640, 480
    labels.write_text(json.dumps(coco))
    args = (_calibrate_args if command == "calibrate" else _equiv_args)(model, labels, images)
    _refused(capsys, wd, args, command, str(labels), im["file_name"], "640x480", "16x16")
