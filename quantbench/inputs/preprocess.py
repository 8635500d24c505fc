"""Image -> input tensor, exactly as the model's sidecar says.

One function used everywhere a tensor is made from an image (calibration,
evaluation fixtures, training), so that a fixture hash means the same pixels
under the same arithmetic.

Sidecar "input" block (every key and value checked by check_input_block; unknown ones refused):
    {"name": "images", "shape": [1, 3, 128, 128], "layout": "NCHW", "color": "RGB",
     "dtype": "float32", "scale": 1/255, "mean": [..3..], "std": [..3..]}
tensor = ((pixels_uint8 * scale) - mean) / std, computed in float32, resized
with PIL bilinear only when the image size differs from the model's. An integer
dtype takes the raw pixels (default scale 1, mean 0, std 1); its arithmetic must
give integers in the dtype's range for every pixel value, never a lossy cast.

Optional keys of the input block, read by `to_tensor`:
    "color": "RGB" (default), "BGR", or "GRAY": one channel, PIL's "L" conversion (ITU-R 601-2 luma,
              L = R * 299/1000 + G * 587/1000 + B * 114/1000) after the resize; mean/std then hold 1 number.
    "normalize": "scale-first" (default) ((pixels * scale) - mean) / std; "albumentations": albumentations'
              Normalize, (pixels - mean * max_pixel_value) / (std * max_pixel_value) in its float32 order
              (albumentations_normalize), mean/std in 0..1 units, "max_pixel_value" (default 255), no scale.
    "resize": "stretch"      (default) both sides to the model's H x W, aspect ratio lost;
              "letterbox"    keep the aspect ratio, scale to fit, pad with "pad_value" (default 114,
                             or [r, g, b]): "pad": "center" (default, as Ultralytics' LetterBox) or
                             "top-left" (the image at the top-left, padding bottom and right);
              "center-crop"  scale the short side to the target / "crop_ratio" (default 1.0;
                             0.875 is torchvision's Resize(256) + CenterCrop(224)), crop the centre.
              "limit-side"   PaddleOCR's DetResizeForTest (DBNet): "limit_side_len" (default 736) and
                             "limit_type" min (default) / max / resize_long, each side to a multiple of 32;
                             every image its own size, so the shape's H and W are dynamic ([1, 3, -1, -1]).
    Where each image went (size, scale, pad offsets) is its Geometry (`geometry`), recorded per fixture.
    a dynamic width in "shape" (-1 or a name, e.g. [1, 1, 48, -1]) with "max_width": each image is
              resized to the fixed height keeping its aspect ratio, width min(ceil(H * w / h), max_width),
              normalised, then padded on the right with zeros to max_width (PaddleOCR's rec convention):
              every tensor is [.., H, max_width], so fixtures batch like any others.
    "transpose_hw": true     the image is made at the model's W x H (rows x columns) and fed with H and
              W swapped (tensor[..., i, j] = image[j, i]).
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
applied first (PIL.ImageOps.exif_transpose), so the pixels are those a viewer shows.
16-bit samples are reduced to 8 bits by ``v >> 8`` (the high byte; Pillow does the same
for 16-bit RGB PNGs, and an 8-bit image widened as ``v * 257`` comes back exactly);
grayscale is replicated to R, G, B (and "color": "GRAY" gives those values back exactly).
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quantbench.inputs import plugins
from quantbench.errors import UserError, flag_mark
from quantbench.fsutil import regular_file

LUMA_709 = (0.2126, 0.7152, 0.0722)
RESIZE_MODES = ("stretch", "letterbox", "center-crop", "limit-side")
#: PaddleOCR DetResizeForTest's limit_type: the shorter side at least, the longer side at most, the longer side to
LIMIT_TYPES = ("min", "max", "resize_long")
DEFAULT_LIMIT_SIDE, DEFAULT_LIMIT_TYPE = 736, "min"   # DetResizeForTest's defaults
DEFAULT_PAD_VALUE = 114


MAX_INPUT_ELEMENTS = 2 ** 28
MAX_IMAGE_PIXELS = 100_000_000


def load_rgb(path: str | os.PathLike) -> np.ndarray:
    """Decode an image file to HxWx3 uint8 RGB; a corrupt or oversized file is a UserError naming it."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: image file not found")
    regular_file(path, "image")
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


