"""Calibration ranges in bounded memory, independent of chunking and image order.

onnxruntime's histogram calibrators keep every intermediate output of the whole
calibration set in memory, and its chunked mode re-bins histograms as ranges
grow, so the result depends on chunk size and image order. Here only the
*collection* of statistics is replaced; the range math is onnxruntime's own.

A plan (plan_chunks: the activation bytes per image against --max-memory) picks
one of two ways to collect:

one pass    every image's activations fit in half the budget: the model with every
            calibrated tensor as an output runs one image at a time (batch 1), the
            activations are held, per-tensor min/max come from them, then they are
            binned: as onnxruntime's own calibrators do, one inference per image.
two passes  pass 1 runs the model augmented with ReduceMin/ReduceMax (and
            ReduceMin(Abs) for Percentile) on every calibrated tensor, folding
            min/max image by image; pass 2 runs the all-activations model again and
            bins a chunk of images at a time into histograms whose range and bin
            count pass 1 fixed, adding integer counts.

min/max are exact (signed zeros read as +0), and integer counts over fixed ranges do
not depend on order or chunking, so both ways give the same ranges. The histograms
are laid out exactly as onnxruntime lays out a histogram of the whole set collected
at once (Percentile: |x| over [min|x|, max|x|], 2048 bins; Entropy: x over [-T, T],
T = max(|min|, |max|)), then handed to ``HistogramCollector.compute_percentile`` /
``compute_entropy``. So the ranges equal those of stock ``quantize_static`` run on
the whole set in one go, while memory holds at most the budget's share of
activations and a few KiB of counts per tensor.

The module is split by job: the plan (plan_chunks), the validated request
(_Request) and the tensors to calibrate (_Catalog), pure reducers (_Extremes for
min/max, _histograms + bin_tensors for counts, _tensors_data for onnxruntime's
range math), and the I/O: augmented models and sessions (_Sessions) and the passes
that stream images through them (_one_pass, _ranges_pass, _histogram_pass).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from quantbench.errors import ParameterError, UserError
from quantbench.fsutil import canonical_json, sha256_bytes
from quantbench.inputs.preprocess import load_rgb, to_tensor
from quantbench.quantize import ort_api
from quantbench.quantize.methods import (DEFAULT_PERCENTILE, ENTROPY_BINS, ENTROPY_QUANTIZED_BINS, METHODS,
                                         PERCENTILE_BINS)
#: default --max-memory: this fraction of the memory available when calibration starts
MEMORY_FRACTION = 0.25
#: activations binned per histogram call are sized to about this much (fewer, larger numpy calls);
#: beyond it a bigger chunk only costs memory
CHUNK_TARGET_BYTES = 32 << 20
#: one pass holds every image's activations: only while they are no more than one chunk of the
#: two-pass plan holds, so a one-pass peak never stands above the two-pass peak of a larger set
#: (at 512 MiB, 16 images of a 45 MB classifier peaked at 803 MiB, 64 images in two passes at
#: 564 MiB) and peak memory does not grow with the calibration set, whatever the budget
SINGLE_PASS_BYTES = CHUNK_TARGET_BYTES


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
            raise ParameterError("max_memory", "expected a size like 2GiB, 512M or a number of bytes", text)
        value = int(float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper()))
    if value < 1 << 20:
        raise ParameterError("max_memory", "at least 1 MiB", text)
    return value


def plan_chunks(act_bytes: int, n: int, max_memory: int) -> tuple[str, int]:
    """How to hold activations, from one image's activation bytes and the budget (pure).

    ("single", n): every image's activations fit in SINGLE_PASS_BYTES and in half the budget: one pass, min/max and
    histograms from the held activations (one inference per image, as onnxruntime's calibrators).
    ("chunked", k): two passes; pass 2 holds k images at a time, k sized to about
    CHUNK_TARGET_BYTES and never more than half the budget allows (at least 1).
    Half: onnxruntime's buffers of the image being run and the binning's temporaries
    come on top of what is held.
    """
    act_bytes = max(1, int(act_bytes))
    if n * act_bytes <= min(SINGLE_PASS_BYTES, max_memory // 2):
        return "single", n
    fit = max(1, max_memory // (2 * act_bytes))
    return "chunked", int(max(1, min(fit, -(-CHUNK_TARGET_BYTES // act_bytes), n)))


def default_threads() -> int:
    try:
        return max(1, min(8, len(os.sched_getaffinity(0))))
    except (AttributeError, OSError):
        return max(1, min(8, os.cpu_count() or 1))


class ImageInputs:
    """Re-iterable calibration inputs: image files -> {input name: tensor}, one at a time.

    Images are decoded lazily (quantbench.inputs.preprocess), so iterating holds one
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


class _FixedHistogram:
    """np.histogram(x, bins, range) for one fixed range, with the edges computed once.

    The per-element arithmetic is numpy's uniform-bin path (numpy/lib/_histograms_impl.py):
    same dtypes, same index computation and edge corrections, so the counts are
    exactly those of np.histogram (a test checks it), without recomputing the
    edges on every call.
    """

    #: numpy's own block: its temporaries stay in cache (4x larger blocks bin about half as fast)
    BLOCK = 1 << 16

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


#: a tensor is binned on a thread of its own only from this many elements (the rest on the caller's thread)
THREAD_MIN_ELEMENTS = 1 << 20


def bin_tensors(acts: dict, pct: dict, ent: dict, threads: int = 1) -> None:
    """Add each tensor's activations (a list of 1-d arrays we own) to its histograms.

    Tensors are independent, so those of at least THREAD_MIN_ELEMENTS are spread over
    `threads` threads (numpy releases the GIL in the per-element work); one tensor's arrays
    are always added by one thread, in order, and the counts are integer sums: identical to
    one thread.
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
    size = {t: sum(a.size for a in acts[t]) for t in todo}
    # small tensors on this thread: their numpy calls are too short to gain from a second thread,
    # and handing the GIL back and forth made them 2.5x slower (bench: 239 tensors of 36 K elements)
    big = {t for t in todo if size[t] >= THREAD_MIN_ELEMENTS} if threads > 1 else set()
    if len(big) <= 1:
        big = set()
    for t in todo:
        if t not in big:
            one(t)
    if not big:
        return
    from concurrent.futures import ThreadPoolExecutor

    # largest first: the last thread to finish is not left with the biggest tensor
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="qb-hist") as pool:
        for f in [pool.submit(one, t) for t in sorted(big, key=lambda t: (-size[t], t))]:
            f.result()


# --- the request and the tensors to calibrate ---------------------------------------------------

@dataclass(frozen=True)
class _Request:
    """compute_ranges' parameters, validated (each error names its flag)."""

    methods: tuple
    percentile: float
    percentile_bins: int
    entropy_bins: int
    entropy_quantized_bins: int
    chunk_size: int | None
    budget: int
    threads: int

    @property
    def want_pct(self) -> bool:
        return "percentile" in self.methods

    @property
    def want_ent(self) -> bool:
        return "entropy" in self.methods

    @property
    def want_hist(self) -> bool:
        return self.want_pct or self.want_ent


def check_limits(chunk_size=None, threads=None, max_memory=None, percentile=None) -> None:
    """The one check of calibration's size and precision parameters (None: the default, always valid)."""
    if chunk_size is not None and chunk_size < 1:
        raise ParameterError("chunk_size", f"must be at least 1 (got {chunk_size})")
    if percentile is not None and not 0 < percentile <= 100:
        raise ParameterError("percentile", f"must be in (0, 100] (got {percentile})")
    if threads is not None and int(threads) < 1:
        raise ParameterError("threads", f"must be at least 1 (got {threads})")
    if max_memory is not None:
        parse_memory(max_memory)


def _request(methods, percentile, percentile_bins, entropy_bins, entropy_quantized_bins, chunk_size, max_memory,
             threads) -> _Request:
    methods = tuple(dict.fromkeys(methods))
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ParameterError("methods", f"unknown calibration method(s) {bad}; choose from {list(METHODS)}")
    check_limits(chunk_size, threads or None, max_memory, percentile)  # threads 0: the default
    budget = parse_memory(max_memory) if max_memory is not None else default_max_memory()
    threads = int(threads) if threads else default_threads()
    return _Request(methods, percentile, percentile_bins, entropy_bins, entropy_quantized_bins, chunk_size,
                    budget, threads)


#: ops whose output holds exactly the elements of their first input, moved (none added, dropped or
#: changed): the output's min/max and histograms are the input's, so only the input is measured
SAME_VALUES_OPS = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity"})


class _Catalog:
    """The tensors onnxruntime would calibrate in a model: `all_names` (sorted), their dtypes, and
    the ones measured (`names`): all but the `alias`es, outputs of SAME_VALUES_OPS whose input is
    calibrated too (a fifth of a transformer's activations), which take their source's statistics.
    Of the measured, `outer` are graph inputs (read from the feeds) and `inner` the model computes."""

    def __init__(self, model, op_types: Sequence[str] | None):
        from onnx import helper

        self.all_names = ort_api.tensors_to_calibrate(model, op_types if op_types is not None else default_op_types())
        self.graph_inputs = {i.name for i in model.graph.input}
        self.vi = {v.name: v for v in list(model.graph.value_info) + list(model.graph.output)
                   + list(model.graph.input)}
        self.dtypes = {t: np.dtype(helper.tensor_dtype_to_np_dtype(self.vi[t].type.tensor_type.elem_type))
                       for t in self.all_names}
        self.alias = _aliases(model, self.all_names, self.dtypes)
        self.names = [t for t in self.all_names if t not in self.alias]
        self.inner = [t for t in self.names if t not in self.graph_inputs]
        self.outer = [t for t in self.names if t in self.graph_inputs]

    def static_bytes(self) -> int | None:
        """Bytes of one image's calibrated tensors from the inferred shapes; None if any dim is not static."""
        total = 0
        for t in self.names:
            tt = self.vi[t].type.tensor_type  # every name has one: __init__ read its dtype there
            if not tt.HasField("shape"):
                return None
            size = 1
            for d in tt.shape.dim:
                if not d.HasField("dim_value") or d.dim_value < 0:
                    return None
                size *= d.dim_value
            total += size * self.dtypes[t].itemsize
        return total


def _aliases(model, names: Sequence[str], dtypes: dict) -> dict:
    """{calibrated tensor: the calibrated tensor whose values it holds} through chains of SAME_VALUES_OPS
    (default domain only; main graph, where onnxruntime picks the tensors to calibrate)."""
    calibrated = set(names)
    producer = {o: n for n in model.graph.node for o in n.output}
    alias = {}
    for t in names:
        root = t
        while True:
            node = producer.get(root)
            if (node is None or node.domain not in ("", "ai.onnx") or node.op_type not in SAME_VALUES_OPS
                    or not node.input or node.input[0] not in calibrated or dtypes[node.input[0]] != dtypes[t]):
                break
            root = node.input[0]
        if root != t:
            alias[t] = root
    return alias


# --- pure reducers: min/max, histograms, onnxruntime's range math --------------------------------

#: elements packed per numpy reduction when a one-pass plan folds min/max from the activations
GROUP = 1 << 20


def _non_finite(where: str, t: str) -> UserError:
    return UserError(f"{where}: tensor {t!r} has non-finite values; check the image and the preprocessing, "
                     "or drop the image")


class _Packer:
    """Runs of same-dtype arrays packed into reused 1-d buffers, for one numpy call per run."""

    def __init__(self):
        self._buffers: dict = {}

    def runs(self, arrays: list) -> Iterator[tuple]:
        """(positions, one 1-d buffer, segment starts) per run of same-dtype arrays of up to GROUP
        elements in all; an array of GROUP elements or more is a run of its own, not copied."""
        run, size = [], 0
        for k, a in enumerate(arrays):
            if run and (a.dtype != arrays[run[0]].dtype or size + a.size > GROUP):
                yield self._pack(arrays, run, size)
                run, size = [], 0
            run.append(k)
            size += a.size
        if run:
            yield self._pack(arrays, run, size)

    def _pack(self, arrays: list, run: list, size: int) -> tuple:
        sizes = np.array([arrays[k].size for k in run], np.intp)
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.intp)
        if len(run) == 1:
            return run, arrays[run[0]].reshape(-1), starts
        buf = self.scratch(0, arrays[run[0]].dtype, size)
        np.concatenate([arrays[k].reshape(-1) for k in run], out=buf)
        return run, buf, starts

    def scratch(self, slot: int, dtype, size: int) -> np.ndarray:
        """A reused buffer (a new one per image would cost its page faults every time)."""
        have = self._buffers.get((slot, dtype))
        if have is None or have.size < size:
            have = self._buffers[(slot, dtype)] = np.empty(size, dtype)
        return have[:size]


