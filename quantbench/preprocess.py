"""Image -> input tensor, exactly as the model's sidecar says.

One function used everywhere a tensor is made from an image (calibration,
evaluation fixtures, training), so that a fixture hash means the same pixels
under the same arithmetic.

Sidecar "input" block:
    {"name": "images", "shape": [1, 3, 128, 128], "layout": "NCHW", "color": "RGB",
     "dtype": "float32", "scale": 1/255, "mean": [..3..], "std": [..3..]}
tensor = ((pixels_uint8 * scale) - mean) / std, computed in float32, resized
with PIL bilinear only when the image size differs from the model's.

Optional keys of the input block, read by `to_tensor`:
    "resize": "stretch"      (default) both sides to the model's H x W, aspect ratio lost;
              "letterbox"    keep the aspect ratio, scale to fit, pad centred with
                             "pad_value" (default 114, or [r, g, b]), as Ultralytics' LetterBox;
              "center-crop"  scale the short side to the target / "crop_ratio" (default 1.0;
                             0.875 is torchvision's Resize(256) + CenterCrop(224)), crop the centre.
    "plugin": "module:function" (or "path/to/file.py:function")  replaces all of the above:
              fn(rgb: np.ndarray HxWx3 uint8, spec: dict) -> np.ndarray, the batch-1 input tensor;
              its dtype must be spec["dtype"] and its shape spec["shape"] (a None or
              non-positive dim there accepts any size).
Every resize is PIL bilinear on the uint8 pixels, so the same image gives the same bytes.

Limits (checked before anything is allocated, each a UserError naming the file):
  MAX_INPUT_ELEMENTS  an input tensor holds at most 2**28 elements (1 GiB of float32);
                      a model or sidecar declaring more is refused.
  MAX_IMAGE_PIXELS    an image is at most 100 megapixels (width x height), read from
                      the file's header before its pixels are decoded.
Decoding: every image becomes 8-bit RGB, upright: an EXIF orientation (phone photos) is
applied first (PIL.ImageOps.exif_transpose), so the pixels are those a viewer shows. 16-bit samples are reduced to 8 bits by
``v >> 8`` (the high byte; Pillow does the same for 16-bit RGB PNGs, and an 8-bit
image widened as ``v * 257`` comes back exactly); grayscale is replicated to R, G, B.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

import numpy as np

from quantbench import plugins
from quantbench.errors import UserError

LUMA_709 = (0.2126, 0.7152, 0.0722)
RESIZE_MODES = ("stretch", "letterbox", "center-crop")
DEFAULT_PAD_VALUE = 114


MAX_INPUT_ELEMENTS = 2 ** 28
MAX_IMAGE_PIXELS = 100_000_000


def load_rgb(path: str | os.PathLike) -> np.ndarray:
    """Decode an image file to HxWx3 uint8 RGB; a corrupt or oversized file is a UserError naming it."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: image file not found")
    try:
        with warnings.catch_warnings():  # our own cap below replaces Pillow's bomb warning
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                _check_pixels(path, *im.size)
                im.load()
                return _to_rgb8(_upright(im))
    except Image.DecompressionBombError as exc:  # Pillow refused in open() (over twice its own limit)
        import re

        m = re.search(r"\((\d+) pixels\)", str(exc))
        size = f"{int(m.group(1)) / 1e6:.0f} megapixels" if m else "larger than that"
        raise UserError(f"{path}: image is {size}, more than the limit of {MAX_IMAGE_PIXELS // 1_000_000} "
                        "megapixels; resize it first") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise UserError(f"{path}: not a readable image ({exc})") from None


def _upright(im):
    """The image as it is meant to be viewed: its EXIF orientation (phone photos) applied, else itself."""
    from PIL import ImageOps

    if im.getexif().get(0x0112, 1) in (1, None):   # 0x0112: Orientation; 1 is upright
        return im
    return ImageOps.exif_transpose(im)


def _check_pixels(path, width: int, height: int) -> None:
    if width * height > MAX_IMAGE_PIXELS:
        raise UserError(f"{path}: image is {width * height / 1e6:.0f} megapixels ({width}x{height}), more than "
                        f"the limit of {MAX_IMAGE_PIXELS // 1_000_000} megapixels; resize it first")


def _to_rgb8(im) -> np.ndarray:
    """8-bit RGB of a decoded image: integer modes wider than 8 bits (16-bit PNG gray is I;16 or I) by v >> 8."""
    if im.mode.startswith("I"):  # "I;16", "I;16B", "I;16L", "I" (32-bit int holding 16-bit samples)
        v = np.asarray(im).astype(np.int64)
        gray = (np.clip(v, 0, 65535) >> 8).astype(np.uint8)
        return np.ascontiguousarray(np.repeat(gray[..., None], 3, axis=2))
    if im.mode == "F":
        raise ValueError("floating-point pixels (mode F) have no defined 8-bit scaling")
    return np.asarray(im.convert("RGB"), dtype=np.uint8)