#: EXIF orientations (tag 0x0112) PIL.ImageOps.exif_transpose applies: 2-4 flip or turn by 180 degrees, 5-8 turn
#: by 90 degrees (TRANSPOSE, ROTATE_270, TRANSVERSE, ROTATE_90), so the upright image's width and height swap
ORIENTATIONS = (2, 3, 4, 5, 6, 7, 8)
TURNED = (5, 6, 7, 8)


def orientation(im) -> int:
    """The EXIF orientation PIL.ImageOps.exif_transpose applies to the opened image `im`: 2..8, or 1 (upright, no
    tag, or a value it ignores). PIL's getexif also reads an XMP tiff:Orientation, as exif_transpose does."""
    o = im.getexif().get(0x0112, 1)
    return o if o in ORIENTATIONS else 1


def upright_wh(im) -> tuple[int, int]:
    """(width, height) of the opened image `im` upright, as load_rgb decodes it (from its header: no pixel read)."""
    w, h = im.size
    return (h, w) if orientation(im) in TURNED else (w, h)


def _upright(im):
    """The image as it is meant to be viewed: its EXIF orientation (phone photos) applied, else itself."""
    from PIL import ImageOps

    if orientation(im) == 1:
        return im
    return ImageOps.exif_transpose(im)


def upright_size(path: str | os.PathLike) -> tuple[int, int]:
    """(height, width) of the image load_rgb decodes from `path` (EXIF orientation applied), from its header."""
    from PIL import Image

    with Image.open(regular_file(path, "image")) as im:
        w, h = upright_wh(im)
        return h, w


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


INPUT_KEYS = ("name", "shape", "layout", "color", "dtype", "scale", "mean", "std", "normalize", "max_pixel_value",
              "resize", "pad", "pad_value", "crop_ratio", "limit_side_len", "limit_type", "max_width", "transpose_hw",
              "plugin")
LAYOUTS = ("NCHW", "NHWC")
COLORS = ("RGB", "BGR", "GRAY")
PADS = ("center", "top-left")
#: the order of the float arithmetic: "scale-first" ((pixels * scale - mean) / std) or albumentations' Normalize
NORMALIZE = ("scale-first", "albumentations")
ALBUMENTATIONS = "albumentations"
DEFAULT_MAX_PIXEL = 255.0
DTYPES = ("float32", "float16", "float64", "uint8", "int8", "uint16", "int16", "int32", "int64")


def check_input_block(block, source) -> dict:
    """Validate a sidecar 'input' block or a full preprocessing spec (only the keys present); returns it.

    Every key must be one of INPUT_KEYS and every value one the preprocessing knows (layout,
    color, dtype, resize, pad, pad_value, crop_ratio, max_width, transpose_hw). Shape: positive
    integers, at most MAX_INPUT_ELEMENTS elements, the image width alone may be dynamic (-1 or
    a name, with max_width); its channels match the color (1 for GRAY, else 3); mean and std:
    one finite number per channel, std non-zero; scale: a finite non-zero number. An integer
    dtype takes integers: the arithmetic must map every pixel value 0..255 to an integer in
    the dtype's range.
    """
    if not isinstance(block, dict):
        raise UserError(f"{source}: 'input' must be an object like {{\"shape\": [1, 3, 224, 224], ...}}, "
                        f"not {type(block).__name__}")
    unknown = [k for k in block if k not in INPUT_KEYS]
    if unknown:
        raise UserError(f"{source}: unknown input key {unknown[0]!r}; the input block takes "
                        f"{', '.join(map(repr, INPUT_KEYS))}")
    for key, allowed in (("layout", LAYOUTS), ("color", COLORS), ("dtype", DTYPES), ("resize", RESIZE_MODES),
                         ("pad", PADS), ("normalize", NORMALIZE), ("limit_type", LIMIT_TYPES),
                         ("transpose_hw", (True, False))):
        if key in block and (block[key] not in allowed or isinstance(block[key], bool) != (key == "transpose_hw")):
            raise UserError(f"{source}: input {key!r} {block[key]!r}: use one of {', '.join(map(_show, allowed))}")
    if "shape" in block:
        _check_shape(block, source)
    channels = 1 if block.get("color") == "GRAY" else 3
    for key in ("mean", "std"):
        if key in block:
            val = block[key]
            if (not isinstance(val, list) or len(val) != channels
                    or not all(_finite_number(x) for x in val)):
                raise UserError(f"{source}: input '{key}' must be a list of {channels} number{'s' * (channels > 1)}, "
                                f"one per channel of {block.get('color', 'RGB')} (got {val!r})")
    if "std" in block and any(float(x) == 0.0 for x in block["std"]):
        raise UserError(f"{source}: input 'std' must be non-zero in every channel (got {block['std']!r})")
    if "scale" in block and not (_finite_number(block["scale"]) and float(block["scale"]) != 0.0):
        raise UserError(f"{source}: input 'scale' must be a finite non-zero number (got {block['scale']!r})")
    _check_geometry(block, source)
    _check_normalize(block, source)
    if not block.get("plugin") and np.issubdtype(np.dtype(block.get("dtype", "float32")), np.integer):
        _check_integer(block, source)
    return block


