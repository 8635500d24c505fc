"""albumentations' normalisation order as a sidecar option ("normalize": "albumentations"): a model trained
behind albumentations' Normalize gets its tensors byte for byte, where the default scale-first order differs
by an ulp on some pixels (0 of 41 real fixtures were byte-equal before)."""

import numpy as np
import pytest

from quantbench.errors import UserError
from quantbench.inputs.preprocess import input_spec, to_tensor

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]   # ImageNet, albumentations' defaults
SIDECAR = {"input": {"shape": [1, 3, 24, 32], "mean": MEAN, "std": STD, "normalize": "albumentations"}}


def image(h=24, w=32):
    """Every pixel value 0..255 in every channel, so each value's rounding is checked."""
    v = np.arange(h * w * 3, dtype=np.int64).reshape(h, w, 3) * 7 % 256
    return v.astype(np.uint8)


def documented_formula(rgb, mean, std, mpv=255.0):
    """albumentations' Normalize as its docs and source state it: mean * max_pixel_value and the reciprocal of
    std * max_pixel_value precomputed in float32, then (pixel - mean') * denominator in float32."""
    m = np.array(mean, dtype=np.float32) * mpv
    den = np.reciprocal(np.array(std, dtype=np.float32) * mpv)
    return (rgb.astype(np.float32) - m) * den


def nchw(hwc):
    return np.ascontiguousarray(hwc[None].transpose(0, 3, 1, 2))


def test_tensors_equal_albumentations_own_bytes():
    A = pytest.importorskip("albumentations")
    rgb = image()
    spec = input_spec(SIDECAR, [None, 3, 24, 32])
    got = to_tensor(rgb, spec)
    want = A.Normalize(mean=MEAN, std=STD, max_pixel_value=255.0, p=1.0)(image=rgb)["image"]
    assert want.dtype == np.float32 and got.tobytes() == nchw(want).tobytes()
    gray = {"input": {**SIDECAR["input"], "shape": [1, 1, 24, 32], "color": "GRAY", "mean": [0.5], "std": [0.25],
                      "max_pixel_value": 200}}
    g = to_tensor(rgb, input_spec(gray, [None, 1, 24, 32]))
    lum = to_tensor(rgb, input_spec({"input": {"shape": [1, 1, 24, 32], "color": "GRAY", "dtype": "uint8"}},
                                    [None, 1, 24, 32]))[0, 0]
    w = A.Normalize(mean=[0.5], std=[0.25], max_pixel_value=200, p=1.0)(image=lum[..., None])["image"]
    assert g.tobytes() == nchw(w.reshape(24, 32, 1)).tobytes()


def test_tensors_equal_the_documented_float32_formula_and_differ_from_scale_first():
    rgb = image()
    got = to_tensor(rgb, input_spec(SIDECAR, [None, 3, 24, 32]))
    assert got.tobytes() == nchw(documented_formula(rgb, MEAN, STD)).tobytes()
    scale_first = to_tensor(rgb, input_spec({"input": {k: v for k, v in SIDECAR["input"].items() if k != "normalize"}},
                                            [None, 3, 24, 32]))
    diff = np.abs(scale_first.astype(np.float64) - got)
    assert 0 < diff.max() < 1e-5   # the same numbers up to rounding: the order is what the option changes


@pytest.mark.parametrize("extra, words", [
    ({"scale": 0.5}, "input 'scale' with \"normalize\": \"albumentations\""),
    ({"max_pixel_value": 0}, "input 'max_pixel_value' 0: use a positive number"),
    ({"normalize": "torch"}, "input 'normalize' 'torch': use one of scale-first, albumentations"),
    ({"dtype": "uint8"}, "makes floats"),
    ({"normalize": "scale-first", "max_pixel_value": 255}, "'max_pixel_value' applies to"),
])
def test_bad_normalize_keys_are_one_line_naming_the_key(extra, words):
    with pytest.raises(UserError, match="") as err:
        to_tensor(image(), input_spec({"input": {**SIDECAR["input"], **extra}}, [None, 3, 24, 32]))
    assert words in str(err.value) and "\n" not in str(err.value)
