"""Every use of ``onnxruntime.quantization`` / ``onnxruntime.tools``, in one module.

quantbench reuses onnxruntime's own quantization code so that its variants are
byte-identical to stock ``quantize_static`` / ``quantize_dynamic``, but it
replaces the collection of calibration statistics (bounded memory, independent
of chunking and order). That needs a few of onnxruntime's *internals*
(CalibraterBase, HistogramCollector, QDQQuantizer, ...), which are not a stable
API and drift between releases. They are all called here and nowhere else, each
through a small named function whose docstring says why it is used;
tests/quantize/test_ort_api.py checks the signatures and attributes these functions rely
on and names the function to fix when one drifts.

Written against onnxruntime 1.32.0 (``WRITTEN_AGAINST``). onnxruntime is
imported inside each function, so importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Mapping, Sequence

import numpy as np

from quantbench.fsutil import has_room, no_space, no_space_error
from quantbench.quantize.methods import METHODS as _METHODS

WRITTEN_AGAINST = "1.32.0"



# --- types, methods, registries ---------------------------------------------------------------

def quant_type(name: str):
    """onnxruntime ``QuantType`` member by name ('QUInt8', 'QInt8', 'QUInt16', 'QInt16').

    onnxruntime 1.32.0. Public API; the quantizers take these enum members.
    """
    from onnxruntime.quantization import QuantType

    return getattr(QuantType, name)


def calibration_method(name: str):
    """'minmax' | 'percentile' | 'entropy' -> onnxruntime ``CalibrationMethod`` (KeyError otherwise).

    onnxruntime 1.32.0. TensorsData carries the method, and QDQQuantizer reads it
    (MinMax ranges are used as given, histogram methods' thresholds likewise).
    """
    from onnxruntime.quantization.calibrate import CalibrationMethod

    return getattr(CalibrationMethod, _METHODS[name].ort_member)


def method_name(tensors_data) -> str:
    """'minmax' | 'percentile' | 'entropy' of a TensorsData (its ``calibration_method``).

    onnxruntime 1.32.0. Inverse of calibration_method, for ranges loaded from disk.
    """
    from onnxruntime.quantization.calibrate import CalibrationMethod

    return {getattr(CalibrationMethod, m.ort_member): m.name for m in _METHODS.values()}[tensors_data.calibration_method]


def static_op_types() -> list[str]:
    """The op types quantize_static quantizes (and calibrates) by default, sorted:
    ``QLinearOpsRegistry | QDQRegistry``.

    onnxruntime 1.32.0. quantize_static with op_types_to_quantize=None uses exactly
    this union; quantbench passes it explicitly so that it can be recorded and
    narrowed by --exclude-op-types.
    """
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return sorted(set(QLinearOpsRegistry) | set(QDQRegistry))


def dynamic_op_types() -> list[str]:
    """The op types quantize_dynamic quantizes by default (``IntegerOpsRegistry``), sorted.

    onnxruntime 1.32.0. As static_op_types, for the dynamic variant.
    """
    from onnxruntime.quantization.registry import IntegerOpsRegistry

    return sorted(set(IntegerOpsRegistry))


# --- model preparation ------------------------------------------------------------------------

@contextlib.contextmanager
def _temp_in(folder: str | os.PathLike | None):
    """While onnxruntime.quantization runs: its own temporary folders (``tempfile.TemporaryDirectory``
    with prefix ``pre.quant.`` in quant_pre_process, ``ort.quant.`` in
    save_and_reload_model_with_shape_infer and the quantize functions) are made in `folder`, not the system
    temp folder.

    onnxruntime 1.32.0 names no folder for them, so ``tempfile.tempdir`` (the default of every tempfile call)
    points at `folder` and is restored on exit. `folder` is calibrate's staging folder or a private folder in
    it, so what a SIGKILL leaves there the next run removes with the stage. None: unchanged.
    """
    if folder is None:
        yield
        return
    old = tempfile.tempdir
    tempfile.tempdir = str(Path(folder).resolve())
    try:
        yield
    finally:
        tempfile.tempdir = old


#: how many copies of a model onnxruntime's tools hold in their folders at once: quant_pre_process keeps
#: preprocessed.onnx, optimized.onnx and onnx_shape_inferred.onnx in its temporary folder; quantize_dynamic an
#: "-inferred" copy beside its input and its output; load_model_with_shape_infer its "-inferred" copy; the
#: quantizers' save_and_reload_model_with_shape_infer a saved copy and its "-inferred" one
COPIES = {"pre_process": 3, "dynamic": 2, "shape_infer": 1, "qdq": 2}


def _room_needed(what: str, size: int) -> int:
    """Bytes COPIES[what] copies of a `size`-byte model take, with a quarter more for what shape inference adds
    (value_info: 2% on the demo detector) and the file system's blocks."""
    return COPIES[what] * size * 5 // 4


@contextlib.contextmanager
def _short_of_space(folder: str | os.PathLike, need, path: str | os.PathLike | None = None,
                    held: list | None = None):
    """A failure of onnx / onnxruntime code writing models into `folder` while its file system has fewer than
    `need` bytes free (an int, or a function giving it: worked out only when something failed) becomes the
    OSError of a full disk (ENOSPC, naming `path`).

    onnxruntime 1.32.0 and onnx write models from C++ without reporting a short write
    (``onnx.shape_inference.infer_shapes_path``; the optimizer's ``optimized_model_filepath``, whose failure
    quant_pre_process only logs): on a full disk they leave a truncated file that the next step reads
    back (``google.protobuf.message.DecodeError``), or carry on without the optimized model. `held`: the log
    records _held_log holds back; an ERROR among them is such a logged failure, checked after a return too,
    and the records a full disk explains are dropped (the error says it)."""
    def room() -> bool:
        return has_room(folder, need() if callable(need) else need)

    try:
        yield
    except Exception as exc:
        full = no_space(exc) or not room()
        if full and held is not None:
            held.clear()
        if full and not no_space(exc):
            raise no_space_error(path) from None
        raise
    if held and any(r.levelno >= logging.ERROR for r in held) and not room():
        held.clear()
        raise no_space_error(path)


@contextlib.contextmanager
def _held_log(name: str):
    """The records the logger `name` emits while the block runs, held back in a list and handed on to its
    handlers (and its parents') afterwards, but those the block removed from the list (_short_of_space)."""
    logger = logging.getLogger(name)
    records: list = []
    handler = logging.Handler()
    handler.emit = records.append
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        for record in records:
            logger.handle(record)


def pre_process(src: str | os.PathLike, dst: str | os.PathLike, skip_symbolic: bool) -> None:
    """onnxruntime's ``quant_pre_process`` (optimization + ONNX and symbolic shape inference)
    from `src` to `dst`, in a private working folder, the root logger's level restored.

    onnxruntime 1.32.0 (``onnxruntime.quantization.shape_inference``). Used because
    quantize_static recommends it and its shape information decides which tensors
    are calibrated; `skip_symbolic` is the fallback for models the symbolic shape
    inference cannot handle. It writes temporary files into the cwd and into a ``pre.quant.`` folder (and
    ``ort.quant.`` for opset 10 and older) of the system temp folder, and changes the root logger's level,
    hence the private folder for all of them (beside `dst`: _temp_in) and the restore. On a full disk its
    writes fail without a word: _short_of_space says so.
    """
    from onnxruntime.quantization.shape_inference import quant_pre_process

    level = logging.getLogger().level
    old = os.getcwd()
    need = _room_needed("pre_process", Path(src).stat().st_size)
    try:
        with tempfile.TemporaryDirectory(prefix="qb-intake-", dir=Path(dst).resolve().parent) as td:  # beside the output
            os.chdir(td)
            try:
                with _held_log(quant_pre_process.__module__) as held, \
                        _short_of_space(td, need, dst, held), _temp_in(td):
                    quant_pre_process(str(src), str(dst), skip_symbolic_shape=skip_symbolic)
            finally:
                os.chdir(old)
    finally:
        logging.getLogger().setLevel(level)


def load_with_shape_infer(model_path: str | os.PathLike, workdir: str | os.PathLike | None = None):
    """onnxruntime's ``load_model_with_shape_infer`` on a private copy -> ModelProto.

    onnxruntime 1.32.0 (``quant_utils``). quantize_static loads its input this way,
    so calibrating and quantizing the same ModelProto gives its exact tensors and
    bytes. It writes an '-inferred' file beside its input, hence the private copy, made in
    `workdir` (calibrate's staging folder) or the system temp folder.
    """
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

    with tempfile.TemporaryDirectory(prefix="qb-shape-", dir=workdir) as tmp:
        copy = Path(tmp) / "model.onnx"
        shutil.copyfile(model_path, copy)
        with _short_of_space(tmp, _room_needed("shape_infer", copy.stat().st_size)):
            return load_model_with_shape_infer(copy)


# --- calibration --------------------------------------------------------------------------------

def tensors_to_calibrate(model, op_types: Sequence[str] | None) -> list[str]:
    """The tensors onnxruntime's calibrators would calibrate in `model`, sorted.

    onnxruntime 1.32.0. Calls the unbound ``CalibraterBase.select_tensors_to_calibrate``
    with a stand-in ``self`` holding only ``op_types_to_calibrate`` (the one attribute
    it reads), so quantbench calibrates exactly the tensors stock calibrators do
    without building a calibrator (which writes an augmented model to disk).
    """
    from onnxruntime.quantization.calibrate import CalibraterBase

    names, _ = CalibraterBase.select_tensors_to_calibrate(
        SimpleNamespace(op_types_to_calibrate=list(op_types or [])), model)
    return sorted(names)


def _histogram_collector(method: str, symmetric: bool, num_bins: int, num_quantized_bins: int,
                         percentile: float):
    from onnxruntime.quantization.calibrate import HistogramCollector

    return HistogramCollector(method=method, symmetric=symmetric, num_bins=num_bins,
                              num_quantized_bins=num_quantized_bins, percentile=percentile, scenario="same")


def _thresholds(method: str, symmetric: bool, histograms: Mapping[str, tuple], num_bins: int,
                num_quantized_bins: int, percentile: float) -> dict:
    """A HistogramCollector(method, symmetric) given `histograms`; its compute_<method>(), prints swallowed."""
    if not histograms:
        return {}
    col = _histogram_collector(method, symmetric, num_bins, num_quantized_bins, percentile)
    col.histogram_dict.update(histograms)
    with contextlib.redirect_stdout(io.StringIO()):
        return getattr(col, f"compute_{method}")()


def percentile_thresholds(histograms: Mapping[str, tuple], *, num_bins: int, num_quantized_bins: int,
                          percentile: float) -> dict:
    """Percentile thresholds from histograms of |x| -> {tensor: (lo, hi, hist, edges)}.

    histograms: {tensor: (counts, edges, min, max)}, laid out as onnxruntime's
    ``HistogramCollector.collect_absolute_value`` lays them out for the whole set.
    onnxruntime 1.32.0. A ``HistogramCollector(method='percentile', symmetric=True)``
    gets its ``histogram_dict`` filled and ``compute_percentile`` runs: the range
    math is onnxruntime's own, only the collection is quantbench's (bounded
    memory). Its progress prints are swallowed.
    """
    return _thresholds("percentile", True, histograms, num_bins, num_quantized_bins, percentile)


def entropy_thresholds(histograms: Mapping[str, tuple], *, num_bins: int, num_quantized_bins: int,
                       percentile: float) -> dict:
    """Entropy (KL) thresholds from histograms of x -> {tensor: (lo, hi, hist, edges)}.

    histograms: {tensor: (counts, edges, min, max, threshold)}, laid out as
    onnxruntime's ``HistogramCollector.collect_value`` lays them out for the whole set.
    onnxruntime 1.32.0. As percentile_thresholds, with
    ``HistogramCollector(method='entropy', symmetric=False).compute_entropy``.
    """
    return _thresholds("entropy", False, histograms, num_bins, num_quantized_bins, percentile)


def tensors_data(method: str, data: Mapping[str, tuple]):
    """onnxruntime ``TensorsData`` for 'minmax' | 'percentile' | 'entropy'.

    data: {tensor: (lowest, highest)} for minmax (shape-(1,) arrays, as
    MinMaxCalibrater makes them), {tensor: (lowest, highest, hist, bins)} for the
    histogram methods (what compute_percentile / compute_entropy return).
    onnxruntime 1.32.0. QDQQuantizer takes its ranges as a TensorsData.
    """
    from onnxruntime.quantization.calibrate import TensorsData

    return TensorsData(calibration_method(method), dict(data))


# --- quantization -------------------------------------------------------------------------------

def check_static_types(activation_type, weight_type) -> None:
    """Raise ValueError for activation/weight QuantType pairs quantize_static refuses for QDQ.

    onnxruntime 1.32.0 (``quantize.check_static_quant_arguments``): the check
    quantize_static runs first, so quantbench refuses the same pairs.
    """
    from onnxruntime.quantization.quant_utils import QuantFormat
    from onnxruntime.quantization.quantize import check_static_quant_arguments

    check_static_quant_arguments(QuantFormat.QDQ, activation_type, weight_type)


def _first_named(item_name, item_list):
    """``quant_utils.find_by_name`` with an early exit: the first item named `item_name`, else None.

    onnxruntime 1.32.0's version builds the list of every match before taking the first;
    called about 3,000 times over the initializers of a 300-initializer model, that was
    about 15% of ``quantize_model``."""
    for item in item_list:
        if item.name == item_name:
            return item
    return None


def _replace_input_of_all_nodes(self, old_input_name, new_input_name):
    """``ONNXModel.replace_input_of_all_nodes``, rewriting only nodes that read the name.

    onnxruntime 1.32.0 visits every input of every node for each of its ~300 calls
    (one per quantized activation), about a third of ``quantize_model``; protobuf's own
    ``in`` skips the nodes that do not read it, and the ones that do are rewritten by
    onnxruntime's ``replace_node_input``, as before."""
    replace = type(self).replace_node_input
    for node in self.model.graph.node:
        if old_input_name in node.input:
            replace(node, old_input_name, new_input_name)


@contextlib.contextmanager
def _fast_lookups(quantizer):
    """While `quantizer` quantizes: _first_named for ``find_by_name`` in every onnxruntime.quantization
    module that imported it, and _replace_input_of_all_nodes on this quantizer's model only.

    onnxruntime 1.32.0. Both return and change exactly what onnxruntime's own do (the
    quantized model's bytes equal stock quantize_static's: tests/quantize/test_ort_api.py), only
    without the quadratic scans. The modules are restored on exit, whatever happens."""
    from onnxruntime.quantization import quant_utils

    stock = quant_utils.find_by_name
    patched = [m for name, m in list(sys.modules.items())
               if name.startswith("onnxruntime.quantization") and getattr(m, "find_by_name", None) is stock]
    for m in patched:
        m.find_by_name = _first_named
    quantizer.model.replace_input_of_all_nodes = _replace_input_of_all_nodes.__get__(quantizer.model)
    try:
        yield
    finally:
        for m in patched:
            m.find_by_name = stock
        del quantizer.model.replace_input_of_all_nodes


def qdq_quantize(model, per_channel: bool, reduce_range: bool, weight_type, activation_type, ranges,
                 nodes_to_exclude: Sequence[str], op_types: Sequence[str], extra: Mapping,
                 workdir: str | os.PathLike | None = None, quantize_outputs: bool = False):
    """QDQ-quantize shape-inferred `model` with given `ranges` (TensorsData) -> the quantized
    model (onnxruntime's ONNXModel wrapper; write it with save_quantized).

    onnxruntime 1.32.0. Does what ``quantize_static`` (QDQ) does after calibrating:
    ``update_opset_version`` then ``QDQQuantizer(model, per_channel, reduce_range,
    weight_qType, activation_qType, tensors_range, nodes_to_quantize=[],
    nodes_to_exclude, op_types_to_quantize, extra_options)``, positionally as
    quantize_static calls it, and ``quantize_model()`` (under _fast_lookups). Used so that quantbench's
    own ranges give models byte-identical to stock quantize_static. `extra` is
    passed as is (not copied), as quantize_static passes extra_options. onnxruntime's ``ort.quant.``
    temporary folders (an old opset's reload with shape inference) are made in `workdir` (_temp_in).
    `quantize_outputs`: then quantize_float_outputs.
    """
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer
    from onnxruntime.quantization.quant_utils import update_opset_version

    if extra.get("TensorQuantOverrides"):
        extra = {**extra, "TensorQuantOverrides": tensor_overrides(extra["TensorQuantOverrides"])}
    room = lambda: _room_needed("qdq", model.ByteSize())   # worked out only if something failed
    with _short_of_space(workdir or tempfile.gettempdir(), room), _temp_in(workdir):
        qmodel = update_opset_version(model, weight_type, activation_type,
                                      tensor_quant_overrides=extra.get("TensorQuantOverrides"),
                                      block_size=extra.get("BlockSize", 0))
        quantizer = QDQQuantizer(qmodel, per_channel, reduce_range, weight_type, activation_type, ranges, [],
                                 list(nodes_to_exclude), op_types, extra)
        with _fast_lookups(quantizer):
            quantizer.quantize_model()
    if quantize_outputs:
        quantize_float_outputs(quantizer)
    return quantizer.model


def quantize_float_outputs(quantizer) -> list[str]:
    """Put each float graph output (one an op left in float writes, not a DequantizeLinear) through a
    QuantizeLinear -> DequantizeLinear pair on the activations' grid at its calibrated range; returns the outputs so
    quantized, sorted. Tiny host-to-host differences of a float tail then round to the same grid step (the
    identity search's "quantized outputs"). The pair holds that grid in 16 bits (com.microsoft Q/DQ, the signedness
    of the activations): onnxruntime 1.32.0 fuses DQ(8-bit) -> Softmax -> Q(8-bit, either signedness, even
    per-axis) into a QLinearSoftmax, the integer kernel the op was kept out of QDQ to avoid, and fuses no 16-bit
    group on the CPU; past the calibrated range the output keeps its grid rather than saturating.

    onnxruntime 1.32.0 has no option for it (extra_options' ForceQuantizeNoInputCheck and
    OpTypesToExcludeOutputQuantization concern quantized ops only), hence a graph edit after ``quantize_model``:
    ``QDQQuantizer.tensors_range`` holds each calibrated tensor's TensorData and ``calc_quant_params(td, {})`` gives
    its QuantizationParams (scale, zero_point) as the quantizer's own pairs get them (activation type,
    ActivationSymmetric, MinimumRealRange). Outputs without a range are left float.
    """
    from onnx import helper, numpy_helper

    model = quantizer.model.model
    graph, ranges = model.graph, quantizer.tensors_range
    producer = {o: n for n in graph.node for o in n.output}
    done = []
    for out in graph.output:
        node = producer.get(out.name)
        if node is None or node.op_type == "DequantizeLinear" or ranges is None or out.name not in ranges:
            continue
        q = quantizer.calc_quant_params(ranges[out.name], {})
        zero = np.asarray(q["zero_point"])
        zero = zero.astype(np.int16 if zero.dtype.kind == "i" else np.uint16)
        fl, qt, scale, zp = (f"{out.name}_float", f"{out.name}_QuantizeLinear_Output", f"{out.name}_out_scale",
                             f"{out.name}_out_zero_point")
        for n in graph.node:
            n.input[:] = [fl if i == out.name else i for i in n.input]
            n.output[:] = [fl if o == out.name else o for o in n.output]
        graph.initializer.extend([numpy_helper.from_array(np.asarray(q["scale"]), scale),
                                  numpy_helper.from_array(zero, zp)])
        graph.node.extend([helper.make_node("QuantizeLinear", [fl, scale, zp], [qt], f"{out.name}_QuantizeLinear",
                                            domain="com.microsoft"),
                           helper.make_node("DequantizeLinear", [qt, scale, zp], [out.name],
                                            f"{out.name}_DequantizeLinear", domain="com.microsoft")])
        done.append(out.name)
    if done and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return sorted(done)


#: the quant types a plain (JSON) per-tensor override names, by quantbench's type names
_OVERRIDE_TYPES = {"u8": "QUInt8", "s8": "QInt8", "u16": "QUInt16", "s16": "QInt16"}


def tensor_overrides(plain: Mapping) -> dict:
    """onnxruntime's ``TensorQuantOverrides`` extra option from its plain form (what a recipe records as JSON):
    {tensor: [{"quant_type": "u16" | "s16" | "u8" | "s8", "symmetric": bool, "rmin": float, "rmax": float}]}.

    onnxruntime 1.32.0 (``tensor_quant_overrides``, ``QDQQuantizer.calc_quant_params``): quant_type must be a
    ``QuantType`` and rmin/rmax numpy values (it reads their dtype); an override already in that form is kept."""
    from onnxruntime.quantization.quant_utils import QuantType

    out = {}
    for tensor, overrides in plain.items():
        out[tensor] = []
        for o in overrides:
            o = dict(o)
            if isinstance(o.get("quant_type"), str):
                o["quant_type"] = getattr(QuantType, _OVERRIDE_TYPES[o["quant_type"]])
            for key in ("rmin", "rmax"):
                if key in o:
                    o[key] = np.array(o[key], dtype=np.float32)
            out[tensor].append(o)
    return out


def quantized_graph(quantized):
    """The GraphProto of qdq_quantize's result (``ONNXModel.model.graph``), to edit before save_quantized.

    onnxruntime 1.32.0."""
    return quantized.model.graph


def save_quantized(quantized, path: str | os.PathLike) -> None:
    """Write qdq_quantize's result to `path` as quantize_static does
    (``ONNXModel.save_model_to_file``: topological sort, initializer checks, no external data).

    onnxruntime 1.32.0. Saving through the wrapper keeps the bytes identical to stock.
    """
    quantized.save_model_to_file(str(path), False)


def dynamic_quantize(src: str | os.PathLike, dst: str | os.PathLike, *, op_types: Sequence[str],
                     per_channel: bool, reduce_range: bool, weight_type, nodes_to_exclude: Sequence[str],
                     extra: Mapping) -> None:
    """onnxruntime's public ``quantize_dynamic`` from `src` to `dst`.

    onnxruntime 1.32.0. The dynamic variant is stock quantize_dynamic; it writes a
    shape-inferred copy beside `src`, so give it a private copy (its folder also takes onnxruntime's
    ``ort.quant.`` temporary folders: _temp_in).
    """
    from onnxruntime.quantization import quantize_dynamic

    need = _room_needed("dynamic", Path(src).stat().st_size)
    with _short_of_space(Path(dst).parent, need, dst), _temp_in(Path(src).parent):
        quantize_dynamic(src, dst, op_types_to_quantize=list(op_types), per_channel=per_channel,
                         reduce_range=reduce_range, weight_type=weight_type,
                         nodes_to_exclude=list(nodes_to_exclude), extra_options=dict(extra))


# --- per-tensor quantization error (qdq_loss_debug) ---------------------------------------------

def activation_errors(float_model: str | os.PathLike, qdq_model: str | os.PathLike, feeds: Sequence[Mapping],
                      workdir: str | os.PathLike) -> dict[str, float]:
    """{activation tensor: signal-to-quantization-noise ratio (dB) of the QDQ model's dequantized tensor against
    the float model's same tensor}, over `feeds`, one feed's activations held at a time.

    onnxruntime 1.32.0 ``qdq_loss_debug``: ``modify_model_output_intermediate_tensors`` exposes every float
    tensor of both models, ``collect_activations`` runs them (graph optimisation off, CPU provider) on one feed at a
    time, ``create_activation_matching`` pairs each QDQ tensor with the float one of the same name, and the
    SQNR is ``compute_signal_to_quantization_noice_ratio``'s over every feed (20 log10 of the norm of the float
    tensors over the norm of their difference, both over every feed's values: accumulated here as sums of squares,
    so a 100 MB model's activations of every feed are never held at once; higher: closer to float). Augmented
    copies go to `workdir`. A tensor with no float counterpart is left out.
    """
    from onnxruntime.quantization import qdq_loss_debug

    workdir = Path(workdir)
    augmented = {}
    for tag, src in (("float", float_model), ("qdq", qdq_model)):
        augmented[tag] = workdir / f"{tag}.augmented.onnx"
        qdq_loss_debug.modify_model_output_intermediate_tensors(str(src), str(augmented[tag]))
    signal: dict = {}
    noise: dict = {}
    for feed in feeds:
        acts = {tag: qdq_loss_debug.collect_activations(str(aug), iter([dict(feed)])) for tag, aug in augmented.items()}
        for name, m in qdq_loss_debug.create_activation_matching(acts["qdq"], acts["float"]).items():
            if m.get("float"):
                x = np.concatenate(m["float"]).ravel()
                d = (x - np.concatenate(m["post_qdq"]).ravel()).astype(np.float64)
                signal[name] = signal.get(name, 0.0) + float(np.dot(x.astype(np.float64), x.astype(np.float64)))
                noise[name] = noise.get(name, 0.0) + float(np.dot(d, d))
        del acts
    eps = np.finfo("float").eps
    return {k: 20 * math.log10(max(math.sqrt(signal[k]), eps) / max(math.sqrt(noise[k]), eps)) for k in sorted(signal)}
