"""The onnxruntime quantization internals quantbench relies on, checked where they live.

quantbench.quantize.ort_api is the only module that touches onnxruntime.quantization /
onnxruntime.tools. Each test here pins one thing an ort_api function depends on and,
when an onnxruntime upgrade changes it, fails saying which internal drifted and which
ort_api function to fix. The behavioural check at the end quantizes a tiny model
through ort_api and compares it with stock quantize_static byte for byte (all three
calibration methods, through compute_ranges/make_static:
tests/quantize/test_quantize.py::test_ranges_match_stock_quantize_static_byte_for_byte).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime
import pytest

from calib_helpers import random_feeds, tiny_model
from quantbench.fsutil import sha256_file
from quantbench.quantize import ort_api
from quantbench.quantize.methods import METHODS

ROOT = Path(__file__).resolve().parents[2]


def drifted(internal: str, fix: str, detail: str) -> str:
    return (f"onnxruntime {onnxruntime.__version__} (ort_api written against {ort_api.WRITTEN_AGAINST}): "
            f"{internal} drifted: {detail}. Fix quantbench.quantize.ort_api.{fix}.")


def params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def self_attributes(fn) -> set[str]:
    """The attributes of `self` a function's source reads."""
    return set(re.findall(r"\bself\.(\w+)", inspect.getsource(fn)))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("m") / "tiny.onnx")


# --- signatures and attributes -------------------------------------------------------------

def test_qdq_quantizer_positional_parameters():
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    want = ["self", "model", "per_channel", "reduce_range", "weight_qType", "activation_qType", "tensors_range",
            "nodes_to_quantize", "nodes_to_exclude", "op_types_to_quantize", "extra_options"]
    got = params(QDQQuantizer.__init__)
    assert got[:len(want)] == want, drifted("QDQQuantizer.__init__ (called positionally)", "qdq_quantize",
                                            f"parameters {got}, expected {want} in this order")
    assert callable(getattr(QDQQuantizer, "quantize_model", None)), drifted(
        "QDQQuantizer.quantize_model", "qdq_quantize", "method missing")


def test_quantizer_parameters_quantized_outputs_read():
    """quantize_float_outputs reads a quantizer's ranges and asks it for a tensor's parameters as its own pairs do."""
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    got = params(QDQQuantizer.calc_quant_params)
    assert got[:3] == ["self", "tensor_data", "quant_overrides"], drifted(
        "QDQQuantizer.calc_quant_params", "quantize_float_outputs", f"parameters {got}")
    assert "tensors_range" in self_attributes(QDQQuantizer.calc_graph_quant_params), drifted(
        "QDQQuantizer.tensors_range", "quantize_float_outputs", "no longer where the quantizer keeps its ranges")


def test_opset_update_and_argument_check():
    from onnxruntime.quantization.quant_utils import update_opset_version
    from onnxruntime.quantization.quantize import check_static_quant_arguments

    got = params(update_opset_version)
    want = ["model", "weight_type", "activation_type", "tensor_quant_overrides", "block_size"]
    assert all(p in got for p in want) and got[:3] == want[:3], drifted(
        "quant_utils.update_opset_version", "qdq_quantize", f"parameters {got}, expected {want}")
    got = params(check_static_quant_arguments)
    want = ["quant_format", "activation_type", "weight_type"]
    assert got == want, drifted("quantize.check_static_quant_arguments", "check_static_types",
                                f"parameters {got}, expected {want}")


def test_onnx_model_save():
    from onnxruntime.quantization.onnx_model import ONNXModel

    got = params(ONNXModel.save_model_to_file)
    assert got[:3] == ["self", "output_path", "use_external_data_format"], drifted(
        "ONNXModel.save_model_to_file", "save_quantized", f"parameters {got}")


