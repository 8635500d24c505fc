"""Calibration that sizes itself: the plan follows --max-memory and the measured activations; threaded
histograms and the one-pass plan give exactly the ranges (and counts) of one thread and two passes."""

from __future__ import annotations

import numpy as np
import pytest

from calib_helpers import random_feeds, tiny_model
from quantbench.errors import UserError
from quantbench.fsutil import sha256_file
from quantbench.quantize import calibration as C
from quantbench.quantize import ort_api
from quantbench.quantize.calibration import compute_ranges, ranges_dict

METHODS = ["minmax", "percentile", "entropy"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("m") / "tiny.onnx")


def test_parse_memory():
    assert C.parse_memory("2GiB") == 2 << 30
    assert C.parse_memory("512M") == 512 << 20
    assert C.parse_memory("1.5g") == int(1.5 * (1 << 30))
    assert C.parse_memory(3 << 20) == 3 << 20
    for bad in ("lots", "12 parsecs", "100"):
        with pytest.raises(UserError, match="max_memory"):
            C.parse_memory(bad)


def test_plan_follows_the_budget():
    mib = 1 << 20
    # everything fits in half the budget: one pass
    assert C.plan_chunks(4 * mib, 8, 1024 * mib) == ("single", 8)
    # a large detector (58 MiB per image) under a 6 GiB budget: one image at a time, for 8 images as for 200
    # (holding 8 images' 464 MiB in one pass peaked three times higher than two passes)
    assert C.plan_chunks(58 * mib, 8, 6 << 30) == ("chunked", 1)
    assert C.plan_chunks(58 * mib, 200, 6 << 30) == ("chunked", 1)
    # a small model's 200 images (940 MiB of activations) are not held whole, whatever the budget:
    # peak memory must not grow with the calibration set
    assert C.plan_chunks(4.7 * mib, 200, 64 << 30) == ("chunked", 7)
    assert C.plan_chunks(4.7 * mib, 200, 1 << 30) == ("chunked", 7)
    # held whole up to SINGLE_PASS_BYTES, what one chunk of two passes holds (one inference per image, not two)
    assert C.SINGLE_PASS_BYTES == C.CHUNK_TARGET_BYTES
    assert C.plan_chunks(4.7 * mib, 6, 64 << 30) == ("single", 6)
    assert C.plan_chunks(4.7 * mib, 100, 64 << 30) == ("chunked", 7)
    assert C.plan_chunks(mib, 32, 64 << 30) == ("single", 32)
    assert C.plan_chunks(mib, 33, 64 << 30)[0] == "chunked"
    # the boundary: all activations exactly half the budget
    assert C.plan_chunks(mib, 16, 32 * mib) == ("single", 16)
    assert C.plan_chunks(mib, 17, 32 * mib)[0] == "chunked"
    # small activations: chunks of about CHUNK_TARGET_BYTES
    assert C.plan_chunks(4 * mib, 1000, 1024 * mib) == ("chunked", 8)
    # a tight budget caps the chunk below the target, never below one image
    assert C.plan_chunks(4 * mib, 1000, 16 * mib) == ("chunked", 2)
    assert C.plan_chunks(64 * mib, 1000, 16 * mib) == ("chunked", 1)
    assert 0 < C.default_max_memory()


