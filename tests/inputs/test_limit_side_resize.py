"""DBNet's "limit the side to N" resize (PaddleOCR's DetResizeForTest, limit_type min / max / resize_long, each
side rounded to a multiple of 32) as "resize": "limit-side": each image its own input size, the geometry recorded;
and the one-line note naming images a fixed input size squeezes (aspect changed), as max_width's note does."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
from PIL import Image

from bench_helpers import fp32_and_dynamic
from model_helpers import save_model
from quantbench.cli import main
from quantbench.errors import UserError
from quantbench.inputs.fixtures import build_fixtures, squeeze_note
from quantbench.inputs.preprocess import geometry, input_spec, limit_side, to_tensor
from quantbench.store import partread

SIDE = {"input": {"shape": [1, 3, -1, -1], "resize": "limit-side", "limit_side_len": 736, "limit_type": "min",
                  "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}


def det_resize_for_test(h, w, limit_side_len, limit_type):
    """PaddleOCR's DetResizeForTest.resize_image_type0, its size arithmetic as written there."""
    if limit_type == "max":
        if max(h, w) > limit_side_len:
            ratio = float(limit_side_len) / h if h > w else float(limit_side_len) / w
        else:
            ratio = 1.0
    elif limit_type == "min":
        if min(h, w) < limit_side_len:
            ratio = float(limit_side_len) / h if h < w else float(limit_side_len) / w
        else:
            ratio = 1.0
    else:
        ratio = float(limit_side_len) / max(h, w)
    resize_h, resize_w = int(h * ratio), int(w * ratio)
    return max(int(round(resize_h / 32) * 32), 32), max(int(round(resize_w / 32) * 32), 32)


@pytest.mark.parametrize("limit_type", ["min", "max", "resize_long"])
def test_sizes_are_paddleocrs_det_resize_for_test(limit_type):
    for h, w in [(480, 640), (640, 480), (100, 1000), (1200, 900), (33, 47), (736, 736), (2000, 300)]:
        assert limit_side(h, w, 736, limit_type) == det_resize_for_test(h, w, 736, limit_type), (h, w)


def test_each_image_gets_its_own_size_and_geometry():
    spec = input_spec(SIDE, [None, 3, None, None])
    rgb = np.random.default_rng(0).integers(0, 256, (300, 500, 3), dtype=np.uint8)
    x = to_tensor(rgb, spec)
    assert x.shape == (1, 3, 736, 1216)     # 736 / 300 = 2.4533: 300 -> 736, 500 -> 1226 -> 1216
    g = geometry(spec, (300, 500))
    assert (g.resized, g.input_size, g.offset, g.resize) == ((736, 1216), (736, 1216), (0, 0), "limit-side")
    assert np.allclose(g.to_image([[0, 0, 1216, 736]]), [[0, 0, 500, 300]])
    small = to_tensor(rgb, input_spec({"input": {**SIDE["input"], "limit_type": "max", "limit_side_len": 320}},
                                      [None, 3, None, None]))
    assert small.shape == (1, 3, 192, 320)   # 320 / 500: 300 -> 192


@pytest.mark.parametrize("extra, words", [
    ({"shape": [1, 3, 736, -1]}, "H and W dynamic"),
    ({"limit_side_len": 0}, "'limit_side_len' 0"),
    ({"limit_type": "long"}, "input 'limit_type' 'long': use one of min, max, resize_long"),
    ({"resize": "stretch", "shape": [1, 3, 32, 32]}, "'limit_side_len' applies to \"resize\": \"limit-side\" only"),
])
def test_bad_limit_side_keys_are_one_line(extra, words):
    with pytest.raises(UserError) as err:
        to_tensor(np.zeros((8, 8, 3), np.uint8), input_spec({"input": {**SIDE["input"], **extra}}, [None, 3, None, None]))
    assert words in str(err.value) and "\n" not in str(err.value)


