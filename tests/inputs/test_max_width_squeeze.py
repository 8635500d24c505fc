"""A recogniser's dynamic width: an image wider than max_width at the model's height is squeezed to it (the aspect
not kept), and a recogniser reads squeezed text differently from deployed code that feeds the whole line; the run
plan says which images were squeezed, and how wide the widest would be."""

from __future__ import annotations

import json

import numpy as np
from PIL import Image

from quantbench.inputs.fixtures import build_fixtures, squeeze_note
from quantbench.inputs.preprocess import input_spec, squeezed_width

SPEC = input_spec({"input": {"name": "x", "shape": [1, 1, 16, -1], "color": "GRAY", "max_width": 64,
                             "scale": 1 / 255, "mean": [0.0], "std": [1.0]}}, [1, 1, 16, None])


def _lines(folder, widths) -> tuple:
    """Text-line images 8 px high and `widths` wide, all in the eval split."""
    (folder / "images").mkdir(parents=True)
    images = []
    for i, w in enumerate(widths):
        px = np.random.RandomState(i).randint(0, 256, (8, w, 3), dtype=np.uint8)
        Image.fromarray(px).save(folder / "images" / f"l{i}.png")
        images.append({"id": i + 1, "file_name": f"l{i}.png", "width": w, "height": 8, "split": "eval"})
    labels = folder / "labels.json"
    labels.write_text(json.dumps({"images": images, "annotations": [], "categories": []}))
    return labels, folder / "images"


def test_the_widths_max_width_squeezes():
    assert squeezed_width((8, 32), SPEC) is None            # 64 px at height 16: fits exactly
    assert squeezed_width((8, 33), SPEC) == 66               # would be 66 px: squeezed to 64
    fixed = input_spec({"input": {"shape": [1, 1, 16, 64], "color": "GRAY"}})
    assert squeezed_width((8, 400), fixed) is None           # a fixed width is a stretch the sidecar asked for


def test_squeezed_images_are_named_in_one_note(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path / "home"))
    labels, images = _lines(tmp_path / "corpus", [20, 200, 48])
    fixtures = build_fixtures(SPEC, labels, images)
    assert [fx.squeezed for fx in fixtures] == [None, 400, 96]
    for fx in fixtures:
        fx.preprocess = SPEC
    note = squeeze_note(fixtures)
    assert note.startswith("2 of 3 images are wider than max_width 64 at the model's height and are squeezed")
    assert "widest: l1.png, 400 px" in note and "raise 'max_width'" in note
    again = build_fixtures(SPEC, labels, images)            # from the tensor cache: the same answer
    assert [fx.squeezed for fx in again] == [None, 400, 96]
    assert squeeze_note(build_fixtures(SPEC, *_lines(tmp_path / "narrow", [20, 30]))) is None
