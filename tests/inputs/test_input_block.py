"""The sidecar's input block: every key validated before anything is written, integer inputs fed
raw pixels, EXIF orientation applied, and the block's options for common exports (GRAY, pad,
dynamic width, transpose_hw), each through calibrate and equiv with real onnxruntime sessions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from model_helpers import save_model
from quantbench.store import partread
from quantbench.cli import main
from quantbench.errors import UserError
from quantbench.inputs.preprocess import input_spec, load_rgb, to_tensor, upright_size

CLASSES = ["a", "b", "c"]


def conv_model(path: Path, channels: int = 3, hw=(8, 8), elem: str = "float32", name: str = "images") -> Path:
    """Conv -> Relu -> GlobalAveragePool -> MatMul: a 3-class classifier; an int input is Cast to float first.

    A dim given as None (or a string) is dynamic (symbolic).
    """
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (4, channels, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.5, (4, 3)).astype(np.float32), "w2")]
    nodes, x = [], name
    ttype = {"float32": TensorProto.FLOAT, "uint8": TensorProto.UINT8, "int64": TensorProto.INT64}[elem]
    if elem != "float32":
        nodes.append(helper.make_node("Cast", [name], ["xf"], to=TensorProto.FLOAT))
        x = "xf"
    nodes += [helper.make_node("Conv", [x, "w"], ["c"], pads=[1, 1, 1, 1]),
              helper.make_node("Relu", ["c"], ["r"]),
              helper.make_node("GlobalAveragePool", ["r"], ["g"]),
              helper.make_node("Flatten", ["g"], ["f"]),
              helper.make_node("MatMul", ["f", "w2"], ["logits"])]
    dims = [1, channels, *["W" if d is None else d for d in hw]]
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info(name, ttype, dims)],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 3])], inits)
    return save_model(g, path, opset=13)


def write_sidecar(model: Path, input_block: dict, **top) -> Path:
    side = {"classes": CLASSES, "input": {"name": "images", **input_block},
            "decode": {"kind": "classifier-softmax", "logits": "logits"}, **top}
    p = model.with_suffix(".json")
    p.write_text(json.dumps(side))
    return p


def corpus(root: Path, sizes, seed: int = 0, n: int = 12, ext: str = "png") -> Path:
    """COCO labels for n images (sizes cycled as (h, w)); the last 3 are the eval split."""
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    coco = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "a"}]}
    for i in range(n):
        h, w = sizes[i % len(sizes)]
        level = 40 + 170 * (i % 5) / 4
        px = np.clip(rng.normal(level, 40, (h, w, 3)), 0, 255).astype(np.uint8)
        name = f"im{i:02d}.{ext}"
        Image.fromarray(px).save(images / name)
        coco["images"].append({"id": i + 1, "file_name": name, "width": w, "height": h,
                               "split": "eval" if i >= n - 3 else "train"})
        if i % 2:
            coco["annotations"].append({"id": i + 1, "image_id": i + 1, "category_id": 1, "bbox": [0, 0, 2, 2]})
    labels = root / "labels.json"
    labels.write_text(json.dumps(coco))
    return labels


def calibrate(model: Path, labels: Path, *extra) -> int:
    return main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2", "--allow-short",
                 "--methods", "dynamic,minmax", "--no-progress", *map(str, extra)])


def equiv(labels: Path) -> int:
    return main(["equiv", "--hosts", "x86", "--fixtures", str(labels), "--no-plots", "--no-progress"])


def fixture_tensors() -> list[np.ndarray]:
    rows = partread.read("fixtures", columns=["source", "dtype", "shape", "tensor"]).to_pylist()
    rows.sort(key=lambda r: r["source"])
    return [np.frombuffer(r["tensor"], dtype=np.dtype(r["dtype"])).reshape(r["shape"]) for r in rows]


def nothing_written(wd: Path) -> bool:
    return not any(p.is_file() for d in ("results", "calib_sets") for p in (wd / d).rglob("*"))


def one_error_line(capsys) -> str:
    raw = capsys.readouterr().err
    lines = [ln for ln in raw.replace("\r", "\n").splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in raw, raw
    return lines[0]


# ---- integer inputs take raw pixels ---------------------------------------------------------

@pytest.mark.parametrize("dtype", ["uint8", "int64"])
def test_integer_input_is_fed_raw_pixels(dtype):
    rgb = np.random.default_rng(1).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    spec = input_spec({"input": {"shape": [1, 3, 8, 8], "dtype": dtype}})
    x = to_tensor(rgb, spec)
    assert x.dtype == np.dtype(dtype)
    assert np.array_equal(x[0].transpose(1, 2, 0), rgb.astype(dtype))


@pytest.mark.parametrize("dtype", ["uint8", "int64"])
def test_integer_input_through_calibrate_and_equiv(workdir, capsys, dtype):
    model = conv_model(workdir / "m" / "q.onnx", elem=dtype)
    write_sidecar(model, {"shape": [1, 3, 8, 8], "dtype": dtype})
    labels = corpus(workdir / "c", [(8, 8)])
    assert calibrate(model, labels) == 0
    assert equiv(labels) == 0
    got = fixture_tensors()
    want = [np.asarray(Image.open(labels.parent / "images" / f"im{i:02d}.png"))[None].transpose(0, 3, 1, 2)
            for i in (9, 10, 11)]
    assert [g.dtype for g in got] == [np.dtype(dtype)] * 3
    assert all(np.array_equal(g, w.astype(dtype)) for g, w in zip(got, want))
    assert max(int(g.max()) for g in got) > 100          # raw pixels, not a cast of 0..1 floats


@pytest.mark.parametrize("block, expect", [
    ({"dtype": "uint8", "scale": 1 / 255}, "input 'dtype' uint8 takes integers"),
    ({"dtype": "uint8", "mean": [0.485, 0.456, 0.406]}, "input 'dtype' uint8 takes integers"),
    ({"dtype": "uint8", "mean": [300, 0, 0], "scale": 1}, "out of the range of uint8"),
])
def test_integer_input_with_lossy_arithmetic_is_refused(workdir, capsys, block, expect):
    elem = block["dtype"]
    model = conv_model(workdir / "m" / "q.onnx", elem=elem)
    side = write_sidecar(model, {"shape": [1, 3, 8, 8], **block})
    labels = corpus(workdir / "c", [(8, 8)])
    assert calibrate(model, labels) == 2
    line = one_error_line(capsys)
    assert str(side) in line and (expect in line or expect.replace("uint8", elem) in line), line
    assert nothing_written(workdir)


# ---- typos in a sidecar ---------------------------------------------------------------------

@pytest.mark.parametrize("edit, expect", [
    ({"input": {"meen": [0, 0, 0]}}, "unknown input key 'meen'"),
    ({"input": {"mena": [0, 0, 0]}}, "unknown input key 'mena'"),
    ({"top": {"decdoe": {}}}, "unknown key 'decdoe'"),
    ({"input": {"color": "CMYK"}}, "input 'color' 'CMYK'"),
    ({"input": {"color": "rgb"}}, "input 'color' 'rgb'"),
    ({"input": {"layout": "CHW"}}, "input 'layout' 'CHW'"),
    ({"input": {"dtype": "float"}}, "input 'dtype' 'float'"),
    ({"input": {"resize": "squash"}}, "input 'resize' 'squash'"),
    ({"input": {"resize": "letterbox", "pad_value": 300}}, "input 'pad_value' 300"),
    ({"input": {"resize": "center-crop", "crop_ratio": 1.5}}, "input 'crop_ratio' 1.5"),
    ({"input": {"shape": [1, 3, 8]}}, "image preprocessing makes 4 dims"),
])
def test_sidecar_typo_is_refused_before_anything_is_written(workdir, capsys, edit, expect):
    model = conv_model(workdir / "m" / "t.onnx")
    side = write_sidecar(model, {"shape": [1, 3, 8, 8], **edit.get("input", {})}, **edit.get("top", {}))
    labels = corpus(workdir / "c", [(8, 8)])
    assert calibrate(model, labels) == 2
    line = one_error_line(capsys)
    assert str(side) in line and expect in line, line
    if "unknown" in expect:     # the valid ones are listed
        assert ("'mean'" in line and "'std'" in line) if "input" in expect else ("'decode'" in line)
    assert nothing_written(workdir)


# ---- EXIF orientation -------------------------------------------------------------------------

def test_exif_orientation_is_applied(tmp_path):
    px = np.zeros((4, 8, 3), np.uint8)
    px[:, :4] = 255                                   # left half white, as stored
    exif = Image.Exif()
    exif[0x0112] = 6                                  # "rotate 90 CW to view": a phone held upright
    Image.fromarray(px).save(tmp_path / "p.jpg", quality=100, exif=exif)
    Image.fromarray(px).save(tmp_path / "plain.jpg", quality=100)
    rgb = load_rgb(tmp_path / "p.jpg")
    assert rgb.shape == (8, 4, 3)                     # upright: the stored rows became columns
    assert rgb[:4].mean() > 200 and rgb[4:].mean() < 50   # stored left half is now on top
    assert load_rgb(tmp_path / "plain.jpg").shape == (4, 8, 3)
    assert upright_size(tmp_path / "p.jpg") == (8, 4) and upright_size(tmp_path / "plain.jpg") == (4, 8)


# ---- options for common exports: GRAY, pad, dynamic width, transpose_hw ------------------------

def _px(labels: Path, i: int) -> np.ndarray:
    return np.asarray(Image.open(labels.parent / "images" / f"im{i:02d}.png").convert("RGB"))


def _gray(rgb: np.ndarray) -> np.ndarray:
    return np.asarray(Image.fromarray(rgb).convert("L"), np.float32)


def _want_gray(rgb):                       # 8x8 -> 8x8: no resize, ITU-R 601-2 luma / 255
    return (_gray(rgb) * np.float32(1 / 255))[None, None]


def _want_top_left(rgb):                   # 4x8 into 8x8: r = 1, image on rows 0..3, rows 4..7 padded with 0
    x = np.zeros((8, 8, 3), np.float32)
    x[:4] = rgb.astype(np.float32) * np.float32(1 / 255)
    return x.transpose(2, 0, 1)[None]


def _want_dynamic(rgb):                    # height 8, aspect kept, at most 16 wide, zeros on the right
    h, w = rgb.shape[:2]
    nw = min(-(-8 * w // h), 16)
    small = np.asarray(Image.fromarray(rgb).resize((nw, 8), Image.BILINEAR)) if (h, w) != (8, nw) else rgb
    x = np.zeros((8, 16), np.float32)
    x[:, :nw] = _gray(small) * np.float32(1 / 255)
    return x[None, None]


def _want_transposed(rgb):                 # a 6x8 image fed as 8x6: tensor[c, i, j] = image[j, i, c]
    return (rgb.astype(np.float32) * np.float32(1 / 255)).transpose(2, 1, 0)[None]


OPTIONS = {
    "gray": (dict(channels=1), {"shape": [1, 1, 8, 8], "color": "GRAY", "mean": [0], "std": [1]}, [(8, 8)],
             _want_gray),
    "pad-top-left": (dict(), {"shape": [1, 3, 8, 8], "resize": "letterbox", "pad": "top-left", "pad_value": 0},
                     [(4, 8)], _want_top_left),
    "dynamic-width": (dict(channels=1, hw=(8, None)),
                      {"shape": [1, 1, 8, -1], "color": "GRAY", "max_width": 16}, [(8, 4), (16, 8), (8, 40)],
                      _want_dynamic),
    "dynamic-width-named": (dict(channels=1, hw=(8, None)),
                            {"shape": [1, 1, 8, "W"], "color": "GRAY", "max_width": 16}, [(8, 4), (16, 8), (8, 40)],
                            _want_dynamic),
    "transpose-hw": (dict(hw=(8, 6)), {"shape": [1, 3, 8, 6], "transpose_hw": True}, [(6, 8)], _want_transposed),
}


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_input_option_through_calibrate_and_equiv(workdir, capsys, option):
    model_kw, block, sizes, want = OPTIONS[option]
    model = conv_model(workdir / "m" / "opt.onnx", **model_kw)
    write_sidecar(model, block)
    labels = corpus(workdir / "c", sizes)
    assert calibrate(model, labels) == 0, capsys.readouterr().err
    assert equiv(labels) == 0, capsys.readouterr().err
    squeezed = [ln for ln in capsys.readouterr().out.splitlines() if "are squeezed" in ln]
    # a dynamic width squeezes the widest image to max_width: the plan says so, once
    assert len(squeezed) == (1 if option.startswith("dynamic-width") else 0), squeezed
    got = fixture_tensors()
    assert len(got) == 3
    for g, i in zip(got, (9, 10, 11)):
        w = want(_px(labels, i))
        assert g.shape == w.shape and g.dtype == np.float32
        assert np.array_equal(g, w), (option, i)


def test_gray_is_pil_luma_and_dynamic_width_pads_right():
    rgb = np.random.default_rng(2).integers(0, 256, (8, 4, 3), dtype=np.uint8)
    spec = input_spec({"input": {"shape": [1, 1, 8, -1], "color": "GRAY", "max_width": 10}}, [1, 1, 8, None])
    x = to_tensor(rgb, spec)
    luma = (rgb[..., 0].astype(int) * 299 + rgb[..., 1].astype(int) * 587 + rgb[..., 2].astype(int) * 114) / 1000
    assert x.shape == (1, 1, 8, 10) and (x[0, 0, :, 4:] == 0).all()
    assert np.abs(x[0, 0, :, :4] * 255 - luma).max() <= 0.5 + 1e-4      # PIL's "L" rounds the same formula
    # transposed: the image's width runs along the model's H axis, padded at its end
    t = to_tensor(rgb, input_spec({"input": {"shape": [1, 1, "W", 8], "color": "GRAY", "max_width": 10,
                                             "transpose_hw": True}}, [1, 1, None, 8]))
    assert t.shape == (1, 1, 10, 8) and np.array_equal(t[0, 0], x[0, 0].T)


def test_boxes_map_back_through_each_geometry():
    from quantbench.inputs.preprocess import boxes_to_image

    spec = input_spec({"input": {"shape": [1, 3, 8, 8], "resize": "letterbox", "pad": "top-left"}})
    assert boxes_to_image(np.array([[0, 0, 8, 4]]), spec, (4, 8)).tolist() == [[0, 0, 8, 4]]
    spec = input_spec({"input": {"shape": [1, 1, 8, -1], "color": "GRAY", "max_width": 16}})
    assert boxes_to_image(np.array([[0, 0, 4, 8]]), spec, (16, 8)).tolist() == [[0, 0, 8, 16]]
    spec = input_spec({"input": {"shape": [1, 3, 8, 6], "transpose_hw": True}})
    assert boxes_to_image(np.array([[1, 2, 3, 4]]), spec, (6, 8)).tolist() == [[2, 1, 4, 3]]


@pytest.mark.parametrize("model_kw, block, expect", [
    (dict(channels=1), {"shape": [1, 1, 8, 8]}, 'model input has 1 channel(s) ([1, 1, 8, 8]) but the input block '
                                                'makes 3 (RGB); set "color": "GRAY"'),
    (dict(channels=1), {}, 'set "color": "GRAY"'),
    (dict(), {"shape": [1, 3, 8, 8], "color": "GRAY"}, 'set "color": "RGB"'),
    (dict(channels=1), {"shape": [1, 1, 8, 8], "color": "GRAY", "mean": [0.5, 0.5, 0.5]},
     "input 'mean' must be a list of 1 number, one per channel of GRAY"),
    (dict(), {"shape": [1, 3, 8, 8], "resize": "letterbox", "pad": "bottom"}, "input 'pad' 'bottom': use one of "
                                                                            "center, top-left"),
    (dict(), {"shape": [1, 3, 8, 8], "pad": "top-left"}, "input 'pad' applies to \"resize\": \"letterbox\" only"),
    (dict(channels=1, hw=(8, None)), {"shape": [1, 1, 8, -1], "color": "GRAY"}, "has a dynamic width: give "
                                                                               "'max_width'"),
    (dict(channels=1, hw=(8, None)), {"shape": [1, 1, 8, -1], "color": "GRAY", "max_width": 0},
     "input 'max_width' 0"),
    (dict(channels=1, hw=(None, 8)), {"shape": [1, 1, -1, 8], "color": "GRAY", "max_width": 16},
     "only the image width dynamic"),
    (dict(channels=1, hw=(8, None)), {"shape": [1, 1, 8, -1], "color": "GRAY", "max_width": 16, "resize": "letterbox"},
     "a dynamic width keeps the aspect ratio"),
    (dict(), {"shape": [1, 3, 8, 8], "max_width": 16}, "'max_width' applies to a dynamic width only"),
    (dict(), {"shape": [1, 3, 8, 8], "transpose_hw": "yes"}, "input 'transpose_hw' 'yes': use one of true, false"),
])
def test_bad_input_option_is_refused_before_anything_is_written(workdir, capsys, model_kw, block, expect):
    model = conv_model(workdir / "m" / "bad.onnx", **model_kw)
    side = write_sidecar(model, block)
    labels = corpus(workdir / "c", [(8, 8)])
    assert calibrate(model, labels) == 2
    line = one_error_line(capsys)
    assert str(side) in line and expect in line, line
    assert nothing_written(workdir)


# ---- a real dynamic-width export: PaddleOCR's PP-OCRv4 recogniser from a wheel -----------------

PPOCR_REC = dict(key="ppocr-rec", wheel="rapidocr-onnxruntime", version="1.4.4",
                 member="rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                 sha256="48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b")


def _rapidocr_resize_norm_img(rgb: np.ndarray) -> np.ndarray:
    """rapidocr_onnxruntime 1.4.4 ch_ppocr_rec/text_recognize.py resize_norm_img for one image (rec_img_shape
    [3, 48, 320], so max_wh_ratio >= 320 / 48), its image loaded as BGR; PIL bilinear stands in for cv2.resize."""
    import math

    img = rgb[..., ::-1]
    img_height, img_width = 48, int(48 * max(320 / 48, rgb.shape[1] / rgb.shape[0]))
    ratio = img.shape[1] / float(img.shape[0])
    resized_w = img_width if math.ceil(img_height * ratio) > img_width else int(math.ceil(img_height * ratio))
    resized = np.asarray(Image.fromarray(rgb).resize((resized_w, img_height), Image.BILINEAR))[..., ::-1]
    resized = resized.astype("float32").transpose((2, 0, 1)) / 255
    resized -= 0.5
    resized /= 0.5
    padding_im = np.zeros((3, img_height, img_width), dtype=np.float32)
    padding_im[:, :, 0:resized_w] = resized
    return padding_im[None]


@pytest.mark.slow
def test_paddleocr_recogniser_dynamic_width_through_calibrate_and_equiv(workdir, capsys):
    """PP-OCRv4 rec (input x [N, 3, ?, W]): fed as RapidOCR feeds it, aspect kept at height 48, padded to 320."""
    import onnxruntime as ort
    from real_models import FetchError, RealModel, fetch
    from setup_required import missing_setup

    try:
        src = fetch(RealModel(**PPOCR_REC, sidecar={}, kind="recogniser", tile=(0, 0), train_tiles=0, eval_tiles=0))
    except FetchError as exc:
        missing_setup(f"cannot fetch the wheel here: {exc}")
    model = workdir / "m" / "ppocr-rec.onnx"
    model.parent.mkdir(parents=True)
    model.write_bytes(src.read_bytes())
    side = {"input": {"name": "x", "shape": [1, 3, 48, -1], "max_width": 320, "color": "BGR", "scale": 1 / 255,
                      "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}, "decode": {"kind": "none"}}
    model.with_suffix(".json").write_text(json.dumps(side))
    labels = corpus(workdir / "c", [(32, 100), (40, 90), (24, 260)], n=8)   # 3 eval: the last one is capped at 320
    assert main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "1", "--allow-short",
                 "--methods", "minmax", "--no-progress"]) == 0, capsys.readouterr().err
    assert equiv(labels) == 0, capsys.readouterr().err
    got = fixture_tensors()
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for g, i in zip(got, (5, 6, 7)):
        rgb = _px(labels, i)
        want = _rapidocr_resize_norm_img(rgb) if rgb.shape[1] / rgb.shape[0] <= 320 / 48 else None
        assert g.shape == (1, 3, 48, 320)
        if want is not None:        # RapidOCR widens past 320 for a wider image; max_width caps it
            # same geometry and padding; x / 255 - 0.5 rounds a last bit unlike x * (1/255) - 0.5
            assert np.abs(g - want).max() <= 1e-6
        y = sess.run(None, {"x": g})[0]
        assert y.shape == (1, 40, 6625) and np.isfinite(y).all()
