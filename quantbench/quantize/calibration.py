"""Calibration ranges in bounded memory, independent of chunking and image order.

onnxruntime's histogram calibrators keep every intermediate output of the whole
calibration set in memory, and its chunked mode re-bins histograms as ranges
grow, so the result depends on chunk size and image order. Here only the
*collection* of statistics is replaced; the range math is onnxruntime's own:

pass 1  The model, augmented with ReduceMin/ReduceMax (and ReduceMin(Abs) for
        Percentile) on every tensor onnxruntime would calibrate, runs one image
        at a time (batch 1). Per-tensor min/max are merged with min()/max():
        exact, so independent of order and chunking.
pass 2  (Percentile, Entropy) The model with every calibrated tensor as an
        output runs one image at a time again; a chunk of images' activations
        is binned into a histogram whose range and bin count were fixed by
        pass 1, and integer counts are added. Integer sums do not depend on
        order or chunking either.

The histograms are laid out exactly as onnxruntime lays out a histogram of
the whole set collected at once (Percentile: |x| over [min|x|, max|x|],
2048 bins; Entropy: x over [-T, T], T = max(|min|, |max|)), then handed to
``HistogramCollector.compute_percentile`` / ``compute_entropy``. So the ranges
equal those of stock ``quantize_static`` run on the whole set in one go, while
memory holds one chunk of activations and a few KiB of counts per tensor.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np

from quantbench.errors import UserError

METHODS = ("minmax", "percentile", "entropy")
DEFAULT_PERCENTILE = 99.999
PERCENTILE_BINS = 2048        # onnxruntime's create_calibrator default for Percentile
ENTROPY_BINS = 128            # onnxruntime's default histogram bins for Entropy
ENTROPY_QUANTIZED_BINS = 128  # onnxruntime's default quantized bins for Entropy


class ImageInputs:
    """Re-iterable calibration inputs: image files -> {input name: tensor}, one at a time.

    Images are decoded lazily (quantbench.preprocess), so iterating holds one
    image; every pass re-reads the files.
    """

    def __init__(self, paths: Sequence[str | os.PathLike], spec: dict):
        self.paths = [Path(p) for p in paths]
        self.spec = spec
        self.input_name = spec.get("name", "input")

    def __len__(self) -> int:
        return len(self.paths)

    def label(self, i: int) -> str:
        return str(self.paths[i])

    def __iter__(self) -> Iterator[dict]:
        from quantbench.preprocess import load_rgb, to_tensor

        for p in self.paths:
            yield {self.input_name: to_tensor(load_rgb(p), self.spec)}


def _label(inputs, i: int) -> str:
    fn = getattr(inputs, "label", None)
    return fn(i) if callable(fn) else f"calibration input #{i}"


def _chunks(it: Iterable, size: int) -> Iterator[list]:
    buf = []
    for x in it:
        buf.append(x)
        if len(buf) == size:
            yield buf
            buf = []
    if buf:
        yield buf


def default_op_types() -> list[str]:
    """The op types quantize_static quantizes (and calibrates) by default, sorted."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return sorted(set(QLinearOpsRegistry) | set(QDQRegistry))


def load_with_shape_infer(model_path: str | os.PathLike):
    """onnxruntime's load_model_with_shape_infer on a private copy (it writes beside its input)."""
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

    with tempfile.TemporaryDirectory(prefix="qb-shape-") as tmp:
        import shutil

        copy = Path(tmp) / "model.onnx"
        shutil.copyfile(model_path, copy)
        return load_model_with_shape_infer(copy)


def tensors_to_calibrate(model, op_types: Sequence[str] | None) -> list[str]:
    """The tensors onnxruntime's calibrators select (CalibraterBase.select_tensors_to_calibrate), sorted."""
    from onnxruntime.quantization.calibrate import CalibraterBase

    names, _ = CalibraterBase.select_tensors_to_calibrate(SimpleNamespace(op_types_to_calibrate=list(op_types or [])), model)
    return sorted(names)


