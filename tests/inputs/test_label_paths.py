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
from quantbench.errors import UserError
from cli_helpers import digest, one_line


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


def test_image_sizes_are_remembered_by_file_state_and_still_checked(corpus, monkeypatch, tmp_path):
    """A second check of a labels file opens no unchanged image (its size is remembered with the file's state),
    yet still refuses a wrong width/height in the labels; a rewritten image is read again."""
    from PIL import Image

    from quantbench.inputs.fixtures import load_coco

    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path / "home"))
    wd, labels, images, model = corpus
    opened = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda fp, *a, **k: opened.append(str(fp)) or real_open(fp, *a, **k))
    coco = load_coco(labels, images)
    n = sum(1 for im in coco["images"] if "width" in im)
    assert n and len(opened) == n and len(list((tmp_path / "home" / "image-sizes").glob("*.json"))) == 1
    opened.clear()
    load_coco(labels, images)
    assert opened == []   # every size remembered
    victim = next(im for im in coco["images"] if "width" in im)
    bad = json.loads(labels.read_text())
    next(im for im in bad["images"] if im["id"] == victim["id"])["width"] += 1
    labels.write_text(json.dumps(bad))
    with pytest.raises(UserError, match=f"{victim['file_name']}: width x height"):
        load_coco(labels, images)
    assert opened == []   # refused from the remembered size: the labels are checked each time
    labels.write_text(json.dumps(coco))
    path = images / victim["file_name"]
    Image.new("RGB", (victim["width"] + 1, victim["height"])).save(path)   # the image changes, not the labels
    with pytest.raises(UserError, match=f"file is {victim['width'] + 1}x{victim['height']}"):
        load_coco(labels, images)
    assert opened == [str(path.absolute())]


def test_a_labels_file_resolves_its_images_folder_once_not_per_image(corpus, monkeypatch):
    """Checking each image inside the images folder resolved the folder and the image (two Path.resolve per image,
    twice per equiv: 2400 for 600 images); now the folder is resolved once per labels file and a plain name (no
    symlink, no '..') is checked with one lstat per component. Names that are not plain are resolved as before."""
    from quantbench.inputs.fixtures import load_coco, read_csv_labels

    wd, labels, images, model = corpus
    coco = json.loads(labels.read_text())
    (images / "sub").mkdir()
    os.replace(images / coco["images"][0]["file_name"], images / "sub" / "moved.png")
    os.symlink("sub", images / "dirlink")
    coco["images"][0]["file_name"], coco["images"][1]["file_name"] = "dirlink/moved.png", "sub/../img_001.png"
    labels.write_text(json.dumps(coco))
    table = wd / "data" / "labels.csv"
    table.write_text("image,density\n" + "".join(f"{im['file_name']},1\n" for im in coco["images"]))
    calls = []
    real = Path.resolve
    monkeypatch.setattr(Path, "resolve", lambda self, strict=False: calls.append(str(self)) or real(self, strict))
    assert len(load_coco(labels, images)["images"]) == len(coco["images"]) == 10
    assert len(read_csv_labels(table, images)) == 10
    assert sorted(calls) == sorted([str(images)] * 2 + [str(images / "dirlink/moved.png"),
                                                       str(images / "sub/../img_001.png")] * 2)


def test_inside_with_the_folder_resolved_already_answers_as_without(tmp_path):
    from quantbench.inputs.variantdir import inside

    folder, outside = tmp_path / "imgs", tmp_path / "outside.png"
    (folder / "sub").mkdir(parents=True)
    for f in (folder / "a.png", folder / "sub" / "b.png", outside):
        f.write_bytes(b"x")
    os.symlink("a.png", folder / "in.png")
    os.symlink(outside, folder / "out.png")
    os.symlink("sub", folder / "dirlink")
    os.symlink("..", folder / "up")
    ok = ["a.png", "sub/b.png", "sub/../a.png", "in.png", "dirlink/b.png", "missing.png", "sub/no/such.png",
          "a.png/", "sub//b.png", "./a.png"]
    refused = ["out.png", "../outside.png", "sub/../../outside.png", "up/outside.png", ".", "sub/..", "",
               str(outside), "sub\\b.png", "a\x00.png", None, 3]
    base = folder.resolve()
    for rel in ok:
        assert inside(folder, rel) == inside(folder, rel, base) == folder / rel, rel
    for rel in refused:
        assert inside(folder, rel) is None and inside(folder, rel, base) is None, rel
