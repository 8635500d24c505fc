"""COCO labels whose entries the reader cannot trust are refused, naming the file and the entry: a width or height
that is not a whole number of pixels (a float skipped the size check), an image listed twice, annotations naming
categories that an empty 'categories' list does not define. One line, exit 2, nothing written."""

from __future__ import annotations

import json

import pytest

from calib_helpers import make_corpus, tiny_model
from cli_helpers import digest, one_line
from quantbench.cli import main
from quantbench.errors import UserError
from quantbench.inputs.fixtures import load_coco


def _edit(labels, change) -> None:
    coco = json.loads(labels.read_text())
    change(coco)
    labels.write_text(json.dumps(coco))


def _width(v):
    return lambda c: c["images"][0].update(width=v)


def _twice(c):
    c["images"].append({**c["images"][1], "id": 999})


def _no_categories(c):
    c["categories"] = []


CASES = [
    (_width(100.0), "image entry 0 (img_000.png): 'width' must be a whole number of pixels, at least 1 (got 100.0)"),
    (_width("16"), "'width' must be a whole number of pixels, at least 1 (got '16')"),
    (_width(True), "(got True)"),
    (lambda c: c["images"][2].update(height=0), "image entry 2 (img_002.png): 'height' must be a whole number"),
    (_twice, "image img_001.png is listed twice (image entries 1 and 10); list each image once"),
    (_no_categories, "category_id 1 is not in 'categories' (it is empty: list each category with its id and name)"),
]


@pytest.mark.parametrize("change, message", CASES)
def test_an_untrustworthy_label_entry_is_refused(workdir, change, message):
    labels, images = make_corpus(workdir / "data", n_litter=4, n_negative=4, n_eval=2)
    _edit(labels, change)
    with pytest.raises(UserError) as err:
        load_coco(labels, images)
    assert str(err.value).startswith(f"{labels}: ") and message in str(err.value)


@pytest.mark.parametrize("change, message", CASES[::2])
def test_calibrate_refuses_it_before_anything_is_written(workdir, capsys, change, message):
    labels, images = make_corpus(workdir / "data", n_litter=4, n_negative=4, n_eval=2)
    _edit(labels, change)
    model = tiny_model(workdir / "models" / "m.onnx")
    before = digest(workdir)
    rc = main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2", "--no-progress"])
    assert rc == 2 and message in one_line(capsys.readouterr().err, "calibrate")
    assert digest(workdir) == before


def test_whole_sizes_and_distinct_images_still_read(workdir):
    labels, images = make_corpus(workdir / "data", n_litter=4, n_negative=4, n_eval=2)
    assert len(load_coco(labels, images)["images"]) == 10