def _session(model, providers=None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as onnxruntime's calibrators
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), sess_options=so,
                                providers=providers or ["CPUExecutionProvider"])


def _pass1_model(model, names: list[str], graph_inputs: set, want_abs: bool):
    """Copy of `model` whose extra outputs are per-tensor min, max (and min |x|)."""
    import onnx
    from onnx import helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    vi = {v.name: v for v in list(m.graph.value_info) + list(m.graph.output) + list(m.graph.input)}
    for t in names:
        if t in graph_inputs:
            continue
        et = vi[t].type.tensor_type.elem_type
        nodes = [helper.make_node("ReduceMin", [t], [f"{t}__qb_min"], keepdims=1, name=f"{t}__qb_min"),
                 helper.make_node("ReduceMax", [t], [f"{t}__qb_max"], keepdims=1, name=f"{t}__qb_max")]
        o = [f"{t}__qb_min", f"{t}__qb_max"]
        if want_abs:
            nodes += [helper.make_node("Abs", [t], [f"{t}__qb_abs"], name=f"{t}__qb_abs"),
                      helper.make_node("ReduceMin", [f"{t}__qb_abs"], [f"{t}__qb_amin"], keepdims=1, name=f"{t}__qb_amin")]
            o.append(f"{t}__qb_amin")
        m.graph.node.extend(nodes)
        for name in o:
            m.graph.output.append(helper.make_tensor_value_info(name, et, None))
    return m


def _pass2_model(model, names: list[str], graph_inputs: set):
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    vi = {v.name: v for v in list(m.graph.value_info) + list(m.graph.input)}
    existing = {o.name for o in m.graph.output}
    for t in names:
        if t not in graph_inputs and t not in existing:
            m.graph.output.append(vi[t])
    return m


class _Stats:
    """Pass-1 accumulators: exact min/max merges."""

    def __init__(self):
        self.lo: dict[str, np.generic] = {}
        self.hi: dict[str, np.generic] = {}
        self.amin: dict[str, np.generic] = {}

    def update(self, t: str, lo, hi, amin=None):
        if t in self.lo:
            self.lo[t] = min(self.lo[t], lo)
            self.hi[t] = max(self.hi[t], hi)
            if amin is not None:
                self.amin[t] = min(self.amin[t], amin)
        else:
            self.lo[t], self.hi[t] = lo, hi
            if amin is not None:
                self.amin[t] = amin


def _scalar(a) -> np.generic:
    return np.asarray(a).reshape(-1)[0]


def _check_finite(t: str, lo, hi, where: str):
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise UserError(f"{where}: tensor {t!r} has non-finite values ({lo}, {hi}); "
                        "check the image and the preprocessing, or drop the image")