def _show(v) -> str:
    return "true" if v is True else "false" if v is False else str(v)


def is_dynamic(d) -> bool:
    """A dynamic dim of a sidecar shape: a name ("W") or a non-positive integer (paddle2onnx's -1)."""
    return (isinstance(d, str) and bool(d)) or (isinstance(d, int) and not isinstance(d, bool) and d <= 0)


def _width_axis(block: dict) -> int:
    """The axis of a 4-d input shape that the image's width runs along (H with transpose_hw)."""
    nchw = block.get("layout", "NCHW") == "NCHW"
    return (2 if nchw else 1) if block.get("transpose_hw") else (3 if nchw else 2)


def _hw_axes(block: dict) -> list:
    """The axes of a 4-d input shape that hold the image's height and width."""
    return [2, 3] if block.get("layout", "NCHW") == "NCHW" else [1, 2]


def _check_shape(block: dict, source) -> None:
    shape = block["shape"]
    dyn = [i for i, d in enumerate(shape) if is_dynamic(d)] if isinstance(shape, list) else []
    limit = block.get("resize") == "limit-side"     # each image at its own size: H and W dynamic
    if limit and (not isinstance(shape, list) or len(shape) != 4 or dyn != _hw_axes(block)
                  or block.get("transpose_hw") or "max_width" in block):
        raise UserError(f"{source}: input \"resize\": \"limit-side\" makes each image its own size (multiples of 32): "
                        f"give 'shape' with H and W dynamic, e.g. [1, 3, -1, -1], without max_width or transpose_hw "
                        f"(got {shape!r})")
    if (not isinstance(shape, list) or not shape
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for i, d in enumerate(shape)
                       if i not in dyn)
            or (dyn and not limit and (len(shape) != 4 or dyn != [_width_axis(block)] or block.get("plugin")))):
        raise UserError(f"{source}: input 'shape' must be a list of positive integers, only the image width "
                        f"dynamic (-1 or a name, with 'max_width'; H and W with \"resize\": \"limit-side\") "
                        f"(got {shape!r})")
    if limit:
        _check_channels(block, source)
        return
    if dyn and "max_width" not in block:
        raise UserError(f"{source}: input 'shape' {shape} has a dynamic width: give 'max_width', the widest "
                        "tensor (each image is resized to the height keeping its aspect ratio, padded to it)")
    if not dyn and "max_width" in block:
        raise UserError(f"{source}: input 'max_width' applies to a dynamic width only (-1 or a name in 'shape')")
    if dyn and block.get("resize", "stretch") != "stretch":
        raise UserError(f"{source}: input 'resize' {block['resize']!r}: a dynamic width keeps the aspect ratio at the "
                        "fixed height; drop 'resize'")
    full = [block.get("max_width", 1) if i in dyn else d for i, d in enumerate(shape)]
    n = math.prod(full) if all(isinstance(d, int) for d in full) else 0
    if n > MAX_INPUT_ELEMENTS:
        raise UserError(f"{source}: input shape {full} is {n} elements, more than the limit of "
                        f"{MAX_INPUT_ELEMENTS} (2**28) one input tensor may hold")
    if not block.get("plugin"):
        if len(shape) != 4:
            raise UserError(f"{source}: input 'shape' {shape}: image preprocessing makes 4 dims (N, C, H, W or "
                            "N, H, W, C); for another input use a preprocessing plug-in")
        _check_channels(block, source)


