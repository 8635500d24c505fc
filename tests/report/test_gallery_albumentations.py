"""The gallery's thumbnail of a model fed albumentations' normalisation order ("normalize": "albumentations": mean
and std in 0..1 units, max_pixel_value, no scale) shows the image, not its values stretched."""

from __future__ import annotations

import numpy as np

from quantbench.inputs.preprocess import to_tensor
from quantbench.report.gallery import tensor_rgb


def test_tensor_rgb_undoes_albumentations_normalize():
    rgb = np.random.default_rng(1).integers(0, 256, size=(5, 7, 3), dtype=np.uint8)
    spec = {"name": "x", "shape": [1, 3, 5, 7], "layout": "NCHW", "color": "RGB", "dtype": "float32",
            "normalize": "albumentations", "max_pixel_value": 255.0, "mean": [0.485, 0.456, 0.406],
            "std": [0.229, 0.224, 0.225]}
    back = tensor_rgb(to_tensor(rgb, spec), spec)
    assert np.abs(back.astype(int) - rgb.astype(int)).max() <= 1
