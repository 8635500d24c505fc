"""A user's own model, end to end on small constructed exports with real-world quirks.

Each test first reproduced a silent failure seen with real third-party models
("any real model"): wrong tensors fed to a model with dynamic H/W, a
batch dim of -1 rejected, Constant-held weights quantized as activations,
old opsets, custom domains, empty tensors, variants published unloaded.
"""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pyarrow.parquet as pq
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

from calib_helpers import make_corpus, tiny_model
from quantbench.cli import main
from quantbench.errors import UserError
from quantbench.inputs.preprocess import load_rgb, to_tensor
from quantbench.quantize import intake, smoke
from quantbench.inputs.variantdir import latest_variants

SIDECAR_INPUT = {"name": "images", "shape": [1, 3, 16, 16], "layout": "NCHW", "color": "RGB", "dtype": "float32",
                 "scale": 1 / 255, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


@pytest.fixture
def corpus(workdir):
    return make_corpus(workdir / "corpus", n_litter=8, n_negative=8, n_eval=4)


def _set_input_dims(path, dims):
    m = onnx.load(str(path))
    shape = m.graph.input[0].type.tensor_type.shape
    for d, v in zip(shape.dim, dims):
        d.Clear()
        if isinstance(v, str):
            d.dim_param = v
        else:
            d.dim_value = v
    onnx.save(m, str(path))


def _fixture_rows(workdir):
    return pq.read_table(workdir / "results" / "tables" / "fixtures").to_pylist()


def calibrate(model, labels, *extra):
    return main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2",
                 "--methods", "dynamic,minmax", *map(str, extra)])


def test_run_feeds_the_calibration_recipe_to_a_dynamic_hw_model(workdir, corpus, capsys):
    """Was: a model with dynamic H/W ran on [1,3,1,1] tensors with 0..1 scaling and equiv reported classes."""
    labels, images = corpus
    model = tiny_model(workdir / "m" / "dyn.onnx")
    _set_input_dims(model, ["batch", 3, "height", "width"])
    assert calibrate(model, labels) == 0
    # the sidecar beside the model is gone: the variants carry their recipe
    os.remove(model.with_suffix(".json"))
    assert main(["run", "--hosts", "x86", "--fixtures", str(labels), "--images", str(images), "--no-progress"]) == 0
    rows = _fixture_rows(workdir)
    assert rows and all(r["shape"] == [1, 3, 16, 16] for r in rows)
    first = sorted(rows, key=lambda r: r["source"])[0]
    want = to_tensor(load_rgb(images / first["source"]), SIDECAR_INPUT)
    got = np.frombuffer(first["tensor"], dtype=np.float32).reshape(first["shape"])
    np.testing.assert_array_equal(got, want)  # mean/std applied, as calibrated