def _check_channels(block: dict, source) -> None:
    shape, color = block["shape"], block.get("color", "RGB")
    c = shape[1] if block.get("layout", "NCHW") == "NCHW" else shape[3]
    want = 1 if color == "GRAY" else 3
    if c == want:
        return
    fix = {1: 'set "color": "GRAY" in the sidecar\'s input block',
           3: 'set "color": "RGB" (or "BGR") in the sidecar\'s input block'}.get(
        c, "image preprocessing makes 1 (GRAY) or 3 (RGB, BGR) channels; use a preprocessing plug-in")
    raise UserError(f"{source}: model input has {c} channel(s) ({shape}) but the input block makes {want} "
                    f"({color}); {fix}")


def _check_geometry(block: dict, source) -> None:
    """pad, pad_value, crop_ratio, max_width and plugin values (choices are checked by check_input_block)."""
    if "pad" in block and block.get("resize") != "letterbox":
        raise UserError(f"{source}: input 'pad' applies to \"resize\": \"letterbox\" only")
    for key in ("limit_side_len", "limit_type"):
        if key in block and block.get("resize") != "limit-side":
            raise UserError(f"{source}: input {key!r} applies to \"resize\": \"limit-side\" only")
    if "limit_side_len" in block:
        n = block["limit_side_len"]
        if not (isinstance(n, int) and not isinstance(n, bool) and n > 0):
            raise UserError(f"{source}: input 'limit_side_len' {n!r}: use a positive number of pixels, e.g. 736")
    if "pad_value" in block:
        v = block["pad_value"]
        vals = v if isinstance(v, list) else [v] * 3
        if len(vals) != 3 or not all(_finite_number(x) and 0 <= x <= 255 for x in vals):
            raise UserError(f"{source}: input 'pad_value' {v!r}: use a pixel value 0..255 or [r, g, b]")
    if "crop_ratio" in block:
        r = block["crop_ratio"]
        if not _finite_number(r) or not 0 < r <= 1:
            raise UserError(f"{source}: input 'crop_ratio' {r!r}: use a number in (0, 1], e.g. 0.875")
    if "max_width" in block:
        m = block["max_width"]
        if not (isinstance(m, int) and not isinstance(m, bool) and m > 0):
            raise UserError(f"{source}: input 'max_width' {m!r}: use a positive number of pixels, e.g. 320")
    if "plugin" in block and not (isinstance(block["plugin"], str) and block["plugin"]):
        raise UserError(f"{source}: input 'plugin' {block['plugin']!r}: use \"module:function\" or "
                        "\"path/to/file.py:function\"")


def _check_normalize(block: dict, source) -> None:
    """albumentations' order takes mean and std in 0..1 units and max_pixel_value, no scale, and makes floats."""
    albu = block.get("normalize") == ALBUMENTATIONS
    if "max_pixel_value" in block:
        m = block["max_pixel_value"]
        if not albu:
            raise UserError(f"{source}: input 'max_pixel_value' applies to \"normalize\": \"albumentations\" only")
        if not (_finite_number(m) and m > 0):
            raise UserError(f"{source}: input 'max_pixel_value' {m!r}: use a positive number, e.g. 255")
    if not albu:
        return
    if "scale" in block:
        raise UserError(f"{source}: input 'scale' with \"normalize\": \"albumentations\": albumentations divides by "
                        "'max_pixel_value' (default 255) instead; drop 'scale'")
    if np.issubdtype(np.dtype(block.get("dtype", "float32")), np.integer):
        raise UserError(f"{source}: input \"normalize\": \"albumentations\" makes floats; the input 'dtype' "
                        f"{block['dtype']} takes the raw pixels: drop 'normalize'")


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
               source: str = "model", override: bool = False) -> dict:
    """The preprocessing recipe: the sidecar's input block, or plain 0..1 scaling of a static input.

    `model_input_shape` holds the model's dims (None for dynamic ones, see
    modelio.dims_of). Without a sidecar shape only a dynamic batch is filled in (with 1):
    a dynamic height or width is the user's to state, never guessed, and a static batch
    other than 1 (a static-batch export, e.g. [10, 3, 32, 32]) is refused naming the
    sidecar 'shape' that fixes it. A sidecar shape must agree with every static dim,
    unless `override` (calibrate: its shape overrides the declared dims of the variants it
    writes, modelio.with_input_shape): then it needs one dim per declared dim.
    `source` names the model in errors.
    """
    spec = dict((sidecar or {}).get("input") or {})
    if model_input_name and "name" not in spec:
        spec["name"] = model_input_name
    dims = None if model_input_shape is None else list(model_input_shape)
    if "shape" not in spec:
        spec["shape"] = _declared_shape(dims, spec.get("name"), sidecar, source)
    elif dims is not None:
        _check_declared(dims, list(spec["shape"]), spec.get("name"), source, override)
    spec.setdefault("layout", "NCHW")
    spec.setdefault("color", "RGB")
    spec.setdefault("dtype", "float32")
    integer = spec["dtype"] in DTYPES and np.issubdtype(np.dtype(spec["dtype"]), np.integer)
    if spec.get("normalize") == ALBUMENTATIONS:   # albumentations divides by max_pixel_value; it has no scale
        spec.setdefault("max_pixel_value", DEFAULT_MAX_PIXEL)
    else:
        spec.setdefault("scale", 1.0 if integer else 1.0 / 255.0)  # an integer input takes the raw pixels
    channels = 1 if spec["color"] == "GRAY" else 3
    spec.setdefault("mean", [0.0] * channels)
    spec.setdefault("std", [1.0] * channels)
    return spec