def _images(folder, sizes) -> tuple:
    (folder / "images").mkdir(parents=True)
    images = []
    for i, (h, w) in enumerate(sizes):
        Image.fromarray(np.full((h, w, 3), 90 + i, np.uint8)).save(folder / "images" / f"p{i}.png")
        images.append({"id": i, "file_name": f"p{i}.png", "width": w, "height": h, "split": "eval"})
    (folder / "labels.json").write_text(json.dumps({"images": images, "annotations": [], "categories": []}))
    return folder / "labels.json", folder / "images"


def test_a_fixed_size_that_squeezes_images_is_named_in_one_note(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path / "home"))
    labels, images = _images(tmp_path / "c", [(32, 32), (30, 40), (20, 80)])
    stretch = input_spec({"input": {"shape": [1, 3, 32, 32]}})
    note = squeeze_note(build_fixtures(stretch, labels, images))
    assert note.startswith('2 of 3 images are squeezed by "resize": "stretch" to the input\'s 32x32, aspect changed '
                           "by more than 10% (most: p2.png, 80x20 -> 32x32)"), note
    assert "\n" not in note and "set 'resize' in the sidecar" in note
    letterbox = input_spec({"input": {"shape": [1, 3, 32, 32], "resize": "letterbox"}})
    assert squeeze_note(build_fixtures(letterbox, labels, images)) is None
    fixtures = build_fixtures(input_spec(SIDE, [None, 3, None, None]), labels, images)
    assert [f.array.shape for f in fixtures] == [(1, 3, 736, 736), (1, 3, 736, 992), (1, 3, 736, 2944)]
    assert squeeze_note(fixtures) is None


def dynamic_map_model(path):
    """images [1, 3, H, W] -> map [1, 1, H, W]: DBNet's probability map in miniature (a 3x3 convolution, sigmoid),
    any size: bright pixels are text."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.full((1, 3, 3, 3), 1.0, np.float32)
    nodes = [helper.make_node("Conv", ["images", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["map"])]
    g = helper.make_graph(nodes, "db", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, "H", "W"])],
                          [helper.make_tensor_value_info("map", TensorProto.FLOAT, [1, 1, "H", "W"])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([-2.0], np.float32), "b")])
    return save_model(g, path)


def test_equiv_runs_a_map_model_on_limit_side_fixtures_and_maps_regions_back(tmp_path, capsys, monkeypatch):
    """Each image at its own multiple-of-32 size through onnxruntime; the map's region (a bright block) is mapped back
    through each fixture's geometry onto the labelled block: AP50 1."""
    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path / "home"))
    side = {"classes": ["text"], "input": {"name": "images", "shape": [1, 3, -1, -1], "resize": "limit-side",
                                           "limit_side_len": 64, "limit_type": "max", "scale": 1 / 255},
            "decode": {"kind": "threshold-map", "threshold": 0.5}}
    vdir = fp32_and_dynamic(tmp_path / "variants", dynamic_map_model, side, "db", op_types=("Conv",))
    (tmp_path / "images").mkdir()
    images, anns = [], []
    for i, (h, w, box) in enumerate([(100, 200, [40, 20, 80, 40]), (150, 90, [10, 50, 60, 50])]):
        px = np.zeros((h, w, 3), np.uint8)
        x, y, bw, bh = box
        px[y:y + bh, x:x + bw] = 255
        Image.fromarray(px).save(tmp_path / "images" / f"d{i}.png")
        images.append({"id": i, "file_name": f"d{i}.png", "width": w, "height": h, "split": "eval"})
        anns.append({"id": i, "image_id": i, "category_id": 1, "bbox": box})
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"images": images, "annotations": anns, "categories": [{"id": 1, "name": "text"}]}))
    with contextlib.chdir(tmp_path):
        code = main(["equiv", "--hosts", "x86", "--variants", str(vdir), "--fixtures", str(labels), "--no-progress",
                     "--no-plots"])
    assert code == 0, capsys.readouterr().err
    fx = partread.read("fixtures", root=tmp_path / "results" / "tables", columns=["source", "shape"]).to_pylist()
    assert sorted((r["source"], r["shape"]) for r in fx) == [("d0.png", [1, 3, 32, 64]), ("d1.png", [1, 3, 64, 32])]
    assert "| fp32 | 1.000 / " in (tmp_path / "results" / "report.md").read_text()
