"""The gallery's thumbnail of a transpose_hw model shows the image upright.

Was: gallery.tensor_rgb undid the layout and the arithmetic but not transpose_hw, so the thumbnails of
such models (PaddleOCR-style recognisers fed W x H) appeared transposed.
"""

from __future__ import annotations

import numpy as np

from quantbench.report.gallery import tensor_rgb
from quantbench.inputs.preprocess import to_tensor


def test_tensor_rgb_undoes_transpose_hw():
    rgb = np.random.default_rng(0).integers(0, 256, size=(4, 6, 3), dtype=np.uint8)
    spec = {"name": "x", "shape": [1, 3, 6, 4], "layout": "NCHW", "color": "RGB", "dtype": "float32",
            "scale": 1 / 255, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "resize": "stretch",
            "transpose_hw": True}
    tensor = to_tensor(rgb, spec)
    assert tensor.shape == (1, 3, 6, 4)
    back = tensor_rgb(tensor, spec)
    assert back.shape == rgb.shape and np.abs(back.astype(int) - rgb.astype(int)).max() <= 1