def _shown(dims) -> list:
    return ["?" if d is None else d for d in dims]


def _declared_shape(dims, name, sidecar, source) -> list:
    """The input shape a model's own dims give (a dynamic batch as 1), when the sidecar states none."""
    if dims is None:
        raise UserError(f"{source}: no input shape: give the model a sidecar JSON with an 'input' block")
    if any(d is None for d in dims[1:]):
        fix = ("its 'input' block states no 'shape': add one (and mean, std)" if sidecar is not None else
               "give the model a sidecar JSON with an 'input' block stating 'shape' (and mean, std), or pass "
               f"{flag_mark('sidecar')} FILE")
        raise UserError(f"{source}: input {name!r} has dynamic dims {_shown(dims)}; {fix}")
    if dims and dims[0] is not None and dims[0] != 1:
        one = [1, *dims[1:]]
        raise UserError(f"{source}: input {name!r} declares a static batch of {dims[0]} ({dims}), and every tensor "
                        f"quantbench makes holds one image: add \"shape\": {one} to the sidecar's input block (it "
                        "overrides the declared dims in every variant calibrate writes)")
    return [1 if d is None else d for d in dims]


def _check_declared(dims: list, want: list, name, source, override: bool) -> None:
    """A sidecar shape against the model's declared dims: equal where static, or (`override`) of the same rank."""
    if len(dims) != len(want):
        raise UserError(f"{source}: input {name!r} is declared with {len(dims)} dims {_shown(dims)} but the "
                        f"sidecar's input 'shape' {want} has {len(want)}; give one dim per declared dim")
    if override or all(d is None or d == w for d, w in zip(dims, want)):
        return
    raise UserError(f"{source}: input {name!r} is declared as {_shown(dims)} but the sidecar's input 'shape' is "
                    f"{want}; a sidecar 'shape' overrides declared dims only in the variants calibrate writes: "
                    "calibrate this model with that sidecar, or make the sidecar's 'shape' match")


def _bilinear(rgb: np.ndarray, h: int, w: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(rgb).resize((w, h), Image.BILINEAR), dtype=np.uint8)


def _pad_value(spec: dict) -> np.ndarray:
    v = spec.get("pad_value", DEFAULT_PAD_VALUE)   # checked by check_input_block
    return np.asarray(v if isinstance(v, (list, tuple)) else [v] * 3, dtype=np.uint8)


def letterbox_geometry(ih: int, iw: int, h: int, w: int, pad: str = "center") -> tuple[int, int, int, int]:
    """(resized height, resized width, top, left) of an ih x iw image letterboxed into h x w.

    pad "center": the padding split on both sides (Ultralytics' LetterBox); "top-left": the
    image at the top-left corner, all padding at the bottom and right.
    """
    r = min(h / ih, w / iw)
    nh, nw = int(round(ih * r)), int(round(iw * r))
    if pad == "top-left":
        return nh, nw, 0, 0
    dh, dw = (h - nh) / 2, (w - nw) / 2
    return nh, nw, int(round(dh - 0.1)), int(round(dw - 0.1))


def keep_ratio_width(ih: int, iw: int, h: int, max_width: int) -> int:
    """The width an ih x iw image gets at height h, aspect kept, at most max_width (PaddleOCR's rec resize)."""
    return max(1, min(int(math.ceil(h * iw / ih)), max_width))


