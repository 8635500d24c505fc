"""Where an image goes in the input (preprocess.Geometry): a letterbox's scale and pad offsets and the original
size, for a non-square image, centred and top-left; recorded with every fixture so decoders can undo it."""

import json

import numpy as np
import pytest
from PIL import Image

from quantbench.inputs.fixtures import build_fixtures
from quantbench.inputs.preprocess import Geometry, boxes_to_image, geometry, to_tensor

SPEC = {"shape": [1, 3, 32, 32], "layout": "NCHW", "color": "RGB", "dtype": "float32", "scale": 1 / 255,
        "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0], "resize": "letterbox", "pad_value": 0}


def wide(h=30, w=60):
    return np.full((h, w, 3), 200, np.uint8)


@pytest.mark.parametrize("pad, offset", [("center", (8, 0)), ("top-left", (0, 0))])
def test_a_non_square_letterbox_gives_its_scale_pad_offsets_and_original_size(pad, offset):
    spec = {**SPEC, "pad": pad}
    g = geometry(spec, (30, 60))
    assert (g.image_size, g.input_size, g.resized, g.offset) == ((30, 60), (32, 32), (16, 32), offset)
    assert g.scale == pytest.approx((16 / 30, 32 / 60)) and g.resize == "letterbox"
    # the tensor holds the image exactly where the geometry says, padding elsewhere
    x = to_tensor(wide(), spec)[0, 0]
    top, left = g.offset
    inside = np.zeros_like(x, bool)
    inside[top:top + 16, left:left + 32] = True
    assert (x[inside] > 0).all() and (x[~inside] == 0).all()
    # a box of the image, placed into the input by the geometry, maps back onto itself
    box = np.array([[6.0, 3.0, 48.0, 27.0]])
    sy, sx = g.scale
    placed = box * [sx, sy, sx, sy] + [left, top, left, top]
    assert np.allclose(g.to_image(placed), box)
    assert np.allclose(boxes_to_image(placed, spec, (30, 60)), box)
    assert Geometry.from_dict(json.loads(json.dumps(g.as_dict()))) == g


def test_other_resizes_and_a_plugin():
    crop = geometry({**SPEC, "resize": "center-crop"}, (30, 60))
    assert crop.resized == (32, 64) and crop.offset == (0, -16)        # 16 columns cropped away on the left
    assert geometry({**SPEC, "resize": "stretch"}, (30, 60)).scale == pytest.approx((32 / 30, 32 / 60))
    dyn = geometry({**SPEC, "resize": "stretch", "shape": [1, 3, 16, -1], "max_width": 40}, (30, 60))
    assert (dyn.resize, dyn.resized, dyn.input_size) == ("keep-ratio", (16, 32), (16, 40))
    assert geometry({**SPEC, "plugin": "p.py:f"}, (30, 60)) is None


def test_fixtures_record_the_geometry_of_each_image(tmp_path):
    (tmp_path / "images").mkdir()
    sizes = {"a.png": (30, 60), "b.png": (50, 20)}
    images = []
    for i, (name, (h, w)) in enumerate(sizes.items()):
        Image.fromarray(wide(h, w)).save(tmp_path / "images" / name)
        images.append({"id": i, "file_name": name, "width": w, "height": h, "split": "eval"})
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"images": images, "annotations": [], "categories": []}))
    fixtures = build_fixtures({**SPEC, "pad": "top-left"}, labels, tmp_path / "images")
    got = {f.source: f.geometry for f in fixtures}
    assert got == {n: geometry({**SPEC, "pad": "top-left"}, hw).as_dict() for n, hw in sizes.items()}
    assert got["b.png"]["resized"] == [32, 13] and got["b.png"]["offset"] == [0, 0]
    assert json.loads(fixtures[0].row(SPEC)["geometry"]) == fixtures[0].geometry