class _Extremes:
    """Per-tensor min, max and (for Percentile) min |x|, folded image by image.

    min/max are exact, so the fold is independent of order, of chunking and of who reduced
    (onnxruntime's ReduceMin/ReduceMax in pass 1, numpy over held activations in one pass);
    only the sign of a zero could differ, so zeros are read as +0.
    """

    def __init__(self, catalog: _Catalog, want_abs: bool):
        self.names, self.dtypes, self.want_abs = catalog.names, catalog.dtypes, want_abs
        self.index = {t: i for i, t in enumerate(self.names)}
        self.inner_idx = np.array([self.index[t] for t in catalog.inner], np.intp)
        k = len(self.names)
        self.lo, self.hi = np.full(k, np.inf, np.float32), np.full(k, -np.inf, np.float32)
        self.amin = np.full(k, np.inf, np.float32)
        self._packer = _Packer()

    def fold_reduced(self, r_min, r_max, r_amin, where: str) -> None:
        """One image's reductions of the inner tensors (pass 1's outputs, in catalog.inner order)."""
        self._fold(self.inner_idx, r_min, r_max, r_amin, where)

    def fold_image(self, acts: dict, where: str) -> None:
        """One image's tensors {name: array}, reduced by numpy: tensors are packed into a reused buffer
        in runs of up to GROUP elements and each run is reduced by one reduceat per statistic (a few
        numpy calls per image instead of a few per tensor)."""
        names = [t for t, a in acts.items() if a.size]
        r_min, r_max, r_amin = (np.empty(len(names), np.float32) for _ in range(3))
        for ks, buf, starts in self._packer.runs([acts[t] for t in names]):
            r_min[ks] = np.minimum.reduceat(buf, starts)
            r_max[ks] = np.maximum.reduceat(buf, starts)
            if self.want_abs:
                r_amin[ks] = np.minimum.reduceat(np.abs(buf, out=self._packer.scratch(1, buf.dtype, buf.size)), starts)
        self._fold(np.array([self.index[t] for t in names], np.intp), r_min, r_max, r_amin, where)

    def _fold(self, i: np.ndarray, r_min, r_max, r_amin, where: str) -> None:
        # a zero-element tensor reduces to (+inf, -inf): no data, not a non-finite value
        ok = (np.isfinite(r_min) & np.isfinite(r_max)) | ((r_min == np.inf) & (r_max == -np.inf))
        if not ok.all():
            raise _non_finite(where, self.names[i[np.flatnonzero(~ok)[0]]])
        self.lo[i] = np.minimum(self.lo[i], r_min)
        self.hi[i] = np.maximum(self.hi[i], r_max)
        if self.want_abs:
            self.amin[i] = np.minimum(self.amin[i], r_amin)

    def result(self) -> tuple[dict, dict, dict, set]:
        """(lowest, highest, lowest |x|) per tensor as scalars of its own dtype, as onnxruntime's
        np.nanmin/np.nanmax give them, and the tensors without an element in any image
        (range [0, 0], as onnxruntime's calibrators leave them)."""
        empty_at = (self.lo == np.inf) & (self.hi == -np.inf)
        lo, hi, amin = (np.where(empty_at, np.float32(0), v) + np.float32(0) for v in (self.lo, self.hi, self.amin))
        dtypes = self.dtypes
        t_lo = {t: dtypes[t].type(lo[i]) for t, i in self.index.items()}
        t_hi = {t: dtypes[t].type(hi[i]) for t, i in self.index.items()}
        t_amin = {t: dtypes[t].type(amin[i]) for t, i in self.index.items()} if self.want_abs else {}
        return t_lo, t_hi, t_amin, {t for t, i in self.index.items() if empty_at[i]}


