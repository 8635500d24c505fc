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

import os
import sys
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from quantbench.errors import UserError
from quantbench.fsutil import canonical_json, sha256_bytes
from quantbench.preprocess import load_rgb, to_tensor
from quantbench.quantize import ort_api

METHODS = ("minmax", "percentile", "entropy")
DEFAULT_PERCENTILE = 99.999
PERCENTILE_BINS = 2048        # onnxruntime's create_calibrator default for Percentile
ENTROPY_BINS = 128            # onnxruntime's default histogram bins for Entropy
ENTROPY_QUANTIZED_BINS = 128  # onnxruntime's default quantized bins for Entropy
#: default --max-memory: this fraction of the memory available when calibration starts
MEMORY_FRACTION = 0.25
#: activations binned per histogram call are sized to about this much (fewer, larger numpy calls);
#: beyond it a bigger chunk only costs memory
CHUNK_TARGET_BYTES = 32 << 20
#: a calibration set whose activations all fit in this much (and in half the budget) is held whole
#: and calibrated in one pass, as onnxruntime's own calibrators do; larger sets take two passes
SINGLE_PASS_BYTES = 512 << 20


def available_memory() -> int | None:
    """Bytes of memory available now (Linux MemAvailable), or None when unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def default_max_memory() -> int:
    """The default calibration budget: MEMORY_FRACTION of available memory (1 GiB if unknown)."""
    avail = available_memory()
    return int(avail * MEMORY_FRACTION) if avail else 1 << 30


def parse_memory(text) -> int:
    """'2GiB', '512M', '1.5G', '800000000' -> bytes (binary units: K/M/G/T = 1024^n)."""
    import re

    if isinstance(text, (int, float)):
        value = int(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]?)(i?[bB])?\s*", str(text))
        if not m:
            raise UserError(f"--max-memory {text!r}: expected a size like 2GiB, 512M or a number of bytes")
        value = int(float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper()))
    if value < 1 << 20:
        raise UserError(f"--max-memory {text!r}: at least 1 MiB")
    return value


def plan_chunks(act_bytes: int, n: int, max_memory: int) -> tuple[str, int]:
    """How to hold activations, from one image's activation bytes (measured) and the budget.

    ("single", n): every image's activations fit in SINGLE_PASS_BYTES and in half the budget:
    one pass, ranges and histograms from the held activations (no second inference pass).
    ("chunked", k): two passes; pass 2 holds k images at a time, k sized to about
    CHUNK_TARGET_BYTES and never more than the budget allows (at least 1).
    """
    act_bytes = max(1, int(act_bytes))
    if n * act_bytes <= min(SINGLE_PASS_BYTES, max_memory // 2):
        return "single", n
    fit = max(1, max_memory // (2 * act_bytes))
    return "chunked", int(max(1, min(fit, -(-CHUNK_TARGET_BYTES // act_bytes), n)))


def _static_activation_bytes(vi: dict, names, dtypes) -> int | None:
    """Bytes of one image's calibrated tensors from the inferred shapes; None if any dim is not static."""
    total = 0
    for t in names:
        dims = vi[t].type.tensor_type.shape.dim if t in vi and vi[t].type.tensor_type.HasField("shape") else None
        if dims is None:
            return None
        size = 1
        for d in dims:
            if not d.HasField("dim_value") or d.dim_value < 0:
                return None
            size *= d.dim_value
        total += size * dtypes[t].itemsize
    return total


def default_threads() -> int:
    try:
        return max(1, min(8, len(os.sched_getaffinity(0))))
    except (AttributeError, OSError):
        return max(1, min(8, os.cpu_count() or 1))


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
    return ort_api.static_op_types()


load_with_shape_infer = ort_api.load_with_shape_infer
tensors_to_calibrate = ort_api.tensors_to_calibrate


def _session(model, providers=None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as onnxruntime's calibrators
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), sess_options=so,
                                providers=providers or ["CPUExecutionProvider"])