def test_chunk_size_derived_from_max_memory(model):
    feeds = random_feeds(12, seed=4)
    big, small, forced = {}, {}, {}
    r_big = compute_ranges(model, feeds, METHODS, max_memory="1GiB", plan=big)
    assert big["mode"] == "single" and big["passes"] == 1 and big["activation_bytes_per_image"] > 0
    act = big["activation_bytes_per_image"]
    # a budget whose half holds fewer than the 12 images: two passes, the chunk derived from it
    budget = max(1 << 20, 8 * act)
    assert 12 * act > budget // 2
    r_small = compute_ranges(model, feeds, METHODS, max_memory=budget, plan=small)
    assert small["mode"] == "chunked" and small["passes"] == 2
    assert small["chunk"] == max(1, min(budget // (2 * act), -(-C.CHUNK_TARGET_BYTES // act), 12)) >= 2
    r_forced = compute_ranges(model, feeds, METHODS, chunk_size=5, plan=forced)
    assert forced["mode"] == "chunked" and forced["chunk"] == 5
    for m in METHODS:  # the plan never changes the ranges
        assert ranges_dict(r_big[m]) == ranges_dict(r_small[m]) == ranges_dict(r_forced[m]), m


def test_threaded_histograms_identical_to_one_thread(model, monkeypatch):
    rs = np.random.RandomState(0)
    data = {f"t{i}": [rs.randn(int(n)).astype(np.float32) * (i + 1) for n in rs.randint(1, 300_000, 5)]
            for i in range(7)}

    def counts(threads):
        pct = {t: C._FixedHistogram(2048, (np.float32(0), np.float32(8 * (i + 1))), np.dtype(np.float32))
               for i, t in enumerate(data)}
        ent = {t: C._FixedHistogram(128, (np.float32(-8 * (i + 1)), np.float32(8 * (i + 1))), np.dtype(np.float32))
               for i, t in enumerate(data)}
        C.bin_tensors({t: [a.copy() for a in arrs] for t, arrs in data.items()}, pct, ent, threads)
        return {t: (pct[t].counts.tobytes(), ent[t].counts.tobytes()) for t in data}

    one = counts(1)
    assert counts(4) == one and counts(2) == one  # the largest tensors threaded, the rest on this thread
    monkeypatch.setattr(C, "THREAD_MIN_ELEMENTS", 1)  # every tensor on the pool
    assert counts(4) == one and counts(2) == one
    # and the same counts as numpy's own histogram of all the data at once
    for i, t in enumerate(data):
        allx = np.concatenate(data[t])
        want, _ = np.histogram(allx, 128, range=(np.float32(-8 * (i + 1)), np.float32(8 * (i + 1))))
        assert np.frombuffer(one[t][1], np.int64).tolist() == want.tolist()


def test_threads_and_plans_give_the_same_models(model, tmp_path):
    from quantbench.quantize.variants import make_static

    feeds = random_feeds(10, seed=9)
    shas = set()
    for i, kw in enumerate([{"threads": 1, "chunk_size": 3}, {"threads": 4, "chunk_size": 3}, {"threads": 3},
                            {"threads": 2, "max_memory": "1MiB"}]):
        r = compute_ranges(model, feeds, ["percentile"], **kw)
        shas.add(sha256_file(make_static(model, tmp_path / f"v{i}.onnx", ranges=r["percentile"],
                                         method="percentile").path))
    assert len(shas) == 1


def test_activation_bytes_measured_when_shapes_are_not_static(model, tmp_path):
    import onnx

    m = onnx.load(str(model))
    for vi in list(m.graph.input) + list(m.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_param = "N"  # a dynamic batch: inferred shapes are symbolic
    del m.graph.value_info[:]
    dyn = tmp_path / "dyn.onnx"
    onnx.save(m, str(dyn))
    feeds = random_feeds(6, seed=2)
    static_plan, dyn_plan = {}, {}
    r_static = compute_ranges(model, feeds, METHODS, plan=static_plan)
    r_dyn = compute_ranges(dyn, feeds, METHODS, plan=dyn_plan)
    assert static_plan["measured"] is False and dyn_plan["measured"] is True
    assert dyn_plan["activation_bytes_per_image"] == static_plan["activation_bytes_per_image"]
    assert dyn_plan["mode"] == static_plan["mode"] == "single"
    for m_ in METHODS:
        assert ranges_dict(r_static[m_]) == ranges_dict(r_dyn[m_]), m_
    # measured during pass 1, a plan of two passes goes on from the first image
    more = random_feeds(12, seed=2)
    budget = max(1 << 20, 8 * dyn_plan["activation_bytes_per_image"])
    chunked_plan = {}
    r_chunked = compute_ranges(dyn, more, METHODS, max_memory=budget, plan=chunked_plan)
    assert chunked_plan["measured"] is True and chunked_plan["mode"] == "chunked"
    r_ref = compute_ranges(model, more, METHODS, chunk_size=12)
    for m_ in METHODS:
        assert ranges_dict(r_chunked[m_]) == ranges_dict(r_ref[m_]), m_


def _zeros_model(path, empty_branch: bool):
    """Relu then Mul by -1: tensors whose min or max is a zero of either sign; optionally an Add of a
    zero-element Slice (a tensor with no element in any image)."""
    import onnx
    from onnx import TensorProto, helper
    from onnx import numpy_helper as nh

    inits = [nh.from_array(np.array(-1.0, np.float32), "m1")]
    nodes = [helper.make_node("Relu", ["images"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "m1"], ["neg"], name="neg"),
             helper.make_node("Add", ["neg", "images"], ["out"], name="add")]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 3, 4, 4])]
    if empty_branch:
        inits += [nh.from_array(np.array([0], np.int64), n) for n in ("s0", "e0", "ax")]
        nodes += [helper.make_node("Slice", ["images", "s0", "e0", "ax"], ["none"], name="slice"),
                  helper.make_node("Add", ["none", "none"], ["none2"], name="add_empty")]
        outputs.append(helper.make_tensor_value_info("none2", TensorProto.FLOAT, [0, 3, 4, 4]))
    g = helper.make_graph(nodes, "zeros", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 4, 4])],
                          outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def _zeros_feeds(n):
    rng = np.random.default_rng(7)
    feeds = []
    for _ in range(n):
        x = rng.normal(0, 1, (1, 3, 4, 4)).astype(np.float32)
        x.flat[:4] = [0.0, -0.0, -0.0, 0.0]
        feeds.append({"images": x})
    return feeds