def _histograms(req: _Request, catalog: _Catalog, t_lo, t_hi, t_amin, empty) -> tuple[dict, dict, dict]:
    """Empty count histograms laid out as onnxruntime lays out the whole set's -> (pct, ent, ent_thr)."""
    names, dtypes = catalog.names, catalog.dtypes
    pct: dict[str, _FixedHistogram] = {}
    ent: dict[str, _FixedHistogram] = {}
    ent_thr: dict[str, np.ndarray] = {}
    for t in names:
        if t in empty:
            continue
        top = max(abs(t_lo[t]), abs(t_hi[t]))
        if req.want_pct:
            # onnxruntime: np.histogram(|x|, bins) over the data's own [min|x|, max|x|]
            pct[t] = _FixedHistogram(req.percentile_bins, (t_amin[t], top), dtypes[t])
        if req.want_ent:
            # onnxruntime: np.histogram(x, bins, range=(-T, T)), T = max(|min|, |max|)
            thr = np.array(top, dtype=dtypes[t])
            ent[t] = _FixedHistogram(req.entropy_bins, (-thr, thr), dtypes[t])
            ent_thr[t] = thr
    return pct, ent, ent_thr


def _tensors_data(req: _Request, catalog: _Catalog, t_lo, t_hi, empty, pct, ent, ent_thr) -> dict:
    """{method: TensorsData} over every calibrated tensor (an alias gets its source's): MinMax from the
    extremes, the histogram methods through onnxruntime's own compute_percentile / compute_entropy."""
    names, dtypes = catalog.names, catalog.dtypes
    source = {t: catalog.alias.get(t, t) for t in catalog.all_names}
    bins = {"num_quantized_bins": req.entropy_quantized_bins, "percentile": req.percentile}
    result = {}
    for method in req.methods:
        if not METHODS[method].histogram:
            # onnxruntime's MinMaxCalibrater yields shape-(1,) arrays
            data = {t: (np.array([t_lo[s]]), np.array([t_hi[s]])) for t, s in source.items()}
            result[method] = ort_api.tensors_data(method, data)
            continue
        if method == "percentile":
            thresholds = ort_api.percentile_thresholds(
                {t: (pct[t].counts, pct[t].edges.astype(dtypes[t]), t_lo[t], t_hi[t]) for t in names if t not in empty},
                num_bins=req.percentile_bins, **bins)
        else:
            thresholds = ort_api.entropy_thresholds(
                {t: (ent[t].counts, ent[t].edges, t_lo[t], t_hi[t], ent_thr[t]) for t in names if t not in empty},
                num_bins=req.entropy_bins, **bins)
        thresholds.update(_empty_thresholds(empty, dtypes))
        result[method] = ort_api.tensors_data(method, {t: thresholds[s] for t, s in source.items()})
    return result