def test_fast_lookups_replace_what_onnxruntime_defines(model):
    """_fast_lookups swaps two onnxruntime internals for faster equals: they must still exist, be
    reached the way it patches them, and do what onnxruntime's own do."""
    import onnx
    from onnxruntime.quantization import base_quantizer, qdq_quantizer, quant_utils
    from onnxruntime.quantization.onnx_model import ONNXModel

    for mod in (qdq_quantizer, base_quantizer):
        assert getattr(mod, "find_by_name", None) is quant_utils.find_by_name, drifted(
            f"{mod.__name__}.find_by_name", "_fast_lookups", "no longer imported from quant_utils by name")
    assert params(quant_utils.find_by_name) == ["item_name", "item_list"], drifted(
        "quant_utils.find_by_name", "_first_named", f"parameters {params(quant_utils.find_by_name)}")
    items = [SimpleNamespace(name=n, k=k) for k, n in enumerate(["a", "b", "a", "c"])]
    for name in ("a", "b", "c", "zz"):
        assert ort_api._first_named(name, items) is quant_utils.find_by_name(name, items), name
    assert params(ONNXModel.replace_input_of_all_nodes) == ["self", "old_input_name", "new_input_name"], drifted(
        "ONNXModel.replace_input_of_all_nodes", "_replace_input_of_all_nodes",
        f"parameters {params(ONNXModel.replace_input_of_all_nodes)}")
    assert isinstance(inspect.getattr_static(ONNXModel, "replace_node_input"), staticmethod), drifted(
        "ONNXModel.replace_node_input", "_replace_input_of_all_nodes", "no longer a staticmethod")
    proto = onnx.load(str(model))
    ours, theirs = ONNXModel(onnx.load(str(model))), ONNXModel(onnx.load(str(model)))
    for node in proto.graph.node:
        for name in list(node.input)[:1]:
            theirs.replace_input_of_all_nodes(name, name + "_q")
            ort_api._replace_input_of_all_nodes(ours, name, name + "_q")
    assert ours.model.SerializeToString() == theirs.model.SerializeToString()


def test_fast_lookups_restore_onnxruntime_even_on_error(model):
    from onnxruntime.quantization import base_quantizer, qdq_quantizer, quant_utils
    from onnxruntime.quantization.onnx_model import ONNXModel

    stock = quant_utils.find_by_name
    quantizer = SimpleNamespace(model=ONNXModel(ort_api.load_with_shape_infer(model)))
    with pytest.raises(RuntimeError):
        with ort_api._fast_lookups(quantizer):
            assert qdq_quantizer.find_by_name is base_quantizer.find_by_name is ort_api._first_named
            raise RuntimeError("boom")
    assert qdq_quantizer.find_by_name is base_quantizer.find_by_name is stock
    assert "replace_input_of_all_nodes" not in vars(quantizer.model)


def test_histogram_collector():
    from onnxruntime.quantization.calibrate import HistogramCollector

    kwargs = ["method", "symmetric", "num_bins", "num_quantized_bins", "percentile", "scenario"]
    got = params(HistogramCollector.__init__)
    missing = [k for k in kwargs if k not in got]
    assert not missing, drifted("HistogramCollector.__init__", "_histogram_collector",
                                f"keyword(s) {missing} gone (parameters {got})")
    col = HistogramCollector(method="percentile", symmetric=True, num_bins=8, num_quantized_bins=4,
                             percentile=99.0, scenario="same")
    assert isinstance(getattr(col, "histogram_dict", None), dict), drifted(
        "HistogramCollector.histogram_dict", "percentile_thresholds / entropy_thresholds",
        "no longer a dict attribute filled by hand")
    for name, fix in [("compute_percentile", "percentile_thresholds"), ("compute_entropy", "entropy_thresholds")]:
        fn = getattr(HistogramCollector, name, None)
        assert callable(fn) and params(fn) == ["self"], drifted(
            f"HistogramCollector.{name}", fix, "missing or now takes arguments")
        reads = self_attributes(fn) - {"histogram_dict", "num_bins", "num_quantized_bins", "percentile",
                                       "symmetric", "method", "scenario"}
        reads = {r for r in reads if not callable(getattr(HistogramCollector, r, None))}
        assert not reads, drifted(f"HistogramCollector.{name}", fix, f"reads new state {sorted(reads)}")


