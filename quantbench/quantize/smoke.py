"""Verified before published: every variant is loaded and run on one image before calibrate calls it written.

The quantizer can write models onnxruntime refuses to load (a per-channel
`axis` on an old opset) or that run to NaN; a variant is only published after
it loads in the local onnxruntime, runs one calibration image, and produces the
fp32 model's output names, shapes and dtypes, finite wherever fp32 is finite.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np


@dataclass
class Signature:
    """What a variant must reproduce of the fp32 model's outputs on the smoke image."""

    names: list
    shapes: list
    dtypes: list
    finite: list  # bool masks of where fp32 is finite


def _run(path: str | os.PathLike, feeds: dict) -> tuple[list, list]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return names, sess.run(names, feeds)


def first_line(exc: BaseException) -> str:
    """onnxruntime's whole message on one line: its lines joined ("... for the following indices; index: 0 Got: 1
    Expected: 10; ..." carries the numbers on the lines after the first), long ones cut in the middle."""
    text = [" ".join(ln.split()) for ln in str(exc).strip().splitlines()]
    text = [ln for ln in text if ln]
    if not text:
        return type(exc).__name__
    line = "; ".join(text)
    line = line if len(line) <= 480 else f"{line[:200]} ... {line[-260:]}"  # the cause is often at the end
    return f"{type(exc).__name__}: {line}"


def runs(model_bytes: bytes, feeds: dict) -> str | None:
    """None when a model (its serialized bytes) loads and runs on `feeds` in onnxruntime; else onnxruntime's
    whole message on one line (first_line)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    try:
        sess = ort.InferenceSession(model_bytes, sess_options=so, providers=["CPUExecutionProvider"])
        sess.run(None, feeds)
    except Exception as exc:  # onnxruntime raises its own exception types for load and run failures
        return first_line(exc)
    return None


def reference(path: str | os.PathLike, feeds: dict) -> Signature:
    """Run the fp32 model; its failure is the caller's to report (the model or preprocessing is wrong)."""
    names, outs = _run(path, feeds)
    return Signature(names=names, shapes=[list(np.shape(o)) for o in outs], dtypes=[np.asarray(o).dtype.str for o in outs],
                     finite=[np.isfinite(o) if np.issubdtype(np.asarray(o).dtype, np.floating) else None for o in outs])


def check(path: str | os.PathLike, feeds: dict, ref: Signature) -> str | None:
    """None when the variant loads, runs and matches `ref`; else why not, in one line."""
    try:
        names, outs = _run(path, feeds)
    except Exception as exc:  # onnxruntime raises its own exception types for load and run failures
        return f"does not load or run in onnxruntime ({first_line(exc)})"
    if names != ref.names:
        return f"outputs {names} differ from fp32's {ref.names}"
    for name, out, shape, dtype, fin in zip(names, outs, ref.shapes, ref.dtypes, ref.finite):
        out = np.asarray(out)
        if list(out.shape) != shape:
            return f"output {name!r} has shape {list(out.shape)}, fp32 has {shape}"
        if out.dtype.str != dtype:
            return f"output {name!r} is {out.dtype}, fp32 is {np.dtype(dtype)}"
        if fin is not None:
            bad = fin & ~np.isfinite(out)
            if bad.any():
                return f"output {name!r} has {int(bad.sum())} non-finite value(s) where fp32 is finite"
    return None