# --- I/O: augmented models and their sessions -----------------------------------------------------

REDUCED = ("__qb_min", "__qb_max", "__qb_amin")


class _Sessions:
    """onnxruntime sessions of the two augmented models, built on demand from the calibrated model.

    Each augmented model is built, serialized and dropped before its session starts, so no
    copy of the model outlives the session. The two passes of a chunked plan run without the
    memory arena and memory pattern (arena=False): a tensor is then freed as soon as it is
    consumed or binned, instead of the arena keeping the largest image's worth reserved; that
    costs page faults on every run (about a third slower on a 59 MB/image detector), which a
    one-pass plan, whose activations fit the budget anyway, does not pay.
    """

    def __init__(self, model, catalog: _Catalog, want_abs: bool, providers=None):
        self.model, self.catalog, self.want_abs = model, catalog, want_abs
        self.providers = list(providers or ["CPUExecutionProvider"])
        #: pass 1's outputs: one float32 vector per reduction, an element per inner tensor
        self.reduced = [o for o in REDUCED if want_abs or o != "__qb_amin"] if catalog.inner else []

    def _session(self, augmented, arena: bool = True):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as onnxruntime's calibrators
        so.log_severity_level = 3
        so.enable_cpu_mem_arena = so.enable_mem_pattern = arena
        data = augmented.SerializeToString()
        del augmented
        return ort.InferenceSession(data, sess_options=so, providers=self.providers)

    def activations(self, arena: bool = True):
        """Session of the model with every calibrated inner tensor as an output."""
        return self._session(_activations_model(self.model, self.catalog), arena)

    def reductions(self, arena: bool = True):
        """Session of the model whose outputs are self.reduced (pass 1)."""
        return self._session(_reductions_model(self.model, self.catalog, self.want_abs), arena)