INPUT_KEYS = ("name", "shape", "layout", "color", "dtype", "scale", "mean", "std", "resize", "pad_value",
              "crop_ratio", "plugin")
LAYOUTS = ("NCHW", "NHWC")
COLORS = ("RGB", "BGR")
DTYPES = ("float32", "float16", "float64", "uint8", "int8", "uint16", "int16", "int32", "int64")


def check_input_block(block, source) -> dict:
    """Validate a sidecar 'input' block or a full preprocessing spec (only the keys present); returns it.

    Every key must be one of INPUT_KEYS and every value one the preprocessing knows (layout,
    color, dtype, resize, pad_value, crop_ratio). Shape: positive integers, at most
    MAX_INPUT_ELEMENTS elements; mean and std: one finite number per channel (3), std
    non-zero; scale: a finite non-zero number. An integer dtype takes integers: the
    arithmetic must map every pixel value 0..255 to an integer in the dtype's range.
    """
    if not isinstance(block, dict):
        raise UserError(f"{source}: 'input' must be an object like {{\"shape\": [1, 3, 224, 224], ...}}, "
                        f"not {type(block).__name__}")
    unknown = [k for k in block if k not in INPUT_KEYS]
    if unknown:
        raise UserError(f"{source}: unknown input key {unknown[0]!r}; the input block takes "
                        f"{', '.join(map(repr, INPUT_KEYS))}")
    if "shape" in block:
        _check_shape(block["shape"], source)
    for key, allowed in (("layout", LAYOUTS), ("color", COLORS), ("dtype", DTYPES), ("resize", RESIZE_MODES)):
        if key in block and block[key] not in allowed:
            raise UserError(f"{source}: input {key!r} {block[key]!r}: use one of {', '.join(allowed)}")
    for key in ("mean", "std"):
        if key in block:
            val = block[key]
            if (not isinstance(val, list) or len(val) != 3
                    or not all(_finite_number(x) for x in val)):
                raise UserError(f"{source}: input '{key}' must be a list of 3 numbers, one per channel "
                                f"(got {val!r})")
    if "std" in block and any(float(x) == 0.0 for x in block["std"]):
        raise UserError(f"{source}: input 'std' must be non-zero in every channel (got {block['std']!r})")
    if "scale" in block and not (_finite_number(block["scale"]) and float(block["scale"]) != 0.0):
        raise UserError(f"{source}: input 'scale' must be a finite non-zero number (got {block['scale']!r})")
    _check_geometry(block, source)
    if not block.get("plugin") and np.issubdtype(np.dtype(block.get("dtype", "float32")), np.integer):
        _check_integer(block, source)
    return block