def compute_ranges(model_path: str | os.PathLike, inputs, methods: Sequence[str] = ("minmax",), *,
                   percentile: float = DEFAULT_PERCENTILE, percentile_bins: int = PERCENTILE_BINS,
                   entropy_bins: int = ENTROPY_BINS, entropy_quantized_bins: int = ENTROPY_QUANTIZED_BINS,
                   op_types: Sequence[str] | None = None, chunk_size: int = 8, progress: bool = False,
                   providers: Sequence[str] | None = None, model=None) -> dict:
    """Calibration ranges for each of `methods` -> {method: onnxruntime TensorsData}.

    model_path: the (float) model to calibrate, exactly the one later quantized.
    inputs: a re-iterable of feeds ({input name: array with batch 1}), e.g.
        ImageInputs; iterated once for MinMax, twice when a histogram method is asked.
    op_types: op types whose tensors are calibrated (default: all quantize_static quantizes).
    chunk_size: how many images' activations are held and binned at once; the
        result does not depend on it (nor on image order).
    model: an already shape-inferred ModelProto of model_path (skips reloading).
    """
    from onnxruntime.quantization.calibrate import CalibrationMethod, HistogramCollector, TensorsData

    methods = list(dict.fromkeys(methods))
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise UserError(f"--methods: unknown calibration method(s) {bad}; choose from {list(METHODS)}")
    if chunk_size < 1:
        raise UserError(f"--chunk-size: must be at least 1 (got {chunk_size})")
    if not 0 < percentile <= 100:
        raise UserError(f"--percentile: must be in (0, 100] (got {percentile})")
    n = len(inputs)
    if n == 0:
        raise UserError("no calibration images: the calibration set is empty")
    if model is None:
        model = load_with_shape_infer(model_path)
    names = tensors_to_calibrate(model, op_types if op_types is not None else default_op_types())
    graph_inputs = {i.name for i in model.graph.input}
    want_pct = "percentile" in methods
    want_hist = want_pct or "entropy" in methods
    passes = 2 if want_hist else 1

    from tqdm import tqdm

    bar = tqdm(total=n * passes, desc="calibrate", unit="img", file=sys.stderr, disable=not progress,
               dynamic_ncols=True)
    stats = _Stats()
    try:
        # pass 1: exact streaming min / max (/ min |x|)
        m1 = _pass1_model(model, names, graph_inputs, want_pct)
        sess = _session(m1, providers)
        out_index = {o.name: i for i, o in enumerate(sess.get_outputs())}
        bar.set_description("calibrate pass 1/%d (ranges)" % passes)
        seen = 0
        for chunk in _chunks(iter(inputs), chunk_size):
            for feeds in chunk:
                res = sess.run(None, feeds)
                where = _label(inputs, seen)
                for t in names:
                    if t in graph_inputs:
                        a = np.asarray(feeds[t])
                        lo, hi = np.nanmin(a), np.nanmax(a)
                        amin = np.nanmin(np.abs(a)) if want_pct else None
                    else:
                        lo = _scalar(res[out_index[f"{t}__qb_min"]])
                        hi = _scalar(res[out_index[f"{t}__qb_max"]])
                        amin = _scalar(res[out_index[f"{t}__qb_amin"]]) if want_pct else None
                    _check_finite(t, lo, hi, where)
                    stats.update(t, lo, hi, amin)
                seen += 1
                bar.update(1)
            del chunk
        del sess, m1
        if seen != n:
            raise UserError(f"calibration inputs yielded {seen} items but len() is {n}")

        pct_hist: dict[str, np.ndarray] = {}
        ent_hist: dict[str, np.ndarray] = {}
        pct_range: dict[str, tuple] = {}
        ent_range: dict[str, tuple] = {}
        if want_hist:
            for t in names:
                if want_pct:
                    # onnxruntime: np.histogram(|x|, bins) over the data's own [min|x|, max|x|]
                    amax = max(abs(stats.lo[t]), abs(stats.hi[t]))
                    pct_range[t] = (stats.amin[t], amax)
                    pct_hist[t] = np.zeros(percentile_bins, np.int64)
                if "entropy" in methods:
                    # onnxruntime: np.histogram(x, bins, range=(-T, T)), T = max(|min|, |max|)
                    thr = np.array(max(abs(stats.lo[t]), abs(stats.hi[t])), dtype=stats.lo[t].dtype)
                    ent_range[t] = (-thr, thr)
                    ent_hist[t] = np.zeros(entropy_bins, np.int64)
            # pass 2: integer-count histograms over the fixed ranges
            m2 = _pass2_model(model, names, graph_inputs)
            sess = _session(m2, providers)
            oi = {o.name: i for i, o in enumerate(sess.get_outputs())}
            bar.set_description("calibrate pass 2/2 (histograms)")
            for chunk in _chunks(iter(inputs), chunk_size):
                acts: dict[str, list] = {t: [] for t in names}
                for feeds in chunk:
                    res = sess.run(None, feeds)
                    for t in names:
                        a = feeds[t] if t in graph_inputs else res[oi[t]]
                        acts[t].append(np.asarray(a).ravel())
                    del res
                    bar.update(1)
                for t in names:
                    data = np.concatenate(acts[t]) if len(acts[t]) > 1 else acts[t][0]
                    acts[t] = None
                    if want_pct:
                        h, _ = np.histogram(np.abs(data), bins=percentile_bins, range=pct_range[t])
                        pct_hist[t] += h
                    if ent_hist:
                        h, _ = np.histogram(data, bins=entropy_bins, range=ent_range[t])
                        ent_hist[t] += h
                    del data
                del acts, chunk
            del sess, m2
    finally:
        bar.close()

    result = {}
    for method in methods:
        if method == "minmax":
            # onnxruntime's MinMaxCalibrater yields shape-(1,) arrays
            data = {t: (np.array([stats.lo[t]]), np.array([stats.hi[t]])) for t in names}
            result[method] = TensorsData(CalibrationMethod.MinMax, data)
            continue
        if method == "percentile":
            col = HistogramCollector(method="percentile", symmetric=True, num_bins=percentile_bins,
                                     num_quantized_bins=entropy_quantized_bins, percentile=percentile, scenario="same")
            for t in names:
                edges = _edges(percentile_bins, pct_range[t], stats.lo[t].dtype)
                col.histogram_dict[t] = (pct_hist[t], edges, stats.lo[t], stats.hi[t])
            with contextlib.redirect_stdout(io.StringIO()):
                thresholds = col.compute_percentile()
            result[method] = TensorsData(CalibrationMethod.Percentile, thresholds)
        elif method == "entropy":
            col = HistogramCollector(method="entropy", symmetric=False, num_bins=entropy_bins,
                                     num_quantized_bins=entropy_quantized_bins, percentile=percentile, scenario="same")
            for t in names:
                edges = _edges(entropy_bins, ent_range[t], stats.lo[t].dtype)
                col.histogram_dict[t] = (ent_hist[t], edges, stats.lo[t], stats.hi[t], ent_range[t][1])
            with contextlib.redirect_stdout(io.StringIO()):
                thresholds = col.compute_entropy()
            result[method] = TensorsData(CalibrationMethod.Entropy, thresholds)
    return result