def _activations_model(model, catalog: _Catalog):
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    existing = {o.name for o in m.graph.output}
    m.graph.output.extend(catalog.vi[t] for t in catalog.inner if t not in existing)
    return m


def _reductions_model(model, catalog: _Catalog, want_abs: bool):
    """Copy of `model` whose outputs are three float32 vectors, one element per inner tensor
    in catalog.inner order: __qb_min, __qb_max (and __qb_amin = min |x|).

    Each reduction keeps its dims (shape [1] * rank); the reductions of tensors of one rank are
    concatenated as they are and flattened once, the groups concatenated and put in catalog.inner
    order by one Gather: no Reshape per tensor (onnxruntime's cost per node is most of pass 1 on a
    model of many small tensors). Tensors of unknown rank or rank 0 are reshaped each."""
    import onnx
    from onnx import TensorProto, helper
    from onnx import numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "__qb_flat"))
    groups: dict[object, list[int]] = {}  # rank (or "flat") -> positions in catalog.inner
    for i, t in enumerate(catalog.inner):
        tt = catalog.vi[t].type.tensor_type
        rank = len(tt.shape.dim) if tt.HasField("shape") else 0
        groups.setdefault(rank if rank > 0 else "flat", []).append(i)
    order = [i for members in groups.values() for i in members]
    m.graph.initializer.append(numpy_helper.from_array(np.argsort(np.array(order, np.int64)).astype(np.int64), "__qb_order"))
    kinds = ["min", "max"] + (["amin"] if want_abs else [])
    nodes = []
    reduced: dict[tuple, str] = {}  # (kind, position in catalog.inner) -> its float32 reduction, dims kept
    for i, t in enumerate(catalog.inner):
        if want_abs:
            nodes.append(helper.make_node("Abs", [t], [f"__qb_abs_{i}"], name=f"__qb_abs_{i}"))
        for kind in kinds:
            r = f"__qb_{kind}_{i}"
            src = f"__qb_abs_{i}" if kind == "amin" else t
            nodes.append(helper.make_node("ReduceMax" if kind == "max" else "ReduceMin", [src], [r + "_k"],
                                          keepdims=1, name=r + "_k"))
            reduced[kind, i] = r + "_k"
            if catalog.vi[t].type.tensor_type.elem_type != TensorProto.FLOAT:  # exact: float16/bfloat16 -> float32
                nodes.append(helper.make_node("Cast", [r + "_k"], [r + "_c"], to=TensorProto.FLOAT, name=r + "_c"))
                reduced[kind, i] = r + "_c"
    for kind in kinds:
        flat = []
        for g, members in groups.items():
            items = [reduced[kind, i] for i in members]
            name = f"__qb_{kind}_g{g}"
            if g == "flat":
                for k, item in enumerate(items):
                    nodes.append(helper.make_node("Reshape", [item, "__qb_flat"], [f"{name}_{k}"], name=f"{name}_{k}"))
                items = [f"{name}_{k}" for k in range(len(items))]
                nodes.append(helper.make_node("Concat", items, [name], axis=0, name=name))
            else:
                nodes.append(helper.make_node("Concat", items, [name + "_c"], axis=0, name=name + "_c"))
                nodes.append(helper.make_node("Reshape", [name + "_c", "__qb_flat"], [name], name=name))
            flat.append(name)
        nodes.append(helper.make_node("Concat", flat, [f"__qb_{kind}_grouped"], axis=0, name=f"__qb_{kind}_grouped"))
        nodes.append(helper.make_node("Gather", [f"__qb_{kind}_grouped", "__qb_order"], [f"__qb_{kind}"], axis=0,
                                      name=f"__qb_{kind}"))
        m.graph.output.append(helper.make_tensor_value_info(f"__qb_{kind}", TensorProto.FLOAT, [len(catalog.inner)]))
    m.graph.node.extend(nodes)
    return m