def _check_shape(shape, source) -> None:
    if (not isinstance(shape, list) or not shape
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
        raise UserError(f"{source}: input 'shape' must be a list of positive integers (got {shape!r})")
    n = math.prod(shape)
    if n > MAX_INPUT_ELEMENTS:
        raise UserError(f"{source}: input shape {shape} is {n} elements, more than the limit of "
                        f"{MAX_INPUT_ELEMENTS} (2**28) one input tensor may hold")


def _check_geometry(block: dict, source) -> None:
    """pad_value, crop_ratio and plugin values (the resize mode itself is a choice checked above)."""
    if "pad_value" in block:
        v = block["pad_value"]
        vals = v if isinstance(v, list) else [v] * 3
        if len(vals) != 3 or not all(_finite_number(x) and 0 <= x <= 255 for x in vals):
            raise UserError(f"{source}: input 'pad_value' {v!r}: use a pixel value 0..255 or [r, g, b]")
    if "crop_ratio" in block:
        r = block["crop_ratio"]
        if not _finite_number(r) or not 0 < r <= 1:
            raise UserError(f"{source}: input 'crop_ratio' {r!r}: use a number in (0, 1], e.g. 0.875")
    if "plugin" in block and not (isinstance(block["plugin"], str) and block["plugin"]):
        raise UserError(f"{source}: input 'plugin' {block['plugin']!r}: use \"module:function\" or "
                        "\"path/to/file.py:function\"")


def _check_integer(block: dict, source) -> None:
    """An integer input: every pixel value 0..255 must become an integer of the dtype's range, exactly."""
    dtype = np.dtype(block.get("dtype"))
    scale = float(block.get("scale", 1.0))
    mean = np.asarray(block.get("mean", [0.0, 0.0, 0.0]), np.float64)
    std = np.asarray(block.get("std", [1.0, 1.0, 1.0]), np.float64)
    v = (np.arange(256, dtype=np.float64)[:, None] * scale - mean) / std
    bad = np.argwhere(v != np.rint(v))
    if bad.size:
        p, c = bad[0]
        raise UserError(f"{source}: input 'dtype' {dtype} takes integers, but scale {scale:g}, mean "
                        f"{block.get('mean', [0, 0, 0])} and std {block.get('std', [1, 1, 1])} make pixel {p} "
                        f"{v[p, c]:g}; drop scale, mean and std to feed the raw pixels 0..255")
    info = np.iinfo(dtype)
    if v.min() < info.min or v.max() > info.max:
        raise UserError(f"{source}: input 'dtype' {dtype}: scale, mean and std make values {v.min():g}..{v.max():g}, "
                        f"out of the range of {dtype} ({info.min}..{info.max})")


def _finite_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


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
    integer = spec["dtype"] in DTYPES and np.issubdtype(np.dtype(spec["dtype"]), np.integer)
    spec.setdefault("scale", 1.0 if integer else 1.0 / 255.0)  # an integer input takes the raw pixels
    spec.setdefault("mean", [0.0, 0.0, 0.0])
    spec.setdefault("std", [1.0, 1.0, 1.0])
    return spec


def _bilinear(rgb: np.ndarray, h: int, w: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(rgb).resize((w, h), Image.BILINEAR), dtype=np.uint8)


def _pad_value(spec: dict) -> np.ndarray:
    v = spec.get("pad_value", DEFAULT_PAD_VALUE)   # checked by check_input_block
    return np.asarray(v if isinstance(v, (list, tuple)) else [v] * 3, dtype=np.uint8)


def letterbox_geometry(ih: int, iw: int, h: int, w: int) -> tuple[int, int, int, int]:
    """(resized height, resized width, top, left) of an ih x iw image letterboxed into h x w."""
    r = min(h / ih, w / iw)
    nh, nw = int(round(ih * r)), int(round(iw * r))
    dh, dw = (h - nh) / 2, (w - nw) / 2
    return nh, nw, int(round(dh - 0.1)), int(round(dw - 0.1))


def letterbox(rgb: np.ndarray, h: int, w: int, pad_value=DEFAULT_PAD_VALUE) -> np.ndarray:
    """Scale to fit H x W keeping the aspect ratio, pad centred (Ultralytics' LetterBox, auto=False)."""
    ih, iw = rgb.shape[:2]
    nh, nw, top, left = letterbox_geometry(ih, iw, h, w)
    if (nh, nw) != (ih, iw):
        rgb = _bilinear(rgb, nh, nw)
    out = np.empty((h, w, 3), dtype=np.uint8)
    out[...] = np.asarray(pad_value, dtype=np.uint8)
    out[top:top + nh, left:left + nw] = rgb
    return out


def center_crop_geometry(ih: int, iw: int, h: int, w: int, crop_ratio: float = 1.0) -> tuple[int, int, int, int]:
    """(resized height, resized width, top, left of the crop) of an ih x iw image center-cropped to h x w."""
    th, tw = h / crop_ratio, w / crop_ratio
    if ih * tw <= iw * th:      # the image is wider than the target: its height binds
        nh = max(int(math.floor(th)), h)
        nw = max(int(nh * iw / ih), w)
    else:
        nw = max(int(math.floor(tw)), w)
        nh = max(int(nw * ih / iw), h)
    return nh, nw, int(round((nh - h) / 2.0)), int(round((nw - w) / 2.0))


def center_crop(rgb: np.ndarray, h: int, w: int, crop_ratio: float = 1.0) -> np.ndarray:
    """Scale so the image covers (H, W) / crop_ratio, then take the centre H x W (torchvision's Resize + CenterCrop).

    For a square target this is Resize(floor(size / crop_ratio)) on the short side (the long side
    int(short * long / short_in), as torchvision) followed by CenterCrop(size).
    """
    ih, iw = rgb.shape[:2]
    nh, nw, top, left = center_crop_geometry(ih, iw, h, w, crop_ratio)
    if (nh, nw) != (ih, iw):
        rgb = _bilinear(rgb, nh, nw)
    return rgb[top:top + h, left:left + w]


def input_hw(spec: dict) -> tuple[int, int]:
    """(height, width) of the model input a spec makes (NCHW or NHWC)."""
    shape = list(spec["shape"])
    if spec.get("layout", "NCHW") == "NHWC":
        return shape[1], shape[2]
    return shape[2], shape[3]


def boxes_to_image(boxes: np.ndarray, spec: dict, image_hw: tuple[int, int]) -> np.ndarray:
    """xyxy boxes in model-input pixels -> the source image's pixels, undoing the spec's resize.

    The inverse of `to_tensor`'s geometry (stretch, letterbox, center-crop), clipped to the
    image. A preprocessing plug-in has no known geometry: ValueError.
    """
    if spec.get("plugin"):
        raise ValueError("a preprocessing plug-in's geometry is unknown")
    ih, iw = image_hw
    h, w = input_hw(spec)
    mode = spec.get("resize", "stretch")
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if mode == "stretch":
        sx, sy, ox, oy = iw / w, ih / h, 0.0, 0.0
    elif mode == "letterbox":
        nh, nw, top, left = letterbox_geometry(ih, iw, h, w)
        sx, sy, ox, oy = iw / nw, ih / nh, -left, -top
    elif mode == "center-crop":
        nh, nw, top, left = center_crop_geometry(ih, iw, h, w, float(spec.get("crop_ratio", 1.0)))
        sx, sy, ox, oy = iw / nw, ih / nh, left, top
    else:
        raise ValueError(f"unknown resize mode {mode!r}")
    out = np.stack([(b[:, 0] + ox) * sx, (b[:, 1] + oy) * sy, (b[:, 2] + ox) * sx, (b[:, 3] + oy) * sy], axis=1)
    return np.clip(out, 0.0, [iw, ih, iw, ih])


def _resized(rgb: np.ndarray, h: int, w: int, spec: dict) -> np.ndarray:
    mode = spec.get("resize", "stretch")
    if mode == "letterbox":
        return letterbox(rgb, h, w, _pad_value(spec))
    if mode == "center-crop":
        return center_crop(rgb, h, w, float(spec.get("crop_ratio", 1.0)))
    return _bilinear(rgb, h, w) if rgb.shape[:2] != (h, w) else rgb


def _plugin_tensor(rgb: np.ndarray, spec: dict, ref: str) -> np.ndarray:
    """A preprocessing plug-in's tensor, checked against the spec's dtype and shape (errors name the plug-in)."""
    fn = plugins.load(ref, "sidecar input 'plugin'")
    try:
        x = fn(rgb, dict(spec))
    except UserError:
        raise
    except Exception as exc:  # user code: one line naming it, never a traceback
        raise UserError(f"preprocessing plug-in {ref}: raised {plugins.one_line(exc)}") from None
    if not isinstance(x, np.ndarray):
        raise UserError(f"preprocessing plug-in {ref}: returned {type(x).__name__}; return the input tensor as a numpy array")
    dtype = np.dtype(spec.get("dtype", "float32"))
    want = list(spec.get("shape") or [])
    fits = len(want) == x.ndim and all(not isinstance(d, int) or d <= 0 or d == n for d, n in zip(want, x.shape))
    if x.dtype != dtype or (want and not fits):
        raise UserError(f"preprocessing plug-in {ref}: returned {x.dtype} {list(x.shape)}; the sidecar input "
                        f"says {dtype} {want}")
    return np.ascontiguousarray(x)


def to_tensor(rgb: np.ndarray, spec: dict) -> np.ndarray:
    """HxWx3 uint8 -> the model input tensor (batch 1) per `spec` (resize mode, or a plug-in).

    Float inputs: ((pixels * scale) - mean) / std in float32. Integer inputs: the same
    arithmetic in float64, exact by check_input_block (by default scale 1, mean 0, std 1:
    the raw pixels), never a cast of normalised floats.
    """
    if spec.get("plugin"):
        return _plugin_tensor(rgb, spec, spec["plugin"])
    check_input_block(spec, "input spec")
    shape = list(spec["shape"])
    if spec["layout"] == "NCHW":
        _, c, h, w = shape
    else:
        _, h, w, c = shape
    if c != 3:
        raise UserError(f"model input has {c} channels; image preprocessing needs 3 (RGB)")
    rgb = _resized(rgb, h, w, spec)
    if spec.get("color", "RGB") == "BGR":
        rgb = rgb[..., ::-1]
    dtype = np.dtype(spec["dtype"])
    if np.issubdtype(dtype, np.integer):
        x = (rgb.astype(np.float64) * float(spec["scale"]) - np.asarray(spec["mean"], np.float64)) \
            / np.asarray(spec["std"], np.float64)
    else:
        x = rgb.astype(np.float32) * np.float32(spec["scale"])
        x = (x - np.asarray(spec["mean"], np.float32)) / np.asarray(spec["std"], np.float32)
    x = x[None]
    if spec["layout"] == "NCHW":
        x = x.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(x, dtype=dtype)