def test_histogram_thresholds_run():
    """The tuple layouts the thresholds functions fill histogram_dict with are still accepted."""
    counts = np.array([5, 3, 2, 1, 1, 0, 0, 1], np.int64)
    edges = np.linspace(0, 4, 9).astype(np.float32)
    lo, hi = np.float32(0), np.float32(4)
    try:
        pct = ort_api.percentile_thresholds({"t": (counts, edges, lo, hi)}, num_bins=8, num_quantized_bins=4,
                                            percentile=99.0)
    except Exception as exc:  # noqa: BLE001 - the message is the point
        pytest.fail(drifted("HistogramCollector.compute_percentile", "percentile_thresholds", repr(exc)))
    assert set(pct) == {"t"} and len(pct["t"]) == 4, drifted(
        "HistogramCollector.compute_percentile", "percentile_thresholds", f"returned {pct!r}")
    edges = np.linspace(-4, 4, 9).astype(np.float32)
    try:
        ent = ort_api.entropy_thresholds({"t": (counts, edges, np.float32(-4), hi, np.float32(4))}, num_bins=8,
                                         num_quantized_bins=4, percentile=99.0)
    except Exception as exc:  # noqa: BLE001
        pytest.fail(drifted("HistogramCollector.compute_entropy", "entropy_thresholds", repr(exc)))
    assert set(ent) == {"t"} and len(ent["t"]) == 4, drifted(
        "HistogramCollector.compute_entropy", "entropy_thresholds", f"returned {ent!r}")


def test_select_tensors_to_calibrate(model):
    from onnxruntime.quantization.calibrate import CalibraterBase

    fn = getattr(CalibraterBase, "select_tensors_to_calibrate", None)
    assert callable(fn), drifted("CalibraterBase.select_tensors_to_calibrate", "tensors_to_calibrate", "missing")
    got = params(fn)
    assert got == ["self", "model"], drifted("CalibraterBase.select_tensors_to_calibrate", "tensors_to_calibrate",
                                             f"parameters {got}, expected ['self', 'model']")
    reads = self_attributes(fn)
    assert reads <= {"op_types_to_calibrate"}, drifted(
        "CalibraterBase.select_tensors_to_calibrate", "tensors_to_calibrate",
        f"reads self.{sorted(reads)}; the stand-in self has only op_types_to_calibrate")
    m = ort_api.load_with_shape_infer(model)
    names, infos = fn(SimpleNamespace(op_types_to_calibrate=["Conv"]), m)
    assert set(names) == {"images", "c1", "r1", "c2"} and isinstance(infos, dict), drifted(
        "CalibraterBase.select_tensors_to_calibrate", "tensors_to_calibrate", f"returned {names!r}")


def test_tensors_data_tuple_shapes():
    from onnxruntime.quantization.calibrate import TensorsData

    assert params(TensorsData.__init__)[:3] == ["self", "calibration_method", "data"], drifted(
        "TensorsData.__init__", "tensors_data", f"parameters {params(TensorsData.__init__)}")
    shapes = {"minmax": (np.array([-1.0], np.float32), np.array([2.0], np.float32)),
              "percentile": (np.array(-1.0, np.float32), np.array(2.0, np.float32), None, None),
              "entropy": (np.array(-1.0, np.float32), np.array(2.0, np.float32), np.zeros(3, np.int64),
                          np.zeros(4, np.float32))}
    for method, value in shapes.items():
        try:
            td = ort_api.tensors_data(method, {"t": value})
            lo, hi = td["t"].range_value
        except Exception as exc:  # noqa: BLE001
            pytest.fail(drifted("TensorsData / TensorData", "tensors_data",
                                f"a {len(value)}-tuple for {method} is refused ({exc!r})"))
        assert (float(np.asarray(lo).reshape(-1)[0]), float(np.asarray(hi).reshape(-1)[0])) == (-1.0, 2.0)
        assert ort_api.method_name(td) == method, drifted("TensorsData.calibration_method", "method_name", method)


def test_enums_and_registries():
    for name in ["QUInt8", "QInt8", "QUInt16", "QInt16"]:
        try:
            ort_api.quant_type(name)
        except AttributeError:
            pytest.fail(drifted(f"QuantType.{name}", "quant_type", "member gone"))
    for method in METHODS:
        try:
            ort_api.calibration_method(method)
        except (AttributeError, ImportError) as exc:
            pytest.fail(drifted("CalibrationMethod", "calibration_method", repr(exc)))
    static, dynamic = ort_api.static_op_types(), ort_api.dynamic_op_types()
    assert {"Conv", "MatMul"} <= set(static), drifted("registry.QLinearOpsRegistry | QDQRegistry",
                                                     "static_op_types", f"now {static}")
    assert {"Conv", "MatMul"} <= set(dynamic), drifted("registry.IntegerOpsRegistry", "dynamic_op_types",
                                                      f"now {dynamic}")