# --- I/O: the passes over the images --------------------------------------------------------------

class _Stream:
    """The calibration inputs read once, counted; `where()` names the current image for errors."""

    def __init__(self, inputs, n: int):
        self.inputs, self.n, self.seen = inputs, n, 0
        self._it = iter(inputs)

    def __iter__(self) -> Iterator[dict]:
        for feeds in self._it:
            self.seen += 1
            yield feeds

    def where(self) -> str:
        return _label(self.inputs, self.seen - 1)

    def check_count(self) -> None:
        if self.seen != self.n:
            raise UserError(f"calibration inputs yielded {self.seen} items but len() is {self.n}")


def _activations(catalog: _Catalog, sess, feeds) -> dict:
    """One image's calibrated tensors {name: array}: the session's outputs and the fed inputs."""
    acts = dict(zip(catalog.inner, sess.run(catalog.inner, feeds))) if catalog.inner else {}
    for t in catalog.outer:
        acts[t] = np.asarray(feeds[t])
    return acts


def _to_hold(catalog: _Catalog, t: str, a: np.ndarray) -> np.ndarray:
    """a as a 1-d array the binning may overwrite (|x| is taken in place): a copy of a fed input."""
    return np.array(a).ravel() if t in catalog.graph_inputs else a.ravel()