def test_bare_model_with_dynamic_hw_and_no_sidecar_is_an_error(workdir, corpus, capsys):
    labels, images = corpus
    model = tiny_model(workdir / "m" / "bare.onnx", sidecar=False)
    _set_input_dims(model, [1, 3, "h", "w"])
    rc = main(["run", "--hosts", "x86", "--variants", str(model), "--fixtures", str(labels), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "has dynamic dims [1, 3, '?', '?']" in err and "sidecar" in err
    assert not (workdir / "results" / "tables" / "outputs").exists()


def test_sidecar_override_that_differs_from_the_calibration_recipe_stops(workdir, corpus, capsys):
    labels, images = corpus
    model = tiny_model(workdir / "m" / "tiny.onnx")
    assert calibrate(model, labels) == 0
    other = workdir / "other.json"
    other.write_text(json.dumps({"input": {**SIDECAR_INPUT, "mean": [0.5, 0.5, 0.5]}}))
    rc = main(["run", "--hosts", "x86", "--sidecar", str(other), "--fixtures", str(labels), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "differs from the preprocessing variant" in err and "(mean)" in err
    assert "error: --sidecar: its input block differs" in err  # the library marks the parameter, the CLI its flag


def test_batch_dim_minus_one_is_dynamic(workdir, corpus, capsys):
    """Was: "input 'images' has shape [-1, 3, 16, 16] but the preprocessing makes [1, 3, 16, 16]"."""
    labels, _ = corpus
    model = tiny_model(workdir / "m" / "paddle.onnx")
    _set_input_dims(model, [-1, 3, 16, 16])
    assert calibrate(model, labels) == 0
    assert [v.name for v in latest_variants()] == ["fp32", "dynamic", "static-minmax"]


def _constant_weight_model(path, opset=11):
    """Conv weights and BatchNorm parameters in Constant nodes, opset 11: a paddle2onnx-style export."""
    rng = np.random.default_rng(0)

    def const(name, arr):
        return helper.make_node("Constant", [], [name], value=nh.from_array(np.asarray(arr, np.float32), name + "_v"))

    nodes = [const("W1", rng.normal(0, 0.3, (8, 3, 3, 3))), const("B1", rng.normal(0, 0.1, (8,))),
             const("g", rng.uniform(0.5, 1.5, 8)), const("b", rng.normal(0, 0.1, 8)),
             const("mu", rng.normal(0, 0.1, 8)), const("var", rng.uniform(0.5, 1.5, 8)),
             const("W2", rng.normal(0, 0.3, (4, 8, 1, 1))),
             helper.make_node("Conv", ["images", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "g", "b", "mu", "var"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["r"]),
             helper.make_node("Conv", ["r", "W2"], ["out"])]
    g = helper.make_graph(nodes, "constw", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [-1, 3, 16, 16])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [-1, 4, 16, 16])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("Paddle", 1)])
    m.ir_version = 7
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(path))
    path.with_suffix(".json").write_text(json.dumps({"input": SIDECAR_INPUT}))
    return path


@pytest.mark.parametrize("pre_process", [True, False])
def test_constant_weights_and_old_opset_give_loadable_per_channel_variants(workdir, corpus, capsys, pre_process):
    """Was: per-channel DequantizeLinear `axis` on opset 11 (does not load); Constant weights per-tensor, bigger than fp32."""
    labels, _ = corpus
    model = _constant_weight_model(workdir / "m" / "constw.onnx")
    extra = [] if pre_process else ["--no-pre-process"]
    assert calibrate(model, labels, *extra) == 0
    out = capsys.readouterr().out
    assert "7 Constant tensor(s) moved to initializers" in out
    assert "opset 11 converted to 13" in out
    assert "opset import 'Paddle' (version 1) is used by no node" in out
    if not pre_process:
        assert "1 BatchNormalization node(s) left unfolded" in out
    vs = latest_variants()
    fp32 = next(v for v in vs if v.name == "fp32")
    for v in vs:
        assert v.recipe["intake"]["opset"] == {"source": 11, "used": 13}
        if v.name != "fp32":
            q = onnx.load(str(v.path))
            assert not [n for n in q.graph.node if n.op_type == "Constant"]
            # weights quantized as weights: per-channel scales on the Conv weights
            if v.name == "static-minmax":
                dq = [n for n in q.graph.node if n.op_type == "DequantizeLinear"
                      and any(a.name == "axis" for a in n.attribute)]
                assert dq, "no per-channel DequantizeLinear"


def test_custom_domain_nodes_are_refused_by_name(workdir, corpus, capsys):
    labels, _ = corpus
    model = _constant_weight_model(workdir / "m" / "custom.onnx", opset=13)
    m = onnx.load(str(model))
    m.graph.node[-1].domain = "Paddle"
    onnx.save(m, str(model))
    with pytest.raises(UserError, match=r"custom domain \(domain 'Paddle': Conv\)"):
        intake.prepare(model, workdir / "p.onnx")


def test_pre_process_leaves_nothing_in_the_working_folder(workdir, corpus):
    model = tiny_model(workdir / "m" / "t.onnx")
    before = set(os.listdir(workdir))
    rec = intake.prepare(model, workdir / "m" / "prepared.onnx")
    assert rec["symbolic_shape_inference"] == "done"
    assert set(os.listdir(workdir)) == before


def _empty_activation_model(path):
    """Slice makes a zero-element activation that Concat (a quantized op) consumes."""
    inits = [nh.from_array(np.array([0], np.int64), "s0"), nh.from_array(np.array([0], np.int64), "e0"),
             nh.from_array(np.array([1], np.int64), "ax")]
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Slice", ["r", "s0", "e0", "ax"], ["empty"]),
             helper.make_node("Concat", ["r", "empty"], ["y"], axis=1)]
    g = helper.make_graph(nodes, "empty", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def test_empty_tensors_calibrate_to_zero_range(tmp_path):
    """Was: "tensor 'empty' has non-finite values" (min/max of zero elements are +-inf)."""
    from quantbench.quantize.calibration import compute_ranges, ranges_dict

    model = _empty_activation_model(tmp_path / "e.onnx")
    feeds = [{"x": np.array([[v, -v, 2 * v, 0.5]], np.float32)} for v in (0.5, 1.0, 1.5)]
    ranges = compute_ranges(model, feeds, ["minmax", "percentile", "entropy"])
    for method, data in ranges.items():
        r = ranges_dict(data)
        assert r["empty"] == [0.0, 0.0], method
        assert all(np.isfinite(v).all() for v in r.values())
    assert ranges_dict(ranges["minmax"])["r"] == [0.0, 3.0]


def _qdq_axis_on_opset_11(path):
    w = nh.from_array(np.arange(8, dtype=np.int8).reshape(2, 4), "w")
    s = nh.from_array(np.array([0.1, 0.2], np.float32), "s")
    z = nh.from_array(np.zeros(2, np.int8), "z")
    nodes = [helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], axis=0),
             helper.make_node("MatMul", ["x", "wf"], ["y"])]
    g = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w, s, z])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    m.ir_version = 7
    path.write_bytes(m.SerializeToString())
    return path


