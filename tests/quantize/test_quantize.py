"""Calibration ranges and QDQ variants on a tiny constructed model (real onnxruntime, real quantizer)."""

from __future__ import annotations

import json
import random
import weakref

import numpy as np
import onnx
import pytest

from calib_helpers import random_feeds, tiny_model
from quantbench.errors import UserError
from quantbench.fsutil import sha256_file
from quantbench.quantize.calibration import compute_ranges, ranges_dict
from quantbench.quantize.variants import make_dynamic, make_fp32, make_static

METHODS = ["minmax", "percentile", "entropy"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("m") / "tiny.onnx")


class Feeds:
    """Re-iterable feeds that record how many input arrays are alive at once (weak references)."""

    def __init__(self, feeds):
        self._arrays = [f["images"] for f in feeds]
        self.refs: list = []
        self.max_alive = 0

    def __len__(self):
        return len(self._arrays)

    def __iter__(self):
        for a in self._arrays:
            x = a.copy()
            self.refs.append(weakref.ref(x))
            self.max_alive = max(self.max_alive, sum(r() is not None for r in self.refs))
            yield {"images": x}
            del x


def test_ranges_match_stock_quantize_static_byte_for_byte(model, tmp_path):
    """Same ranges as onnxruntime's stock calibrators on the whole set -> byte-identical QDQ models."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    feeds = random_feeds(12)

    class Reader:
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    ours = compute_ranges(model, feeds, METHODS, chunk_size=5)
    for m, cm in [("minmax", CalibrationMethod.MinMax), ("percentile", CalibrationMethod.Percentile),
                  ("entropy", CalibrationMethod.Entropy)]:
        stock = tmp_path / f"stock-{m}.onnx"
        quantize_static(str(model), str(stock), Reader(), calibrate_method=cm, quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        v = make_static(model, tmp_path / f"ours-{m}.onnx", ranges=ours[m], method=m)
        assert sha256_file(v.path) == sha256_file(stock), m


def test_models_identical_across_chunk_sizes_and_order(model, tmp_path):
    feeds = random_feeds(48, seed=3)
    shuffled = list(feeds)
    random.Random(5).shuffle(shuffled)
    runs = {("chunk", 1): feeds, ("chunk", 8): feeds, ("chunk", 48): feeds, ("shuffled", 8): shuffled}
    hashes: dict[str, set] = {m: set() for m in METHODS}
    range_sets: dict[str, set] = {m: set() for m in METHODS}
    for i, ((kind, chunk), data) in enumerate(runs.items()):
        ranges = compute_ranges(model, data, METHODS, chunk_size=chunk)
        for m in METHODS:
            range_sets[m].add(json.dumps(ranges_dict(ranges[m]), sort_keys=True))
            v = make_static(model, tmp_path / f"{m}-{i}.onnx", ranges=ranges[m], method=m)
            hashes[m].add(sha256_file(v.path))
    for m in METHODS:
        assert len(range_sets[m]) == 1, m
        assert len(hashes[m]) == 1, m
    # and the methods really differ: percentile clips what minmax keeps
    r = compute_ranges(model, feeds, ["minmax", "percentile"], chunk_size=8)
    mm, pc = ranges_dict(r["minmax"]), ranges_dict(r["percentile"])
    assert all(pc[t][1] <= mm[t][1] and pc[t][0] >= mm[t][0] for t in mm)
    assert any(pc[t] != mm[t] for t in mm)


def test_entropy_bins_change_the_search(model):
    feeds = random_feeds(4, seed=4)
    feeds[0]["images"][0, 0, 0, 0] = 40.0  # one outlier pixel
    base = ranges_dict(compute_ranges(model, feeds, ["minmax"], op_types=["Relu"])["minmax"])
    e128 = ranges_dict(compute_ranges(model, feeds, ["entropy"], op_types=["Relu"])["entropy"])
    e512 = ranges_dict(compute_ranges(model, feeds, ["entropy"], op_types=["Relu"], entropy_bins=512)["entropy"])
    # onnxruntime's default 128 bins = 128 quantized bins: a single candidate, the min/max range
    assert e128 == base
    # more bins give the KL search room to clip the outlier
    assert e512["c1"][1] < base["c1"][1] / 2


def test_inputs_are_streamed_chunk_by_chunk(model):
    src = Feeds(random_feeds(20, seed=6))
    compute_ranges(model, src, ["percentile"], chunk_size=4)
    assert src.max_alive <= 4 + 1


def test_non_finite_activations_are_named(model, tmp_path):
    bad = random_feeds(3)
    bad[1]["images"][0, 0, 0, 0] = np.inf
    with pytest.raises(UserError, match="calibration input #1.*non-finite"):
        compute_ranges(model, bad, ["minmax"])


def test_variant_options_reach_the_model(model, tmp_path):
    feeds = random_feeds(8)
    r = compute_ranges(model, feeds, ["minmax"])["minmax"]
    s8 = make_static(model, tmp_path / "s8s8.onnx", ranges=r, method="minmax", activation_type="s8", weight_type="s8",
                     recipe_extra={"seed": 7})
    m = onnx.load(str(s8.path))
    zps = [i for i in m.graph.initializer if i.name.endswith("_zero_point") and "_quantized" not in i.name]  # not biases
    assert zps and {i.data_type for i in zps} == {onnx.TensorProto.INT8}
    ex = make_static(model, tmp_path / "ex.onnx", ranges=r, method="minmax", exclude_nodes=["conv1"],
                     exclude_op_types=["MatMul"], per_channel=False, reduce_range=True)
    g = onnx.load(str(ex.path)).graph
    producers = {o: n.op_type for n in g.node for o in n.output}
    kept_float = [n for n in g.node if n.name in ("conv1", "mq", "mk", "head")]
    assert len(kept_float) == 4 and all(producers.get(n.input[1]) != "DequantizeLinear" for n in kept_float)
    conv2 = next(n for n in g.node if n.name == "conv2")
    assert producers.get(conv2.input[1]) == "DequantizeLinear"
    rec = json.loads((tmp_path / "ex.recipe.json").read_text())
    assert rec["exclude_nodes"] == ["conv1"] and rec["exclude_op_types"] == ["MatMul"]
    assert rec["reduce_range"] is True and rec["per_channel"] is False
    assert "MatMul" not in rec["op_types_to_quantize"]
    assert set(rec["versions"]) >= {"onnxruntime", "onnx", "numpy"}
    assert s8.recipe["seed"] == 7 and s8.recipe["ranges_sha256"]
    saved = json.loads((tmp_path / "s8s8.ranges.json").read_text())
    assert saved["ranges"] == ranges_dict(r)


def test_bad_options_are_user_errors(model, tmp_path):
    r = compute_ranges(model, random_feeds(2), ["minmax"])["minmax"]
    with pytest.raises(UserError, match="no node named 'nope'"):
        make_static(model, tmp_path / "x.onnx", ranges=r, method="minmax", exclude_nodes=["nope"])
    with pytest.raises(UserError, match="not 'percentile'"):
        make_static(model, tmp_path / "x.onnx", ranges=r, method="percentile")
    with pytest.raises(UserError, match="types s8u8"):
        make_static(model, tmp_path / "x.onnx", ranges=r, method="minmax", activation_type="s8", weight_type="u8")
    with pytest.raises(UserError, match="chunk_size"):
        compute_ranges(model, random_feeds(2), ["minmax"], chunk_size=0)
    assert not list(tmp_path.glob("x*"))


def test_dynamic_and_fp32_variants_run(model, tmp_path):
    import onnxruntime as ort

    d = make_dynamic(model, tmp_path / "dynamic.onnx")
    f = make_fp32(model, tmp_path / "fp32.onnx")
    assert sha256_file(f.path) == sha256_file(model)
    ops = {n.op_type for n in onnx.load(str(d.path)).graph.node}
    assert ops & {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul"}
    x = random_feeds(1)[0]
    outs = [ort.InferenceSession(str(v.path), providers=["CPUExecutionProvider"]).run(None, x)[0] for v in (f, d)]
    assert outs[0].shape == outs[1].shape and np.isfinite(outs[1]).all()
    assert d.recipe["method"] == "dynamic" and d.recipe["per_channel"] is True


def test_saved_ranges_requantize_identically(model, tmp_path):
    """<variant>.ranges.json is enough to re-quantize with other options (the remedy matrix does this)."""
    from quantbench.quantize.calibration import load_ranges

    r = compute_ranges(model, random_feeds(4), ["minmax", "percentile"])
    for m in r:
        first = make_static(model, tmp_path / f"{m}.onnx", ranges=r[m], method=m)
        for at, wt, rr in [("u8", "s8", False), ("s8", "s8", True)]:
            a = make_static(model, tmp_path / f"a-{m}-{at}{wt}.onnx", ranges=r[m], method=m, activation_type=at,
                            weight_type=wt, reduce_range=rr)
            b = make_static(model, tmp_path / f"b-{m}-{at}{wt}.onnx", ranges=load_ranges(tmp_path / f"{m}.ranges.json"),
                            method=m, activation_type=at, weight_type=wt, reduce_range=rr)
            assert sha256_file(a.path) == sha256_file(b.path)
        assert first.recipe["ranges_file"] == f"{m}.ranges.json"


def test_fixed_histogram_counts_equal_numpy():
    from quantbench.quantize.calibration import _FixedHistogram

    rng = np.random.default_rng(0)
    x = rng.normal(0, 3, 300_000).astype(np.float32)
    x[:5] = [x.min(), x.max(), 0.0, -0.0, x.max()]
    cases = [(2048, (np.abs(x).min(), np.abs(x).max()), np.abs(x)), (128, (x.min(), x.max()), x),
             (7, (np.float32(1.5), np.float32(1.5)), np.full(10, 1.5, np.float32))]
    for bins, rng_, data in cases:
        h = _FixedHistogram(bins, rng_, data.dtype)
        for part in np.array_split(data, 7):
            h.add(part)
        want, edges = np.histogram(data, bins=bins, range=rng_)
        assert np.array_equal(h.counts, want) and np.array_equal(h.edges, edges)

def test_fixed_histogram_equals_numpy_on_edges_outliers_and_dtypes():
    """The rewritten index corrections (clamp, boolean adds, +inf last edge) and the min/max shortcut
    give numpy's counts exactly: values on every edge and one ulp either side, values outside the
    range and NaNs (dropped, as numpy drops them), a zero-width range, float16/32/64 data."""
    from quantbench.quantize.calibration import _FixedHistogram

    rng = np.random.default_rng(7)
    for dtype in (np.float32, np.float16, np.float64):
        for bins, (lo, hi) in [(2048, (0.0, 7.3)), (128, (-3.1, 3.1)), (2048, (1000.0, 1000.25)), (5, (2.0, 2.0)),
                               (2048, (1e-3, 1e-3 + 1e-4))]:
            r = (dtype(lo), dtype(hi))
            try:
                _, edges = np.histogram(np.zeros(0, dtype), bins=bins, range=r)
            except ValueError:  # numpy refuses bins narrower than the dtype resolves: so do we
                with pytest.raises(ValueError):
                    _FixedHistogram(bins, r, dtype)
                continue
            on = edges.astype(dtype)
            near = np.concatenate([on, np.nextafter(on, dtype(-np.inf)), np.nextafter(on, dtype(np.inf))])
            inside = rng.uniform(float(r[0]), float(r[1]), 50_000).astype(dtype)
            for data, name in [(np.concatenate([inside, near[(near >= r[0]) & (near <= r[1])]]), "inside"),
                               (np.concatenate([inside, near, np.array([np.nan, -np.inf, np.inf], dtype)]), "mixed")]:
                rng.shuffle(data)
                h = _FixedHistogram(bins, r, dtype)
                for part in np.array_split(data, 3):
                    h.add(part.copy())
                want, _ = np.histogram(data, bins=bins, range=r)
                assert np.array_equal(h.counts, want), (dtype, bins, r, name)