def test_public_functions_used():
    from onnxruntime.quantization import quantize_dynamic
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer
    from onnxruntime.quantization.shape_inference import quant_pre_process

    got = params(quant_pre_process)
    assert got[:2] == ["input_model", "output_model_path"] and "skip_symbolic_shape" in got, drifted(
        "shape_inference.quant_pre_process", "pre_process", f"parameters {got}")
    got = params(load_model_with_shape_infer)
    assert got == ["model_path"], drifted("quant_utils.load_model_with_shape_infer", "load_with_shape_infer",
                                          f"parameters {got}")
    got = params(quantize_dynamic)
    want = ["op_types_to_quantize", "per_channel", "reduce_range", "weight_type", "nodes_to_exclude",
            "extra_options"]
    missing = [k for k in want if k not in got]
    assert got[:2] == ["model_input", "model_output"] and not missing, drifted(
        "quantize_dynamic", "dynamic_quantize", f"parameters {got} (missing {missing})")


def test_qdq_loss_debug_functions():
    from onnxruntime.quantization import qdq_loss_debug as QL

    want = {"modify_model_output_intermediate_tensors": ["input_model_path", "output_model_path"],
            "collect_activations": ["augmented_model", "input_reader"],
            "create_activation_matching": ["qdq_activations", "float_activations"],
            "compute_activation_error": ["activations_match"]}
    for name, first in want.items():
        fn = getattr(QL, name, None)
        assert fn is not None, drifted(f"qdq_loss_debug.{name}", "activation_errors", "function missing")
        got = params(fn)
        assert got[:len(first)] == first, drifted(f"qdq_loss_debug.{name}", "activation_errors",
                                                  f"parameters {got}, expected {first} first")


def test_activation_errors_measure_each_quantized_tensor_against_float(model, tmp_path):
    """A tiny model's QDQ form: every tensor both models compute has a finite SQNR, in tensor-name order."""
    from quantbench.quantize import variants as QV
    from quantbench.quantize import intake

    feeds = random_feeds(2)
    prepared = tmp_path / "prepared.onnx"
    intake.prepare(model, prepared)
    QV.make_static(prepared, tmp_path / "q.onnx", inputs=feeds, method="minmax")
    sqnr = ort_api.activation_errors(prepared, tmp_path / "q.onnx", feeds, tmp_path)
    assert sqnr and all(np.isfinite(v) for v in sqnr.values())
    assert sorted(sqnr) == list(sqnr)


def test_every_function_documents_its_onnxruntime_version():
    for name, fn in inspect.getmembers(ort_api, inspect.isfunction):
        if fn.__module__ != ort_api.__name__ or name.startswith("_"):
            continue
        assert re.search(r"onnxruntime \d+\.\d+", fn.__doc__ or ""), f"ort_api.{name}: docstring names no version"


def test_only_ort_api_imports_onnxruntime_quantization():
    pat = re.compile(r"^\s*(from|import)\s+onnxruntime\.(quantization|tools)\b", re.M)
    offenders = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "quantbench").rglob("*.py"))
                 if p.name != "ort_api.py" and pat.search(p.read_text())]
    assert not offenders, f"{offenders} import onnxruntime.quantization/tools; go through quantbench.quantize.ort_api"


# --- behaviour ------------------------------------------------------------------------------


class _Reader:
    """onnxruntime's CalibrationDataReader over a list of feeds."""

    def __init__(self, feeds):
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)