def _measure(stream: _Stream, sessions: _Sessions, ext: _Extremes):
    """Run the first image through the all-activations model -> (its activation bytes, its activations,
    the session); its min/max are folded. For models whose shapes are not all static."""
    sess = sessions.activations()
    first = next(iter(stream), None)
    if first is None:
        raise UserError(f"calibration inputs yielded 0 items but len() is {stream.n}")
    acts = _activations(sessions.catalog, sess, first)
    ext.fold_image(acts, stream.where())
    return sum(a.nbytes for a in acts.values()), acts, sess


def _one_pass(stream: _Stream, sess, catalog: _Catalog, ext: _Extremes, bar, held: dict) -> None:
    """Every remaining image through the all-activations session; min/max folded, activations held."""
    for feeds in stream:
        acts = _activations(catalog, sess, feeds)
        ext.fold_image(acts, stream.where())
        for t, a in acts.items():
            held[t].append(_to_hold(catalog, t, a))
        del acts, feeds
        bar.update(1)


def _ranges_pass(stream: _Stream, sess, sessions: _Sessions, ext: _Extremes, bar) -> None:
    """Pass 1: every remaining image through the reductions session; min/max folded."""
    catalog, want = sessions.catalog, sessions.reduced
    for feeds in stream:
        where = stream.where()
        if want:
            red = dict(zip(want, sess.run(want, feeds)))
            ext.fold_reduced(red["__qb_min"], red["__qb_max"], red.get("__qb_amin"), where)
        if catalog.outer:
            ext.fold_image({t: np.asarray(feeds[t]) for t in catalog.outer}, where)
        del feeds
        bar.update(1)


def _histogram_pass(inputs, sess, catalog: _Catalog, chunk: int, pct: dict, ent: dict, empty: set, threads: int,
                    bar) -> None:
    """Pass 2: the images again, `chunk` at a time through the all-activations session, binned."""
    for part in _chunks(iter(inputs), chunk):
        held: dict[str, list] = {t: [] for t in catalog.names if t not in empty}
        for feeds in part:
            for t, a in _activations(catalog, sess, feeds).items():
                if t in held:
                    held[t].append(_to_hold(catalog, t, a))
            bar.update(1)
        del part, feeds
        bin_tensors(held, pct, ent, threads)
        del held