def test_smoke_check_refuses_an_unloadable_variant(tmp_path):
    good = tmp_path / "good.onnx"
    w = nh.from_array(np.ones((2, 4), np.float32), "wf")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "wf"], ["y"])], "good",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    good.write_bytes(m.SerializeToString())
    feeds = {"x": np.ones((1, 2), np.float32)}
    ref = smoke.reference(good, feeds)
    assert smoke.check(good, feeds, ref) is None
    why = smoke.check(_qdq_axis_on_opset_11(tmp_path / "bad.onnx"), feeds, ref)
    assert why.startswith("does not load or run in onnxruntime") and "axis" in why


def test_calibrate_does_not_publish_a_variant_that_fails_its_smoke_test(workdir, corpus, capsys, monkeypatch):
    """Was: "written" printed for QDQ models onnxruntime refuses to load. The quantizer bug is simulated
    (it cannot be produced on demand); the smoke test and the publication are real."""
    from quantbench.quantize import variants as qv

    labels, _ = corpus
    model = tiny_model(workdir / "m" / "tiny.onnx")
    real = qv.make_static

    def broken(*a, **kw):
        v = real(*a, **kw)
        _qdq_axis_on_opset_11(v.path)
        return v

    monkeypatch.setattr(qv, "make_static", broken)
    assert calibrate(model, labels) == 1
    err = capsys.readouterr().err
    assert "variant static-minmax not published: does not load or run in onnxruntime" in err
    assert [v.name for v in latest_variants()] == ["fp32", "dynamic"]
    folder = workdir / "results" / "variants" / "tiny"
    assert not list(folder.glob("static-minmax*"))


PLUGIN = '''
import numpy as np
from PIL import Image

def gray(rgb, spec):
    """Grayscale replicated to 3 channels, resized to the spec's size, scaled to -1..1."""
    _, _, h, w = spec["shape"]
    g = np.asarray(Image.fromarray(rgb).convert("L").resize((w, h), Image.BILINEAR), np.float32)
    x = np.repeat(g[None, None], 3, axis=1) / np.float32(127.5) - np.float32(1)
    return np.ascontiguousarray(x, np.float32)
'''


def test_preprocess_plugin_is_recorded_used_by_run_and_checked(workdir, corpus, capsys):
    labels, images = corpus
    (workdir / "prep.py").write_text(PLUGIN)
    model = tiny_model(workdir / "m" / "tiny.onnx")
    assert calibrate(model, labels, "--preprocess", "prep.py:gray") == 0
    v = latest_variants()[0]
    assert v.recipe["preprocess"]["plugin"] == "prep.py:gray"
    assert len(v.recipe["preprocess_plugin"]["sha256"]) == 64
    assert main(["run", "--hosts", "x86", "--fixtures", str(labels), "--images", str(images), "--no-progress"]) == 0
    rows = _fixture_rows(workdir)
    x = np.frombuffer(rows[0]["tensor"], dtype=np.float32).reshape(rows[0]["shape"])
    assert np.array_equal(x[0, 0], x[0, 1]) and x.min() >= -1 and x.max() <= 1  # the plug-in made it
    (workdir / "prep.py").write_text(PLUGIN.replace("127.5", "128.0"))
    capsys.readouterr()
    assert main(["run", "--hosts", "x86", "--fixtures", str(labels), "--no-progress"]) == 2
    assert "preprocessing plug-in prep.py:gray changed since calibration" in capsys.readouterr().err


def test_the_library_names_parameters_and_the_cli_names_flags(workdir, corpus, capsys):
    """One validation, in the library: calibrate(CalibrateOptions(...)) says chunk_size, the command says --chunk-size."""
    from quantbench.errors import ParameterError
    from quantbench.quantize.pipeline import CalibrateOptions, calibrate

    labels, _ = corpus
    model = tiny_model(workdir / "m" / "tiny.onnx")
    with pytest.raises(ParameterError, match=r"^chunk_size: must be at least 1 \(got 0\)$"):
        calibrate(CalibrateOptions(model=model, labels=labels, chunk_size=0))
    with pytest.raises(ParameterError, match=r"^methods: unknown \['kl'\]"):
        calibrate(CalibrateOptions(model=model, labels=labels, methods=["kl"]))
    assert calibrate_cli_error(model, labels, "--chunk-size", "0", capsys) == "--chunk-size: must be at least 1 (got 0)"
    assert not (workdir / "results").exists() and not (workdir / "calib_sets").exists()


def calibrate_cli_error(model, labels, flag, value, capsys) -> str:
    capsys.readouterr()
    assert main(["calibrate", "--model", str(model), "--labels", str(labels), flag, value]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    return line.split(": error: ", 1)[1]


def test_calibrate_refuses_a_decode_block_that_cannot_decode_the_model(workdir, corpus, capsys):
    labels, _ = corpus
    model = tiny_model(workdir / "m" / "tiny.onnx")
    side = json.loads(model.with_suffix(".json").read_text())
    model.with_suffix(".json").write_text(json.dumps({**side, "decode": {"kind": "clasifier-softmax"}}))
    assert calibrate(model, labels) == 2
    assert "unknown decode kind" in capsys.readouterr().err
    assert not (workdir / "results").exists() and not (workdir / "calib_sets").exists()
