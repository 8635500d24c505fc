"""A decode plug-in receives each fixture's geometry (a letterbox's scale, pad offsets and the original size)
when it declares a `geometry` parameter; one written without it keeps working. Through `quantbench equiv` on
the local host with non-square images: the plug-in places a box from the geometry alone, and accuracy maps it
back to the image through the same geometry (AP50 1 against whole-image labels)."""

import contextlib
import json

import numpy as np
import pytest
from PIL import Image

from decode_helpers import GEOMETRY_SIZES, RECORD_GEOMETRY, input_matmul_head, make_variants
from quantbench.analysis.decode import decode, spec_from_sidecar
from quantbench.cli import main
from quantbench.inputs import plugins

SIZE = 32
SIZES = GEOMETRY_SIZES

PLUGIN = RECORD_GEOMETRY + '''
def whole(outputs, spec, geometry=None):
    """One box: the image's place in the input, from the geometry alone."""
    record(geometry)
    (top, left), (h, w) = geometry["offset"], geometry["resized"]
    return {"cls": [0], "score": [0.9], "kept": [True], "box": [[left, top, left + w, top + h]]}

def old(outputs, spec):
    return {"cls": [0], "score": [0.9], "kept": [True]}

def keywords(outputs, spec, **extra):
    return {"cls": [0], "score": [float(extra["geometry"]["image_size"][1])], "kept": [True]}
'''


def test_a_plugin_gets_the_geometry_only_when_it_declares_it(tmp_path):
    plugins.allow_all()
    (tmp_path / "geo.py").write_text(PLUGIN)
    geo = {"image_size": [30, 60], "offset": [8, 0], "resized": [16, 32]}
    outputs = {"output": np.zeros((1, 4), np.float32)}
    spec = spec_from_sidecar({"decode": {"kind": f"{tmp_path / 'geo.py'}:whole"}})
    assert decode(spec, outputs, geo).box.tolist() == [[0, 8, 32, 24]]
    assert decode(spec_from_sidecar({"decode": {"kind": f"{tmp_path / 'geo.py'}:old"}}), outputs, geo).score.tolist() == [0.9]
    assert decode(spec_from_sidecar({"decode": {"kind": f"{tmp_path / 'geo.py'}:keywords"}}), outputs,
                  geo).score.tolist() == [60.0]


@pytest.mark.parametrize("pad", ["center", "top-left"])
def test_equiv_gives_the_plugin_each_fixtures_geometry_and_accuracy_undoes_it(tmp_path, capsys, pad):
    (tmp_path / "geo.py").write_text(PLUGIN)
    ref = f"{tmp_path / 'geo.py'}:whole"
    side = {"classes": ["thing"],
            "input": {"name": "images", "shape": [1, 3, SIZE, SIZE], "scale": 1 / 255, "resize": "letterbox",
                      "pad": pad},
            "decode": {"kind": ref, "box_frame": "input-pixels", "threshold": 0.5}}
    whole_image = [{"id": i, "image_id": i, "category_id": 1, "bbox": [0, 0, w, h]} for i, (h, w) in enumerate(SIZES)]
    vdir, labels = make_variants(tmp_path, lambda p: input_matmul_head(p, np.zeros((1, 4)), SIZE), side,
                                 [{"width": w, "height": h} for h, w in SIZES], SIZE, annotations=whole_image,
                                 categories=[{"id": 1, "name": "thing"}])
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate(SIZES):     # the images themselves non-square
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(tmp_path / "images" / f"im{i:02d}.png")
    with contextlib.chdir(tmp_path):
        code = main(["equiv", "--hosts", "x86", "--variants", str(vdir), "--fixtures", str(labels), "--decode", ref,
                     "--no-progress", "--no-plots"])
    assert code == 0, capsys.readouterr().err
    seen = {tuple(g["image_size"]): g for g in map(json.loads, (tmp_path / "seen.jsonl").read_text().splitlines())}
    assert sorted(seen) == sorted(SIZES)
    wide = seen[(30, 60)]
    assert wide["resized"] == [16, 32] and wide["offset"] == ([8, 0] if pad == "center" else [0, 0])
    assert wide["input_size"] == [SIZE, SIZE] and wide["resize"] == "letterbox"
    report = (tmp_path / "results" / "report.md").read_text()
    assert "| fp32 | 1.000 / 1.000" in report   # each placed box is its whole image again: AP50 and AP50:95 1