def _pass1_model(model, names: list[str], graph_inputs: set, want_abs: bool):
    """Copy of `model` with three extra float32 outputs, one element per non-input tensor
    in `names` order: __qb_min, __qb_max (and __qb_amin = min |x|)."""
    import onnx
    from onnx import TensorProto, helper
    from onnx import numpy_helper as nh

    m = onnx.ModelProto()
    m.CopyFrom(model)
    vi = {v.name: v for v in list(m.graph.value_info) + list(m.graph.output) + list(m.graph.input)}
    m.graph.initializer.append(nh.from_array(np.array([-1], np.int64), "__qb_flat"))
    parts: dict[str, list[str]] = {"min": [], "max": [], "amin": []}
    nodes = []
    for i, t in enumerate(t for t in names if t not in graph_inputs):
        et = vi[t].type.tensor_type.elem_type
        todo = [("min", "ReduceMin", t), ("max", "ReduceMax", t)]
        if want_abs:
            nodes.append(helper.make_node("Abs", [t], [f"__qb_abs_{i}"], name=f"__qb_abs_{i}"))
            todo.append(("amin", "ReduceMin", f"__qb_abs_{i}"))
        for kind, op, src in todo:
            r = f"__qb_{kind}_{i}"
            nodes.append(helper.make_node(op, [src], [r + "_k"], keepdims=1, name=r + "_k"))
            if et != TensorProto.FLOAT:  # exact: float16/bfloat16 -> float32
                nodes.append(helper.make_node("Cast", [r + "_k"], [r + "_c"], to=TensorProto.FLOAT, name=r + "_c"))
                r_in = r + "_c"
            else:
                r_in = r + "_k"
            nodes.append(helper.make_node("Reshape", [r_in, "__qb_flat"], [r], name=r))
            parts[kind].append(r)
    for kind, items in parts.items():
        if items:
            nodes.append(helper.make_node("Concat", items, [f"__qb_{kind}"], axis=0, name=f"__qb_{kind}"))
            m.graph.output.append(helper.make_tensor_value_info(f"__qb_{kind}", TensorProto.FLOAT, [len(items)]))
    m.graph.node.extend(nodes)
    return m


class _FixedHistogram:
    """np.histogram(x, bins, range) for one fixed range, with the edges computed once.

    The per-element arithmetic is numpy's uniform-bin path (numpy/lib/_histograms_impl.py):
    same dtypes, same index computation and edge corrections, so the counts are
    exactly those of np.histogram (a test checks it), without recomputing the
    edges on every call.
    """

    BLOCK = 1 << 18

    def __init__(self, bins: int, rng: tuple, dtype):
        from numpy.lib._histograms_impl import _get_bin_edges

        edges, uniform = _get_bin_edges(np.zeros(0, dtype=dtype), bins, rng, None)
        self.edges = edges
        self.first, self.last, self.n = uniform
        self.denom = np.subtract(self.last, self.first, dtype=np.result_type(self.last, self.first))
        self.counts = np.zeros(self.n, np.int64)

    def add(self, a: np.ndarray) -> None:
        n, edges = self.n, self.edges
        for i in range(0, a.size, self.BLOCK):
            x = a[i:i + self.BLOCK]
            keep = x >= self.first
            keep &= x <= self.last
            if not np.logical_and.reduce(keep):
                x = x[keep]
            x = x.astype(edges.dtype, copy=False)
            f = np.subtract(x, self.first, dtype=np.result_type(x, self.first)) / self.denom * n
            idx = f.astype(np.intp)
            idx[idx == n] -= 1
            idx[x < edges[idx]] -= 1
            idx[(x >= edges[idx + 1]) & (idx != n - 1)] += 1
            self.counts += np.bincount(idx, minlength=n)


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