# --- the whole: compute_ranges ------------------------------------------------------------------

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
        the available memory). With a histogram method, one image's activations (from the
        inferred shapes, else measured on the first image) and plan_chunks decide: every
        image held at once (one pass) when half the budget holds them, else two passes
        holding a chunk sized from the budget.
    chunk_size: force two passes with this many images' activations held at once.
    threads: histogram binning threads (default: the usable cores, at most 8).
    The result depends on none of these (nor on image order): min/max are exact and the
    histograms are integer counts over ranges fixed before binning.
    model: an already shape-inferred ModelProto of model_path (skips reloading).
    plan: a dict that receives what was decided (mode, chunk, activation bytes per image, budget).
    """
    req = _request(methods, percentile, percentile_bins, entropy_bins, entropy_quantized_bins, chunk_size,
                   max_memory, threads)
    n = len(inputs)
    if n == 0:
        raise UserError("no calibration images: the calibration set is empty")
    if model is None:
        model = ort_api.load_with_shape_infer(model_path)
    catalog = _Catalog(model, op_types)
    sessions = _Sessions(model, catalog, req.want_pct, providers)
    decided = _collect(req, catalog, sessions, inputs, n, progress)
    if plan is not None:
        plan.update(decided["plan"])
    return _tensors_data(req, catalog, *decided["result"])


def _plan(req: _Request, catalog: _Catalog, sessions: _Sessions, stream: _Stream, ext: _Extremes) -> tuple:
    """-> (mode, chunk, activation bytes per image, measured?, activations held so far, session to go on
    with). MinMax alone: "ranges"; else plan_chunks on the bytes from the inferred shapes, or measured
    on the first image (folded, and held if one pass) when the shapes are not all static."""
    if not req.want_hist:
        return "ranges", None, None, False, None, None
    if req.chunk_size is not None:
        return "chunked", req.chunk_size, None, False, None, None
    act_bytes = catalog.static_bytes()
    if act_bytes is not None:
        return (*plan_chunks(act_bytes, stream.n, req.budget), act_bytes, False, None, None)
    act_bytes, first, sess = _measure(stream, sessions, ext)
    mode, chunk = plan_chunks(act_bytes, stream.n, req.budget)
    if mode != "single":
        return mode, chunk, act_bytes, True, None, None  # the measuring session is not kept through pass 1
    return mode, chunk, act_bytes, True, {t: [_to_hold(catalog, t, a)] for t, a in first.items()}, sess


def _collect(req: _Request, catalog: _Catalog, sessions: _Sessions, inputs, n: int, progress: bool) -> dict:
    """Plan, then stream the images (one pass, or ranges then histograms) -> {"plan", "result"}."""
    from tqdm import tqdm

    ext = _Extremes(catalog, req.want_pct)
    stream = _Stream(inputs, n)
    mode, chunk, act_bytes, measured, held, sess = _plan(req, catalog, sessions, stream, ext)
    passes = 1 if mode in ("ranges", "single") else 2
    with tqdm(total=n * passes, initial=stream.seen, desc="calibrate", unit="img", file=sys.stderr,
              disable=not progress, dynamic_ncols=True) as bar:
        if mode == "single":
            bar.set_description("calibrate (one pass, %d images held)" % n)
            held = held or {t: [] for t in catalog.names}
            _one_pass(stream, sess if sess is not None else sessions.activations(), catalog, ext, bar, held)
        else:
            bar.set_description("calibrate pass 1/%d (ranges)" % passes)
            _ranges_pass(stream, sessions.reductions(arena=mode == "ranges"), sessions, ext, bar)
        sess = None
        stream.check_count()
        t_lo, t_hi, t_amin, empty = ext.result()
        pct, ent, ent_thr = _histograms(req, catalog, t_lo, t_hi, t_amin, empty) \
            if req.want_hist else ({}, {}, {})
        if mode == "single":
            bar.set_description("calibrate (histograms)")
            for t in empty:
                held[t] = None
            bin_tensors(held, pct, ent, req.threads)
            held = None
        elif mode == "chunked":
            bar.set_description("calibrate pass 2/2 (histograms, %d image(s) held)" % chunk)
            _histogram_pass(inputs, sessions.activations(arena=False), catalog, chunk, pct, ent, empty,
                            req.threads, bar)
    plan = dict(mode=mode, chunk=chunk, activation_bytes_per_image=act_bytes, measured=measured,
                max_memory=req.budget, threads=req.threads, passes=passes)
    return {"plan": plan, "result": (t_lo, t_hi, empty, pct, ent, ent_thr)}


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
    if not METHODS[method].histogram:  # shapes as onnxruntime's MinMaxCalibrater makes them
        data = {t: (np.array([lo], np.float32), np.array([hi], np.float32)) for t, (lo, hi) in ranges.items()}
    else:
        data = {t: (np.array(lo, np.float32), np.array(hi, np.float32), None, None) for t, (lo, hi) in ranges.items()}
    return ort_api.tensors_data(method, data)