def _edges(bins: int, rng: tuple, dtype) -> np.ndarray:
    """The bin edges np.histogram uses for this range and bin count, in the data's dtype."""
    _, edges = np.histogram(np.zeros(0, dtype=dtype), bins=bins, range=rng)
    return edges.astype(dtype)


def ranges_dict(tensors_data) -> dict:
    """{tensor: [lowest, highest]} as Python floats (float32 values, exact in JSON), sorted."""
    out = {}
    for t in sorted(tensors_data.keys()):
        lo, hi = tensors_data[t].range_value
        out[t] = [float(np.asarray(lo).reshape(-1)[0]), float(np.asarray(hi).reshape(-1)[0])]
    return out


def ranges_sha256(tensors_data) -> str:
    from quantbench.fsutil import canonical_json, sha256_bytes

    return sha256_bytes(canonical_json(ranges_dict(tensors_data)).encode())


def load_ranges(path: str | os.PathLike):
    """The TensorsData saved beside a static variant (<variant>.ranges.json), for re-quantizing
    with other options (types, reduce_range, exclusions) without calibrating again."""
    import json

    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData

    try:
        saved = json.loads(Path(path).read_text())
        method = saved["method"]
        ranges = saved["ranges"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a quantbench ranges file ({exc})") from None
    cm = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
          "entropy": CalibrationMethod.Entropy}.get(method)
    if cm is None:
        raise UserError(f"{path}: unknown calibration method {method!r}")
    if method == "minmax":  # shapes as onnxruntime's MinMaxCalibrater makes them
        data = {t: (np.array([lo], np.float32), np.array([hi], np.float32)) for t, (lo, hi) in ranges.items()}
    else:
        data = {t: (np.array(lo, np.float32), np.array(hi, np.float32), None, None) for t, (lo, hi) in ranges.items()}
    return TensorsData(cm, data)
