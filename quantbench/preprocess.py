"""Image -> input tensor, exactly as the model's sidecar says.

One function used everywhere a tensor is made from an image (calibration,
evaluation fixtures, training), so that a fixture hash means the same pixels
under the same arithmetic.

Sidecar "input" block:
    {"name": "images", "shape": [1, 3, 128, 128], "layout": "NCHW", "color": "RGB",
     "dtype": "float32", "scale": 1/255, "mean": [..3..], "std": [..3..]}
tensor = ((pixels_uint8 * scale) - mean) / std, computed in float32, resized
with PIL bilinear only when the image size differs from the model's.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from quantbench.errors import UserError

LUMA_709 = (0.2126, 0.7152, 0.0722)


def load_rgb(path: str | os.PathLike) -> np.ndarray:
    """Decode an image file to HxWx3 uint8 RGB; a corrupt file is a UserError naming it."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: image file not found")
    try:
        with Image.open(path) as im:
            im.load()
            return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise UserError(f"{path}: not a readable image ({exc})") from None


def luminance(rgb: np.ndarray) -> float:
    """Mean Rec. 709 luma of decoded RGB pixels, 0..255: 0.2126 R + 0.7152 G + 0.0722 B.

    Computed on the gamma-encoded 8-bit values (luma, not linear luminance), in float64.
    """
    rgb = np.asarray(rgb, dtype=np.float64)
    return float((rgb @ np.asarray(LUMA_709)).mean())


def input_spec(sidecar: dict | None, model_input_shape=None, model_input_name: str | None = None,
               source: str = "model") -> dict:
    """The preprocessing recipe: the sidecar's input block, or plain 0..1 scaling of a static input.

    `model_input_shape` holds the model's dims (None for dynamic ones, see
    modelio.dims_of); a sidecar shape must agree with every static dim. Without a
    sidecar shape only a dynamic batch is filled in (with 1): a dynamic height or
    width is the user's to state, never guessed. `source` names the model in errors.
    """
    spec = dict((sidecar or {}).get("input") or {})
    if model_input_name and "name" not in spec:
        spec["name"] = model_input_name
    dims = None if model_input_shape is None else list(model_input_shape)
    if "shape" not in spec:
        if dims is None:
            raise UserError(f"{source}: no input shape: give the model a sidecar JSON with an 'input' block")
        if any(d is None for d in dims[1:]):
            shown = ["?" if d is None else d for d in dims]
            raise UserError(f"{source}: input {spec.get('name')!r} has dynamic dims {shown}; give the model a sidecar "
                            "JSON with an 'input' block stating 'shape' (and mean, std), or pass --sidecar FILE")
        spec["shape"] = [1 if d is None else d for d in dims]
    elif dims is not None:
        want = list(spec["shape"])
        if len(dims) != len(want) or any(d is not None and d != w for d, w in zip(dims, want)):
            shown = ["?" if d is None else d for d in dims]
            raise UserError(f"{source}: input {spec.get('name')!r} has shape {shown} but the preprocessing makes "
                            f"{want}; fix the sidecar's input block or pass the matching model")
    spec.setdefault("layout", "NCHW")
    spec.setdefault("color", "RGB")
    spec.setdefault("dtype", "float32")
    spec.setdefault("scale", 1.0 / 255.0)
    spec.setdefault("mean", [0.0, 0.0, 0.0])
    spec.setdefault("std", [1.0, 1.0, 1.0])
    return spec


def to_tensor(rgb: np.ndarray, spec: dict) -> np.ndarray:
    """HxWx3 uint8 -> the model input tensor (batch 1) per `spec`."""
    shape = list(spec["shape"])
    if spec["layout"] == "NCHW":
        _, c, h, w = shape
    elif spec["layout"] == "NHWC":
        _, h, w, c = shape
    else:
        raise UserError(f"unsupported layout {spec['layout']!r}: use NCHW or NHWC")
    if c != 3:
        raise UserError(f"model input has {c} channels; image preprocessing needs 3 (RGB)")
    if rgb.shape[:2] != (h, w):
        from PIL import Image

        rgb = np.asarray(Image.fromarray(rgb).resize((w, h), Image.BILINEAR), dtype=np.uint8)
    if spec.get("color", "RGB") == "BGR":
        rgb = rgb[..., ::-1]
    x = rgb.astype(np.float32) * np.float32(spec["scale"])
    x = (x - np.asarray(spec["mean"], np.float32)) / np.asarray(spec["std"], np.float32)
    x = x[None]
    if spec["layout"] == "NCHW":
        x = x.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(x, dtype=np.dtype(spec["dtype"]))