def _batches(arrays: list, block: int) -> Iterator[np.ndarray]:
    """The arrays in order, small neighbours concatenated up to `block` elements (fewer numpy calls,
    no copy of a large array)."""
    buf, size = [], 0
    for a in arrays:
        if a.size >= block:
            if buf:
                yield np.concatenate(buf) if len(buf) > 1 else buf[0]
                buf, size = [], 0
            yield a
            continue
        buf.append(a)
        size += a.size
        if size >= block:
            yield np.concatenate(buf) if len(buf) > 1 else buf[0]
            buf, size = [], 0
    if buf:
        yield np.concatenate(buf) if len(buf) > 1 else buf[0]


def bin_tensors(acts: dict, pct: dict, ent: dict, threads: int = 1) -> None:
    """Add each tensor's activations (a list of 1-d arrays we own) to its histograms.

    Tensors are independent, so they are spread over `threads` threads (numpy releases
    the GIL in the per-element work); one tensor's arrays are always added by one
    thread, in order, and the counts are integer sums: identical to one thread.
    The arrays are consumed (|x| is taken in place) and dropped as they are binned.
    """
    def one(t):
        arrays = acts[t]
        acts[t] = None
        if not arrays:
            return
        for data in _batches(arrays, _FixedHistogram.BLOCK):
            if t in ent:
                ent[t].add(data)
            if t in pct:
                pct[t].add(np.abs(data, out=data) if data.flags.writeable else np.abs(data))
            del data
        del arrays

    todo = [t for t in acts if acts[t] and (t in pct or t in ent)]
    if threads <= 1 or len(todo) <= 1:
        for t in todo:
            one(t)
        return
    from concurrent.futures import ThreadPoolExecutor

    # largest first: the last thread to finish is not left with the biggest tensor
    todo.sort(key=lambda t: -sum(a.size for a in acts[t]))
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="qb-hist") as pool:
        for f in [pool.submit(one, t) for t in todo]:
            f.result()