def test_one_pass_and_two_passes_give_the_same_bytes_with_signed_and_empty_tensors(tmp_path):
    """One pass (numpy min/max over held activations) and two passes (onnxruntime's ReduceMin/Max)
    agree to the byte, zeros of either sign read as +0, a tensor without elements ranges [0, 0]."""
    import json

    model = _zeros_model(tmp_path / "zeros.onnx", empty_branch=True)
    feeds = _zeros_feeds(6)
    texts, plans = set(), []
    for kw in ({"max_memory": "1GiB", "threads": 2}, {"chunk_size": 2, "threads": 1}, {"chunk_size": 6}):
        plan = {}
        r = compute_ranges(model, feeds, METHODS, plan=plan, **kw)
        plans.append(plan["mode"])
        texts.add(json.dumps({m: ranges_dict(r[m]) for m in METHODS}, sort_keys=True))
    assert plans == ["single", "chunked", "chunked"]
    assert len(texts) == 1
    ranges = json.loads(texts.pop())
    assert "-0.0" not in json.dumps(ranges)
    assert ranges["minmax"]["r"][0] == 0.0 and ranges["minmax"]["neg"][1] == 0.0
    assert all(ranges[m]["none2"] == [0.0, 0.0] for m in METHODS)


def test_signed_zero_ranges_quantize_as_stock(tmp_path):
    """Zeros read as +0 change no byte of the quantized model: identical to stock quantize_static."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    from quantbench.quantize.variants import make_static

    model = _zeros_model(tmp_path / "zeros.onnx", empty_branch=False)
    feeds = _zeros_feeds(5)
    for m, cm in [("minmax", CalibrationMethod.MinMax), ("percentile", CalibrationMethod.Percentile),
                  ("entropy", CalibrationMethod.Entropy)]:
        it = iter(feeds)

        class Reader:
            def get_next(self):
                return next(it, None)

        stock = tmp_path / f"stock-{m}.onnx"
        quantize_static(str(model), str(stock), Reader(), calibrate_method=cm, quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        for i, kw in enumerate(({"max_memory": "1GiB"}, {"chunk_size": 2})):
            r = compute_ranges(model, feeds, [m], **kw)
            v = make_static(model, tmp_path / f"ours-{m}-{i}.onnx", ranges=r[m], method=m)
            assert sha256_file(v.path) == sha256_file(stock), (m, kw)


def test_one_pass_exactly_when_half_the_budget_holds_every_image(tmp_path):
    import json

    model = tiny_model(tmp_path / "tiny32.onnx", hw=32)
    feeds = random_feeds(8, hw=32, seed=11)
    first = {}
    compute_ranges(model, feeds, ["percentile"], max_memory="1GiB", plan=first)
    act = first["activation_bytes_per_image"]
    assert 8 * act * 2 > 1 << 20  # the boundary budget is above parse_memory's 1 MiB floor
    texts = set()
    for budget, mode in ((2 * 8 * act, "single"), (2 * 8 * act - 2, "chunked")):
        for threads in (1, 3):
            plan = {}
            r = compute_ranges(model, feeds, METHODS, max_memory=budget, threads=threads, plan=plan)
            assert (plan["mode"], plan["passes"]) == (mode, 1 if mode == "single" else 2), budget
            texts.add(json.dumps({m: ranges_dict(r[m]) for m in METHODS}, sort_keys=True))
    assert len(texts) == 1  # one pass or two, one thread or three: the same ranges to the byte


def test_reshaped_and_transposed_copies_are_measured_once(model, monkeypatch):
    """Outputs of Reshape/Transpose/... of a calibrated tensor hold its values: they are not run out of
    the model, held or binned, and get exactly the ranges measuring them would give."""
    m = ort_api.load_with_shape_infer(model)
    catalog = C._Catalog(m, None)
    assert catalog.alias == {"kt": "k", "t": "a2", "tt": "a2"}  # tt = Transpose(t), t = Reshape(a2): a chain
    assert not set(catalog.alias) & set(catalog.names)
    outputs = {o.name for o in C._activations_model(m, catalog).graph.output}
    assert not set(catalog.alias) & outputs and set(catalog.inner) <= outputs
    feeds = random_feeds(6, seed=3)
    kept = compute_ranges(model, feeds, C.METHODS)
    small = compute_ranges(model, feeds, C.METHODS, chunk_size=2)  # two passes: the reductions model too
    monkeypatch.setattr(C, "SAME_VALUES_OPS", frozenset())
    assert C._Catalog(m, None).alias == {}
    measured = compute_ranges(model, feeds, C.METHODS)
    for method in C.METHODS:
        assert ranges_dict(kept[method]) == ranges_dict(measured[method]) == ranges_dict(small[method]), method
        got = ranges_dict(kept[method])
        assert got["tt"] == got["t"] == got["a2"] and got["kt"] == got["k"]


def test_float16_tensors_reduce_exactly_in_both_plans(tmp_path):
    """float16 activations go through pass 1's Cast to float32 (exact) and give the ranges a one-pass plan
    gives, the grouped reductions included (tensors of two ranks)."""
    import onnx
    from onnx import TensorProto, helper
    from onnx import numpy_helper as nh

    w = nh.from_array(np.linspace(-2, 3, 12, dtype=np.float16).reshape(1, 3, 2, 2), "w")
    b = nh.from_array(np.array([0.5, -1.0], np.float16), "b")
    shape = nh.from_array(np.array([1, -1], np.int64), "shape")
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("Mul", ["h", "w"], ["m"]), helper.make_node("Add", ["m", "m"], ["a"]),
             helper.make_node("Reshape", ["a", "shape"], ["r"]), helper.make_node("Add", ["r", "r"], ["r2"]),
             helper.make_node("Cast", ["r2"], ["y"], to=TensorProto.FLOAT)]
    g = helper.make_graph(nodes, "f16", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 2, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 12])], [w, b, shape])
    path = tmp_path / "f16.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    rs = np.random.RandomState(5)
    feeds = [{"x": rs.randn(1, 3, 2, 2).astype(np.float32) * (k + 1)} for k in range(5)]
    methods = ["minmax", "entropy"]  # float16 has too few values for Percentile's 2048 bins over these ranges
    one = compute_ranges(path, feeds, methods, op_types=["Mul", "Add"])
    two = compute_ranges(path, feeds, methods, op_types=["Mul", "Add"], chunk_size=2)
    for method in methods:
        assert ranges_dict(one[method]) == ranges_dict(two[method]), method
    got = ranges_dict(one["minmax"])
    assert C._Catalog(ort_api.load_with_shape_infer(path), ["Mul", "Add"]).alias == {"r": "a"}
    assert got["r"] == got["a"] and got["m"][0] < 0 < got["m"][1]
