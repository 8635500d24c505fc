"""A text recogniser scored against CSV labels: a 'text' column is each image's truth, as COCO's "text" field.

Was: the accuracy read only COCO JSON, so CSV labels gave 'the labels file the fixtures came from was not
read' and no text accuracy (and a CSV needed a density or label column besides).
"""

from __future__ import annotations

import contextlib
import csv

from calib_helpers import make_corpus
from quantbench.cli import main
from quantbench.inputs.fixtures import labels_coco
from decode_helpers import SIZE, ocr_model


def test_csv_text_column_is_the_text_truth(tmp_path, capsys):
    _, images = make_corpus(tmp_path / "corpus", n_litter=6, n_negative=6, n_eval=2, size=SIZE)
    names = sorted(p.name for p in images.glob("*.png"))
    table = images / "labels.csv"
    with open(table, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["image", "text", "split"])
        for i, name in enumerate(names):
            evals = i >= len(names) - 2
            w.writerow([name, ("ab a" if i == len(names) - 2 else "ab b") if evals else "", "eval" if evals else ""])
    coco = labels_coco(table)
    assert [im["text"] for im in coco["images"] if im["split"] == "eval"] == ["ab a", "ab b"]
    (tmp_path / "models").mkdir()
    ocr_model(tmp_path / "models")
    with contextlib.chdir(tmp_path):
        assert main(["calibrate", "--model", "models/ocr.onnx", "--labels", str(table), "--per-cell", "2",
                     "--methods", "dynamic", "--no-progress", "-q"]) == 0
        assert main(["equiv", "--hosts", "x86", "--no-progress", "--no-plots"]) == 0
        report = (tmp_path / "results" / "report.md").read_text()
    assert "Text accuracy on 2 labelled images" in report and "| fp32 | 0.500 (1/2), CER 0.125 |" in report