def test_ort_api_quantizes_byte_for_byte_as_quantize_static(model, tmp_path):
    """MinMax ranges computed by quantbench, QDQ through ort_api == stock quantize_static.

    The three calibration methods: tests/quantize/test_quantize.py::test_ranges_match_stock_quantize_static_byte_for_byte.
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    from quantbench.quantize.calibration import compute_ranges

    feeds = random_feeds(4)

    stock = tmp_path / "stock.onnx"
    quantize_static(str(model), str(stock), _Reader(feeds), calibrate_method=CalibrationMethod.MinMax,
                    quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    ranges = compute_ranges(model, feeds, ["minmax"])["minmax"]
    at, wt = ort_api.quant_type("QUInt8"), ort_api.quant_type("QInt8")
    ort_api.check_static_types(at, wt)
    quantized = ort_api.qdq_quantize(ort_api.load_with_shape_infer(model), True, False, wt, at, ranges, [],
                                     ort_api.static_op_types(), {})
    ours = tmp_path / "ours.onnx"
    ort_api.save_quantized(quantized, ours)
    assert sha256_file(ours) == sha256_file(stock), drifted(
        "quantize_static's QDQ path", "qdq_quantize",
        "a model quantized through ort_api no longer equals stock quantize_static byte for byte")


def test_plain_tensor_overrides_quantize_as_onnxruntimes_own(model, tmp_path):
    """A per-tensor override in the plain form a recipe records (quant_type "u16", rmin/rmax floats, symmetric)
    gives the model stock quantize_static gives with onnxruntime's own form (QuantType, numpy ranges)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    from quantbench.quantize.calibration import compute_ranges

    feeds = random_feeds(4)

    native = {"c1": [{"quant_type": QuantType.QUInt16}], "q": [{"rmin": np.array(-1.5, np.float32),
                                                              "rmax": np.array(2.0, np.float32)}],
              "k": [{"symmetric": True}]}
    plain = {"c1": [{"quant_type": "u16"}], "q": [{"rmin": -1.5, "rmax": 2.0}], "k": [{"symmetric": True}]}
    stock = tmp_path / "stock.onnx"
    quantize_static(str(model), str(stock), _Reader(feeds), calibrate_method=CalibrationMethod.MinMax,
                    quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, extra_options={"TensorQuantOverrides": native})
    ranges = compute_ranges(model, feeds, ["minmax"])["minmax"]
    at, wt = ort_api.quant_type("QUInt8"), ort_api.quant_type("QInt8")
    quantized = ort_api.qdq_quantize(ort_api.load_with_shape_infer(model), True, False, wt, at, ranges, [],
                                     ort_api.static_op_types(), {"TensorQuantOverrides": plain})
    ours = tmp_path / "ours.onnx"
    ort_api.save_quantized(quantized, ours)
    assert sha256_file(ours) == sha256_file(stock), drifted(
        "TensorQuantOverrides (tensor_quant_overrides, calc_quant_params)", "tensor_overrides",
        "the plain per-tensor overrides no longer quantize as onnxruntime's own form")
    assert plain == {"c1": [{"quant_type": "u16"}], "q": [{"rmin": -1.5, "rmax": 2.0}], "k": [{"symmetric": True}]}


def test_activation_errors_one_feed_at_a_time_equal_qdq_loss_debugs_over_every_feed(model, tmp_path):
    """activation_errors holds one feed's activations at a time (a 100 MB model's, every feed at once, was most of a
    search's memory) and gives the SQNR onnxruntime's compute_activation_error gives over every feed at once."""
    from onnxruntime.quantization import qdq_loss_debug as QL

    from quantbench.quantize import intake
    from quantbench.quantize import variants as QV

    feeds = random_feeds(3)
    prepared = tmp_path / "prepared.onnx"
    intake.prepare(model, prepared)
    QV.make_static(prepared, tmp_path / "q.onnx", inputs=feeds, method="minmax")
    ours = ort_api.activation_errors(prepared, tmp_path / "q.onnx", feeds, tmp_path)
    acts = {}
    for tag, src in (("float", prepared), ("qdq", tmp_path / "q.onnx")):
        QL.modify_model_output_intermediate_tensors(str(src), str(tmp_path / f"{tag}.aug.onnx"))
        acts[tag] = QL.collect_activations(str(tmp_path / f"{tag}.aug.onnx"), iter([dict(f) for f in feeds]))
    matched = QL.create_activation_matching(acts["qdq"], acts["float"])
    stock = {k: v["xmodel_err"] for k, v in QL.compute_activation_error(
        {k: v for k, v in matched.items() if v.get("float")}).items()}
    assert sorted(ours) == sorted(stock) and len(ours) > 3
    for k, v in stock.items():
        assert ours[k] == pytest.approx(v, abs=1e-3), drifted("qdq_loss_debug's SQNR", "activation_errors", k)


def test_the_quantized_model_holds_its_graph_where_quantized_graph_reads_it(model):
    import onnx
    from onnxruntime.quantization.onnx_model import ONNXModel

    from quantbench.quantize.ort_api import quantized_graph

    proto = onnx.load(str(model))
    assert quantized_graph(ONNXModel(proto)) is proto.graph, drifted("ONNXModel.model", "quantized_graph",
                                                                     "no longer the ModelProto it wraps")