def letterbox(rgb: np.ndarray, h: int, w: int, pad_value=DEFAULT_PAD_VALUE, pad: str = "center") -> np.ndarray:
    """Scale to fit H x W keeping the aspect ratio, pad centred (Ultralytics' LetterBox, auto=False) or at the
    bottom and right (pad "top-left")."""
    ih, iw = rgb.shape[:2]
    nh, nw, top, left = letterbox_geometry(ih, iw, h, w, pad)
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


def image_dims(spec: dict) -> tuple[int | None, int | None, int]:
    """(height, width, channels) of the image a spec makes, before transpose_hw swaps H and W; a dynamic
    width is None (each image then gets keep_ratio_width, padded to max_width), and so is a dynamic height
    (resize limit-side: each image its own size, limit_side)."""
    shape = list(spec["shape"])
    if spec.get("layout", "NCHW") == "NHWC":
        _, h, w, c = shape
    else:
        _, c, h, w = shape
    if spec.get("transpose_hw"):
        h, w = w, h
    return (None if is_dynamic(h) else h), (None if is_dynamic(w) else w), c


def limit_side(ih: int, iw: int, side: int = DEFAULT_LIMIT_SIDE, limit_type: str = DEFAULT_LIMIT_TYPE) -> tuple:
    """(height, width) PaddleOCR's DetResizeForTest (resize_image_type0) gives an ih x iw image: scaled so the
    shorter side is at least `side` ("min"; an image already that large keeps its size), the longer side at most
    `side` ("max") or exactly `side` ("resize_long"), truncated, then each rounded to a multiple of 32 (at least
    32), aspect kept up to that rounding."""
    if limit_type == "max":
        ratio = float(side) / (ih if ih > iw else iw) if max(ih, iw) > side else 1.0
    elif limit_type == "min":
        ratio = float(side) / (ih if ih < iw else iw) if min(ih, iw) < side else 1.0
    else:
        ratio = float(side) / max(ih, iw)
    nh, nw = int(ih * ratio), int(iw * ratio)
    return max(int(round(nh / 32) * 32), 32), max(int(round(nw / 32) * 32), 32)


def _limit_side_of(spec: dict, ih: int, iw: int) -> tuple:
    return limit_side(ih, iw, int(spec.get("limit_side_len", DEFAULT_LIMIT_SIDE)),
                      spec.get("limit_type", DEFAULT_LIMIT_TYPE))


def squeezed_width(image_hw: tuple[int, int], spec: dict) -> int | None:
    """The width an image of `image_hw` (height, width) would take at the spec's height with its aspect kept, when a
    dynamic-width spec's max_width squeezes it narrower (keep_ratio_width); None when it fits or the width is fixed.
    A recogniser reads squeezed text differently, so callers say so."""
    h, w, _ = image_dims(spec)
    if w is not None or not spec.get("max_width") or spec.get("transpose_hw"):
        return None
    ih, iw = image_hw
    natural = int(math.ceil(h * iw / ih))
    return natural if natural > int(spec["max_width"]) else None


def input_hw(spec: dict) -> tuple[int, int]:
    """(height, width) of the model input a spec makes (NCHW or NHWC; a dynamic dim is max_width)."""
    shape = [spec.get("max_width") if is_dynamic(d) else d for d in spec["shape"]]
    if spec.get("layout", "NCHW") == "NHWC":
        return shape[1], shape[2]
    return shape[2], shape[3]


