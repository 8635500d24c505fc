"""A labels file's split names are exact: `"split": "Eval"` dropped its image from the eval split (and put it in
the calibration pool) without a word. Now it is one line naming the file, the image and the word to write."""

from __future__ import annotations

import json

import pytest

from calib_helpers import make_corpus, tiny_model
from cli_helpers import digest, one_line
from hosts_helpers import image_model, make_corpus as eval_corpus
from quantbench.cli import main


@pytest.mark.parametrize("word", ["Eval", "EVAL", "eval ", "Train"])
def test_a_split_in_another_case_is_refused_by_run(workdir, capsys, word):
    labels = eval_corpus(workdir / "corpus", count=2)
    coco = json.loads(labels.read_text())
    coco["images"][1]["split"] = word
    labels.write_text(json.dumps(coco))
    model = image_model(workdir / "m.onnx")
    before = digest(workdir)
    assert main(["run", "--hosts", "local", "--variants", str(model), "--fixtures", str(labels),
                 "--no-progress"]) == 2
    line = one_line(capsys.readouterr().err, "run")
    want = word.strip().lower()
    assert f"labels.json: image im1.png: split {word!r} is not {want!r} (split names are exact: write {want!r})" \
        in line, line
    assert digest(workdir) == before


def test_calibrate_refuses_it_too(workdir, capsys):
    """The calibration pool is every image outside "eval": an "Eval" image would have been calibrated on."""
    labels, _ = make_corpus(workdir / "data", n_litter=4, n_negative=4, n_eval=2)
    coco = json.loads(labels.read_text())
    first_eval = next(im for im in coco["images"] if im["split"] == "eval")
    first_eval["split"] = "Eval"
    labels.write_text(json.dumps(coco))
    model = tiny_model(workdir / "models" / "mine.onnx")
    before = digest(workdir)
    assert main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2",
                 "--no-pre-process", "--methods", "dynamic", "--no-progress"]) == 2
    assert f"split 'Eval' is not 'eval'" in one_line(capsys.readouterr().err, "calibrate")
    assert digest(workdir) == before