def compute_ranges(model_path: str | os.PathLike, inputs, methods: Sequence[str] = ("minmax",), *,
                   percentile: float = DEFAULT_PERCENTILE, percentile_bins: int = PERCENTILE_BINS,
                   entropy_bins: int = ENTROPY_BINS, entropy_quantized_bins: int = ENTROPY_QUANTIZED_BINS,
                   op_types: Sequence[str] | None = None, chunk_size: int | None = None,
                   max_memory: int | str | None = None, threads: int | None = None, progress: bool = False,
                   providers: Sequence[str] | None = None, model=None, plan: dict | None = None) -> dict:
    """Calibration ranges for each of `methods` -> {method: onnxruntime TensorsData}.

    model_path: the (float) model to calibrate, exactly the one later quantized.
    inputs: a re-iterable of feeds ({input name: array with batch 1}), e.g.
        ImageInputs; iterated once for MinMax, once or twice when a histogram method is asked.
    op_types: op types whose tensors are calibrated (default: all quantize_static quantizes).
    max_memory: the budget for held activations (bytes or '2GiB'; default MEMORY_FRACTION of
        the available memory). With a histogram method, one image's activations are measured
        and plan_chunks decides: every image held at once (one pass) when half the budget
        holds them, else two passes holding a chunk sized from the budget.
    chunk_size: force two passes with this many images' activations held at once.
    threads: histogram binning threads (default: the usable cores, at most 8).
    The result depends on none of these (nor on image order): min/max are exact and the
    histograms are integer counts over ranges fixed before binning.
    model: an already shape-inferred ModelProto of model_path (skips reloading).
    plan: a dict that receives what was decided (mode, chunk, activation bytes per image, budget).
    """
    methods = list(dict.fromkeys(methods))
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise UserError(f"--methods: unknown calibration method(s) {bad}; choose from {list(METHODS)}")
    if chunk_size is not None and chunk_size < 1:
        raise UserError(f"--chunk-size: must be at least 1 (got {chunk_size})")
    if not 0 < percentile <= 100:
        raise UserError(f"--percentile: must be in (0, 100] (got {percentile})")
    budget = parse_memory(max_memory) if max_memory is not None else default_max_memory()
    threads = int(threads) if threads else default_threads()
    if threads < 1:
        raise UserError(f"--threads: must be at least 1 (got {threads})")
    n = len(inputs)
    if n == 0:
        raise UserError("no calibration images: the calibration set is empty")
    if model is None:
        model = load_with_shape_infer(model_path)
    names = tensors_to_calibrate(model, op_types if op_types is not None else default_op_types())
    graph_inputs = {i.name for i in model.graph.input}
    want_pct = "percentile" in methods
    want_hist = want_pct or "entropy" in methods

    from tqdm import tqdm

    vi = {v.name: v for v in list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input)}
    from onnx import helper

    dtypes = {t: np.dtype(helper.tensor_dtype_to_np_dtype(vi[t].type.tensor_type.elem_type)) for t in names}
    inner = [t for t in names if t not in graph_inputs]
    outer = [t for t in names if t in graph_inputs]
    lo = np.full(len(inner), np.inf, np.float32)
    hi = np.full(len(inner), -np.inf, np.float32)
    amin = np.full(len(inner), np.inf, np.float32)
    lo_in: dict[str, np.generic] = {}
    hi_in: dict[str, np.generic] = {}
    amin_in: dict[str, np.generic] = {}

    def fold_outer(feeds, where):
        for t in outer:
            a = np.asarray(feeds[t])
            if a.size == 0:
                continue
            t_lo, t_hi = np.min(a), np.max(a)
            if not (np.isfinite(t_lo) and np.isfinite(t_hi)):
                raise UserError(f"{where}: tensor {t!r} has non-finite values; check the image and "
                                "the preprocessing, or drop the image")
            lo_in[t] = min(lo_in.get(t, t_lo), t_lo)
            hi_in[t] = max(hi_in.get(t, t_hi), t_hi)
            if want_pct:
                t_am = np.min(np.abs(a))
                amin_in[t] = min(amin_in.get(t, t_am), t_am)

    def fold_inner(r_min, r_max, r_amin, where):
        # a zero-element tensor reduces to (+inf, -inf): no data, not a non-finite value
        empty_now = (r_min == np.inf) & (r_max == -np.inf)
        finite = np.isfinite(r_min) & np.isfinite(r_max)
        if not (finite | empty_now).all():
            bad = next(t for t, ok in zip(inner, finite | empty_now) if not ok)
            raise UserError(f"{where}: tensor {bad!r} has non-finite values; check the image and "
                            "the preprocessing, or drop the image")
        np.minimum(lo, r_min, out=lo)
        np.maximum(hi, r_max, out=hi)
        if want_pct:
            np.minimum(amin, r_amin, out=amin)

    outs = list(inner)
    mode, chunk, act_bytes = ("ranges", None, None)
    sess = sess2 = held = None
    bar = None
    try:
        want = [o for o in ("__qb_min", "__qb_max", "__qb_amin") if want_pct or o != "__qb_amin"] if inner else []
        measured = False
        if want_hist:
            if chunk_size is not None:
                mode, chunk = "chunked", chunk_size
            else:
                act_bytes = _static_activation_bytes(vi, names, dtypes)
                # shapes not all static: measured on the first image (see below)
                mode, chunk = plan_chunks(act_bytes, n, budget) if act_bytes is not None else ("measure", None)
        bar = tqdm(total=n * (1 if mode in ("ranges", "single") else 2), desc="calibrate", unit="img",
                   file=sys.stderr, disable=not progress, dynamic_ncols=True)
        it = iter(inputs)
        seen = 0

        def take(feeds, res):
            """Fold one image's reductions (onnxruntime's, as in pass 1); hold its activations if one pass."""
            where = _label(inputs, seen)
            if want:
                red = dict(zip(want, res[:len(want)]))
                fold_inner(red["__qb_min"], red["__qb_max"], red.get("__qb_amin"), where)
            fold_outer(feeds, where)
            if held is not None:
                for t, a in zip(outs, res[len(want):]):
                    held[t].append(a.ravel())
                for t in outer:
                    held[t].append(np.array(feeds[t]).ravel())
            bar.update(1)

        if mode in ("single", "measure"):
            # every activation as an output plus pass 1's reductions (computed inside onnxruntime,
            # so one pass folds exactly the values pass 1 would)
            sess2 = _session(_pass2_model(_pass1_model(model, names, graph_inputs, want_pct), names,
                                          graph_inputs), providers)
            if mode == "measure":  # shapes not all static: the first image's activations size the plan
                first = next(it, None)
                if first is None:
                    raise UserError(f"calibration inputs yielded 0 items but len() is {n}")
                res = sess2.run(want + outs, first) if (want or outs) else []
                act_bytes = sum(a.nbytes for a in res[len(want):]) + sum(np.asarray(first[t]).nbytes for t in outer)
                measured = True
                mode, chunk = plan_chunks(act_bytes, n, budget)
                if mode == "single":
                    bar.reset(total=n)
                    held = {t: [] for t in names}
                take(first, res)  # folded either way: pass 1 goes on from the next image
                seen = 1
                del res, first
            if mode == "single":
                bar.set_description("calibrate (one pass, %d images held)" % n)
                if held is None:
                    held = {t: [] for t in names}
                for feeds in it:
                    take(feeds, sess2.run(want + outs, feeds) if (want or outs) else [])
                    seen += 1
                    del feeds
            sess2 = None
        if mode in ("ranges", "chunked"):
            # pass 1: exact streaming min / max (/ min |x|), reduced inside onnxruntime
            sess = _session(_pass1_model(model, names, graph_inputs, want_pct), providers)
            bar.set_description("calibrate pass 1/%d (ranges)" % (1 if mode == "ranges" else 2))
            for feeds in it:
                take(feeds, sess.run(want, feeds) if want else [])
                seen += 1
                del feeds
            sess = None
        if seen != n:
            raise UserError(f"calibration inputs yielded {seen} items but len() is {n}")
        # tensors with no element in any image: range [0, 0], as onnxruntime's calibrators leave them
        empty = {t for t, a, b in zip(inner, lo, hi) if a == np.inf and b == -np.inf}
        empty |= {t for t in outer if t not in lo_in}
        for i, t in enumerate(inner):
            if t in empty:
                lo[i] = hi[i] = amin[i] = 0
        # per-tensor scalars in the tensor's own dtype, as onnxruntime's np.nanmin/np.nanmax give them
        zero = {t: dtypes[t].type(0) for t in outer if t in empty}
        t_lo = {t: dtypes[t].type(v) for t, v in zip(inner, lo)} | lo_in | zero
        t_hi = {t: dtypes[t].type(v) for t, v in zip(inner, hi)} | hi_in | zero
        t_amin = ({t: dtypes[t].type(v) for t, v in zip(inner, amin)} | amin_in | zero) if want_pct else {}

        pct: dict[str, _FixedHistogram] = {}
        ent: dict[str, _FixedHistogram] = {}
        ent_thr: dict[str, np.ndarray] = {}
        if want_hist:
            for t in names:
                if t in empty:
                    continue
                if want_pct:
                    # onnxruntime: np.histogram(|x|, bins) over the data's own [min|x|, max|x|]
                    pct[t] = _FixedHistogram(percentile_bins, (t_amin[t], max(abs(t_lo[t]), abs(t_hi[t]))), dtypes[t])
                if "entropy" in methods:
                    # onnxruntime: np.histogram(x, bins, range=(-T, T)), T = max(|min|, |max|)
                    thr = np.array(max(abs(t_lo[t]), abs(t_hi[t])), dtype=dtypes[t])
                    ent[t] = _FixedHistogram(entropy_bins, (-thr, thr), dtypes[t])
                    ent_thr[t] = thr
        if mode == "single":
            bar.set_description("calibrate (histograms)")
            for t in empty:
                held[t] = None
            bin_tensors(held, pct, ent, threads)
            held = None
        elif mode == "chunked":
            # pass 2: integer-count histograms over the fixed ranges, `chunk` images at a time
            if sess2 is None:
                sess2 = _session(_pass2_model(model, names, graph_inputs), providers)
            bar.set_description("calibrate pass 2/2 (histograms, %d image(s) held)" % chunk)
            for part in _chunks(iter(inputs), chunk):
                acts: dict[str, list] = {t: [] for t in names if t not in empty}
                for feeds in part:
                    res = sess2.run(outs, feeds) if outs else []
                    for t, a in zip(outs, res):
                        if t in acts:
                            acts[t].append(a.ravel())
                    for t in outer:
                        if t in acts:
                            acts[t].append(np.array(feeds[t]).ravel())
                    del res
                    bar.update(1)
                del part
                bin_tensors(acts, pct, ent, threads)
                del acts
            sess2 = None
    finally:
        held = sess = sess2 = None
        if bar is not None:
            bar.close()
    if plan is not None:
        plan.update(mode=mode, chunk=chunk, activation_bytes_per_image=act_bytes, measured=measured,
                    max_memory=budget,
                    threads=threads, passes={"ranges": 1, "single": 1, "chunked": 2}[mode])

    result = {}
    for method in methods:
        if method == "minmax":
            # onnxruntime's MinMaxCalibrater yields shape-(1,) arrays
            data = {t: (np.array([t_lo[t]]), np.array([t_hi[t]])) for t in names}
            result[method] = ort_api.tensors_data("minmax", data)
            continue
        bins = {"num_quantized_bins": entropy_quantized_bins, "percentile": percentile}
        if method == "percentile":
            thresholds = ort_api.percentile_thresholds(
                {t: (pct[t].counts, pct[t].edges.astype(dtypes[t]), t_lo[t], t_hi[t]) for t in names if t not in empty},
                num_bins=percentile_bins, **bins)
        elif method == "entropy":
            thresholds = ort_api.entropy_thresholds(
                {t: (ent[t].counts, ent[t].edges, t_lo[t], t_hi[t], ent_thr[t]) for t in names if t not in empty},
                num_bins=entropy_bins, **bins)
        else:
            continue
        thresholds.update(_empty_thresholds(empty, dtypes))
        result[method] = ort_api.tensors_data(method, thresholds)
    return result