@dataclass(frozen=True)
class Geometry:
    """Where one image went in the model input, as `to_tensor` placed it: the image (upright) of `image_size`
    (height, width) was resized to `resized` and its top-left corner put at `offset` (top, left) of the model
    input of `input_size` (before transpose_hw swaps H and W; negative: cropped away, center-crop). `scale` is
    resized / image_size per axis (y, x). A decoder undoes it (`to_image`); a decode plug-in gets `as_dict()`."""

    image_size: tuple
    input_size: tuple
    resized: tuple
    offset: tuple
    resize: str
    transpose_hw: bool = False

    @property
    def scale(self) -> tuple:
        return (self.resized[0] / self.image_size[0], self.resized[1] / self.image_size[1])

    def as_dict(self) -> dict:
        return {"image_size": list(self.image_size), "input_size": list(self.input_size),
                "resized": list(self.resized), "offset": list(self.offset), "scale": list(self.scale),
                "resize": self.resize, "transpose_hw": self.transpose_hw}

    @classmethod
    def from_dict(cls, d: dict) -> Geometry:
        return cls(image_size=tuple(d["image_size"]), input_size=tuple(d["input_size"]), resized=tuple(d["resized"]),
                   offset=tuple(d["offset"]), resize=str(d["resize"]), transpose_hw=bool(d.get("transpose_hw")))

    def model_hw(self) -> tuple:
        """(height, width) of the model input (input_size with transpose_hw's swap)."""
        return tuple(reversed(self.input_size)) if self.transpose_hw else tuple(self.input_size)

    def to_image(self, boxes) -> np.ndarray:
        """xyxy boxes in model-input pixels -> the image's pixels, clipped to the image."""
        ih, iw = self.image_size
        (nh, nw), (top, left) = self.resized, self.offset
        b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        if self.transpose_hw:     # model x runs along the image's rows
            b = b[:, [1, 0, 3, 2]]
        sx, sy, ox, oy = iw / nw, ih / nh, -left, -top
        out = np.stack([(b[:, 0] + ox) * sx, (b[:, 1] + oy) * sy, (b[:, 2] + ox) * sx, (b[:, 3] + oy) * sy], axis=1)
        return np.clip(out, 0.0, [iw, ih, iw, ih])


def geometry(spec: dict, image_hw: tuple[int, int]) -> Geometry | None:
    """The Geometry `to_tensor` gives an image of `image_hw` (height, width, upright) under `spec`; None for a
    preprocessing plug-in (its geometry is its own)."""
    if spec.get("plugin"):
        return None
    ih, iw = (int(x) for x in image_hw)
    h, w, _ = image_dims(spec)
    mode = spec.get("resize", "stretch")
    if mode == "limit-side":    # the input is the resized image itself
        nh, nw = _limit_side_of(spec, ih, iw)
        h, w, top, left = nh, nw, 0, 0
    elif w is None:     # a dynamic width: the height fixed, the aspect kept, padded on the right to max_width
        mode, w = "keep-ratio", int(spec["max_width"])
        nh, nw, top, left = h, keep_ratio_width(ih, iw, h, w), 0, 0
    elif mode == "letterbox":
        nh, nw, top, left = letterbox_geometry(ih, iw, h, w, spec.get("pad", "center"))
    elif mode == "center-crop":
        nh, nw, top, left = center_crop_geometry(ih, iw, h, w, float(spec.get("crop_ratio", 1.0)))
        top, left = -top, -left
    elif mode == "stretch":
        nh, nw, top, left = h, w, 0, 0
    else:
        raise ValueError(f"unknown resize mode {mode!r}")
    return Geometry(image_size=(ih, iw), input_size=(h, w), resized=(nh, nw), offset=(top, left), resize=mode,
                    transpose_hw=bool(spec.get("transpose_hw")))


def boxes_to_image(boxes: np.ndarray, spec: dict, image_hw: tuple[int, int]) -> np.ndarray:
    """xyxy boxes in model-input pixels -> the source image's pixels, undoing the spec's resize.

    The inverse of `to_tensor`'s geometry (stretch, letterbox, center-crop, a dynamic width,
    transpose_hw), clipped to the image. A preprocessing plug-in has no known geometry: ValueError.
    """
    g = geometry(spec, image_hw)
    if g is None:
        raise ValueError("a preprocessing plug-in's geometry is unknown")
    return g.to_image(boxes)


def _resized(rgb: np.ndarray, h: int | None, w: int | None, spec: dict) -> np.ndarray:
    if spec.get("resize") == "limit-side":
        nh, nw = _limit_side_of(spec, *rgb.shape[:2])
        if nh * nw * 3 > MAX_INPUT_ELEMENTS:
            raise UserError(f"input resize limit-side: an image of {rgb.shape[1]}x{rgb.shape[0]} becomes {nw}x{nh}, "
                            f"more than the limit of {MAX_INPUT_ELEMENTS} (2**28) elements one input tensor may hold")
        return _bilinear(rgb, nh, nw) if rgb.shape[:2] != (nh, nw) else rgb
    if w is None:
        w = keep_ratio_width(*rgb.shape[:2], h, int(spec["max_width"]))
        return _bilinear(rgb, h, w) if rgb.shape[:2] != (h, w) else rgb
    mode = spec.get("resize", "stretch")
    if mode == "letterbox":
        return letterbox(rgb, h, w, _pad_value(spec), spec.get("pad", "center"))
    if mode == "center-crop":
        return center_crop(rgb, h, w, float(spec.get("crop_ratio", 1.0)))
    return _bilinear(rgb, h, w) if rgb.shape[:2] != (h, w) else rgb


