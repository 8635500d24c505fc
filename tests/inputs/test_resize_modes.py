"""Sidecar resize modes of `preprocess.to_tensor`: stretch (unchanged bytes), letterbox, center-crop."""

import numpy as np
import pytest
from PIL import Image

from quantbench.errors import UserError
from quantbench.inputs.preprocess import center_crop, letterbox, to_tensor

SPEC = {"shape": [1, 3, 8, 8], "layout": "NCHW", "color": "RGB", "dtype": "float32", "scale": 1 / 255,
        "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]}


def image(h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def test_stretch_is_the_default_and_keeps_the_old_bytes():
    rgb = image(13, 21)
    old = np.asarray(Image.fromarray(rgb).resize((8, 8), Image.BILINEAR), dtype=np.uint8)
    want = np.ascontiguousarray((old.astype(np.float32) * np.float32(1 / 255))[None].transpose(0, 3, 1, 2))
    got = to_tensor(rgb, SPEC)
    assert got.tobytes() == want.tobytes()
    assert to_tensor(rgb, {**SPEC, "resize": "stretch"}).tobytes() == got.tobytes()


def test_letterbox_pads_centred_with_114_like_ultralytics():
    rgb = image(3, 8)                  # r = 1: no scaling; 5 rows of padding, 2 above and 3 below
    out = letterbox(rgb, 8, 8)
    assert (out[:2] == 114).all() and (out[5:] == 114).all()
    assert np.array_equal(out[2:5], rgb)
    wide = image(10, 20)               # r = 0.4 -> 4 x 8, padded 2 above and 2 below with a chosen value
    out = letterbox(wide, 8, 8, [0, 0, 0])
    assert np.array_equal(out[2:6], np.asarray(Image.fromarray(wide).resize((8, 4), Image.BILINEAR)))
    assert (out[:2] == 0).all() and (out[6:] == 0).all()
    x = to_tensor(rgb, {**SPEC, "resize": "letterbox", "pad_value": 0})
    assert x.shape == (1, 3, 8, 8) and float(x[0, :, 0].max()) == 0.0
    with pytest.raises(UserError, match="'pad_value'"):
        to_tensor(rgb, {**SPEC, "resize": "letterbox", "pad_value": 300})


def test_center_crop_like_torchvision_resize_then_center_crop():
    rgb = image(8, 12)
    assert np.array_equal(center_crop(rgb, 8, 8), rgb[:, 2:10])           # short side fits: crop only
    # crop_ratio 0.5: the short side goes to 16 (long side 24), then the centre 8 x 8
    big = np.asarray(Image.fromarray(rgb).resize((24, 16), Image.BILINEAR))
    assert np.array_equal(center_crop(rgb, 8, 8, 0.5), big[4:12, 8:16])
    # torchvision's ImageNet recipe: Resize(256) + CenterCrop(224) is crop_ratio 0.875
    tall = image(300, 200)
    out = center_crop(tall, 224, 224, 0.875)
    ref = np.asarray(Image.fromarray(tall).resize((256, 384), Image.BILINEAR))[80:304, 16:240]
    assert np.array_equal(out, ref)
    x = to_tensor(rgb, {**SPEC, "resize": "center-crop", "crop_ratio": 0.5})
    assert x.shape == (1, 3, 8, 8)
    with pytest.raises(UserError, match="'crop_ratio'"):
        to_tensor(rgb, {**SPEC, "resize": "center-crop", "crop_ratio": 1.5})
    with pytest.raises(UserError, match="'resize' 'squash'"):
        to_tensor(rgb, {**SPEC, "resize": "squash"})