def _empty_thresholds(empty, dtypes) -> dict:
    """[0, 0] for tensors without elements, in the 4-tuple form the histogram collectors return."""
    return {t: (np.array(0, dtype=dtypes[t]), np.array(0, dtype=dtypes[t]), np.zeros(0, np.int64), np.zeros(0))
            for t in sorted(empty)}


def ranges_dict(tensors_data) -> dict:
    """{tensor: [lowest, highest]} as Python floats (float32 values, exact in JSON), sorted."""
    out = {}
    for t in sorted(tensors_data.keys()):
        lo, hi = tensors_data[t].range_value
        out[t] = [float(np.asarray(lo).reshape(-1)[0]), float(np.asarray(hi).reshape(-1)[0])]
    return out


def ranges_sha256(tensors_data) -> str:
    return sha256_bytes(canonical_json(ranges_dict(tensors_data)).encode())


def load_ranges(path: str | os.PathLike):
    """The TensorsData saved beside a static variant (<variant>.ranges.json), for re-quantizing
    with other options (types, reduce_range, exclusions) without calibrating again."""
    import json

    try:
        saved = json.loads(Path(path).read_text())
        method = saved["method"]
        ranges = saved["ranges"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a quantbench ranges file ({exc})") from None
    if method not in METHODS:
        raise UserError(f"{path}: unknown calibration method {method!r}")
    if method == "minmax":  # shapes as onnxruntime's MinMaxCalibrater makes them
        data = {t: (np.array([lo], np.float32), np.array([hi], np.float32)) for t, (lo, hi) in ranges.items()}
    else:
        data = {t: (np.array(lo, np.float32), np.array(hi, np.float32), None, None) for t, (lo, hi) in ranges.items()}
    return ort_api.tensors_data(method, data)


method_name = ort_api.method_name