def _colored(rgb: np.ndarray, color: str) -> np.ndarray:
    """HxWx3 RGB -> HxWxC in the spec's color: RGB, BGR, or GRAY (PIL's "L": ITU-R 601-2 luma,
    L = R * 299/1000 + G * 587/1000 + B * 114/1000), after the resize."""
    if color == "BGR":
        return rgb[..., ::-1]
    if color == "GRAY":
        from PIL import Image

        return np.asarray(Image.fromarray(np.ascontiguousarray(rgb)).convert("L"), dtype=np.uint8)[..., None]
    return rgb


def _plugin_tensor(rgb: np.ndarray, spec: dict, ref: str) -> np.ndarray:
    """A preprocessing plug-in's tensor, checked against the spec's dtype and shape (errors name the plug-in)."""
    fn = plugins.load(ref, "sidecar input 'plugin'")
    try:
        x = fn(rgb, dict(spec))
    except UserError:
        raise
    except plugins.FAILURES as exc:  # user code (sys.exit too): one line naming it, never a traceback
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


def albumentations_normalize(img: np.ndarray, mean, std, max_pixel_value: float) -> np.ndarray:
    """HxWxC uint8 -> float32 as albumentations' Normalize (2.x, albucore's LUT for uint8) computes it:
    (pixel - mean * max_pixel_value) * (1 / (std * max_pixel_value)), every step in float32 (the documented
    (pixel / max_pixel_value - mean) / std rounds differently in 1 ulp on most pixels)."""
    m = np.asarray(mean, np.float32) * np.float32(max_pixel_value)
    den = np.reciprocal(np.asarray(std, np.float32) * np.float32(max_pixel_value))
    lut = (np.arange(256, dtype=np.float32)[:, None] - m) * den        # [256, C], one table per channel
    return lut[img, np.arange(img.shape[-1])]


def to_tensor(rgb: np.ndarray, spec: dict) -> np.ndarray:
    """HxWx3 uint8 -> the model input tensor (batch 1) per `spec` (resize mode, or a plug-in).

    Resize (image_dims: a dynamic width keeps the aspect ratio at the height), color, then
    float inputs: ((pixels * scale) - mean) / std in float32; integer inputs: the same
    arithmetic in float64, exact by check_input_block (by default scale 1, mean 0, std 1:
    the raw pixels), never a cast of normalised floats. A dynamic width is padded on the
    right with zeros to max_width after normalisation (PaddleOCR's rec convention);
    transpose_hw swaps H and W last.
    """
    if spec.get("plugin"):
        return _plugin_tensor(rgb, spec, spec["plugin"])
    check_input_block(spec, "input spec")
    h, w, _ = image_dims(spec)
    img = _colored(_resized(rgb, h, w, spec), spec.get("color", "RGB"))
    dtype = np.dtype(spec["dtype"])
    if spec.get("normalize") == ALBUMENTATIONS:
        x = albumentations_normalize(img, spec["mean"], spec["std"], spec.get("max_pixel_value", DEFAULT_MAX_PIXEL))
    elif np.issubdtype(dtype, np.integer):
        x = (img.astype(np.float64) * float(spec["scale"]) - np.asarray(spec["mean"], np.float64)) \
            / np.asarray(spec["std"], np.float64)
    else:
        x = img.astype(np.float32) * np.float32(spec["scale"])
        x = (x - np.asarray(spec["mean"], np.float32)) / np.asarray(spec["std"], np.float32)
    if w is None and spec.get("max_width") and x.shape[1] < spec["max_width"]:
        x = np.pad(x, ((0, 0), (0, spec["max_width"] - x.shape[1]), (0, 0)))
    x = x[None]
    if spec.get("transpose_hw"):
        x = x.transpose(0, 2, 1, 3)
    if spec["layout"] == "NCHW":
        x = x.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(x, dtype=dtype)
