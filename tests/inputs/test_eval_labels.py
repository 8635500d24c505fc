"""Which images a command evaluates a calibrated model on when --fixtures is not given.

The eval split of the labels the variants were calibrated with (their recipes record the
labels file's path and SHA-256): never the bundled demo corpus for a model that is not the
demo's. Labels that are gone or changed since calibration stop the command with one line;
CSV labels (which calibration accepts) make fixtures too.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import pytest

from calib_helpers import make_corpus, tiny_model
from quantbench.store import partread
from quantbench.cli import main
from quantbench.fsutil import sha256_file
from cli_helpers import digest, one_line


def _calibrate(wd: Path, labels: Path, images: Path) -> Path:
    model = tiny_model(wd / "models" / "mine.onnx")
    assert main(["calibrate", "--model", str(model), "--labels", str(labels), "--images", str(images),
                 "--per-cell", "2", "--no-pre-process", "--methods", "dynamic", "--no-progress"]) == 0
    return model


@pytest.fixture
def coco_calibrated(workdir):
    labels, images = make_corpus(workdir / "data", n_litter=4, n_negative=4, n_eval=2)
    photos = workdir / "photos"
    shutil.move(images, photos)  # the images live apart from the labels: --images photos/
    _calibrate(workdir, labels, photos)
    return workdir, labels, photos


def _sources() -> list[str]:
    return sorted(r["source"] for r in partread.read("fixtures", root=Path("results/tables"),
                                                   columns=["source"]).to_pylist())


def test_recipe_records_the_labels_it_was_calibrated_with(coco_calibrated):
    wd, labels, photos = coco_calibrated
    for f in sorted((wd / "results/variants/mine").glob("*.recipe.json")):
        rec = json.loads(f.read_text())["eval_labels"]
        assert rec == {"path": os.path.abspath(labels), "sha256": sha256_file(labels), "images": os.path.abspath(photos)}


def test_equiv_without_fixtures_uses_the_calibration_labels_eval_split(coco_calibrated, capsys):
    wd, labels, photos = coco_calibrated
    coco = json.loads(labels.read_text())
    evals = sorted(im["file_name"] for im in coco["images"] if im["split"] == "eval")
    capsys.readouterr()
    assert main(["equiv", "--hosts", "x86", "--no-progress", "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert f"{len(evals)} fixtures" in out and "demo" not in out
    assert _sources() == evals and not any(s.startswith("scene_") for s in _sources())
    assert json.loads((wd / "results/equiv.json").read_text())["labels"] == {"fixtures": os.path.abspath(labels),
                                                                           "images": os.path.abspath(photos)}


@pytest.mark.parametrize("how", ["changed", "gone"])
@pytest.mark.parametrize("command", ["equiv", "run"])
def test_changed_or_missing_calibration_labels_stop_the_command(coco_calibrated, capsys, how, command):
    wd, labels, _ = coco_calibrated
    if how == "changed":
        coco = json.loads(labels.read_text())
        coco["images"][0]["split"] = "eval" if coco["images"][0]["split"] != "eval" else "train"
        labels.write_text(json.dumps(coco))
    else:
        labels.unlink()
    capsys.readouterr()
    before = digest(wd)
    assert main([command, "--hosts", "x86", "--no-progress"]) == 2
    line = one_line(capsys.readouterr().err, command)
    assert os.path.abspath(labels) in line and ("changed since" if how == "changed" else "not found") in line, line
    assert "--fixtures" in line
    assert digest(wd) == before


def test_a_bare_user_model_without_fixtures_is_refused_not_fed_the_demo_images(workdir, capsys):
    model = tiny_model(workdir / "models" / "mine.onnx")
    before = digest(workdir)
    assert main(["equiv", "--hosts", "x86", "--variants", str(model), "--no-progress"]) == 2
    line = one_line(capsys.readouterr().err, "equiv")
    assert str(model) in line and "--fixtures" in line, line
    assert digest(workdir) == before


def test_calibration_with_csv_labels_gives_csv_fixtures(workdir, capsys):
    labels, images = make_corpus(workdir / "data", n_litter=4, n_negative=4, n_eval=2)
    coco = json.loads(labels.read_text())
    counts = {}
    for a in coco["annotations"]:
        counts[a["image_id"]] = counts.get(a["image_id"], 0) + 1
    table = workdir / "data" / "labels.csv"
    with open(table, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["image", "density", "split"])
        for im in coco["images"]:
            w.writerow([im["file_name"], counts.get(im["id"], 0), im["split"]])
    _calibrate(workdir, table, images)
    capsys.readouterr()
    assert main(["equiv", "--hosts", "x86", "--no-progress", "--no-plots"]) == 0
    evals = sorted(im["file_name"] for im in coco["images"] if im["split"] == "eval")
    assert _sources() == evals
    assert main(["run", "--hosts", "x86", "--no-progress", "--fixtures", str(table), "--images", str(images)]) == 0


def test_a_classifier_calibrated_on_csv_labels_is_scored_against_them(workdir, capsys):
    from bench_helpers import SIDE, tiny_classifier

    _, images = make_corpus(workdir / "data", n_litter=6, n_negative=6, n_eval=4)
    model = workdir / "models" / "clf.onnx"
    model.parent.mkdir(parents=True)
    tiny_classifier(model)
    model.with_suffix(".json").write_text(json.dumps(SIDE))
    table = workdir / "data" / "labels.csv"
    names = sorted(p.name for p in images.glob("*.png"))
    with open(table, "w", newline="", encoding="utf-8-sig") as fh:
        w = csv.writer(fh)
        w.writerow(["image", "label", "split"])
        for i, name in enumerate(names):
            w.writerow([name, "bottle" if i % 2 else "can", "eval" if i >= len(names) - 4 else "train"])
    assert main(["calibrate", "--model", str(model), "--labels", str(table), "--images", str(images), "--per-cell", "2",
                 "--no-pre-process", "--methods", "minmax", "--no-progress"]) == 0
    assert main(["equiv", "--hosts", "x86", "--no-progress", "--no-plots"]) == 0
    report = (workdir / "results" / "report.md").read_text()
    assert "Top-1 accuracy" in report and "on 4 labelled images" in report, report
    assert "not readable" not in report


def test_calibration_labels_without_an_eval_split_are_named(workdir, capsys):
    labels, images = make_corpus(workdir / "data", n_litter=4, n_negative=4, n_eval=0)
    _calibrate(workdir, labels, images)
    capsys.readouterr()
    before = digest(workdir)
    assert main(["equiv", "--hosts", "x86", "--no-progress"]) == 2
    line = one_line(capsys.readouterr().err, "equiv")
    assert os.path.abspath(labels) in line and "no image in split 'eval'" in line, line
    assert digest(workdir) == before
