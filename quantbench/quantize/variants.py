"""fp32, dynamic and static-QDQ variants, each with a recipe JSON beside it.

Library API (used by `quantbench calibrate` and by the remedy matrix):

    quantbench.quantize.intake.prepare(model_path, out_path, pre_process=True) -> dict   (the float model)
    ranges = compute_ranges(prepared, ImageInputs(paths, spec), ["minmax", "percentile"])
    make_static(prepared, out_path, ranges=ranges["percentile"], method="percentile",
                activation_type="u8", weight_type="s8", per_channel=True, reduce_range=False,
                exclude_nodes=(), exclude_op_types=()) -> Variant
    make_dynamic(prepared, out_path, weight_type="s8", per_channel=True, ...) -> Variant
    make_fp32(model_path, out_path) -> Variant

QDQ insertion is onnxruntime's own QDQQuantizer, called exactly as
``quantize_static`` calls it (shape inference, opset update, argument checks)
through quantbench.quantize.ort_api;
only the ranges come from quantbench.quantize.calibration. Every file is
written atomically; the recipe lists every option, the ranges' hash, the
library versions and whatever the caller adds (calibration manifest hash, seed).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

from quantbench import __version__
from quantbench.errors import UserError, flag_mark
from quantbench.fsutil import atomic_path, atomic_write_json, sha256_file
from quantbench.inputs.modelio import (QUANTIZED_OPS, constant_names, load_model, raw_sha256, semantic_sha256, write_self_contained,
                                       write_with_input_shape)
from quantbench.quantize import methods, ort_api
from quantbench.quantize.calibration import (compute_ranges, default_op_types, ranges_dict,
                                             ranges_sha256)
from quantbench.quantize.ort_api import load_with_shape_infer
from quantbench.inputs.variantdir import Variant

TYPES = {"u8": "QUInt8", "s8": "QInt8", "u16": "QUInt16", "s16": "QInt16"}


def quant_type(name: str):
    """'u8' | 's8' (| 'u16' | 's16') -> onnxruntime QuantType."""
    key = str(name).lower().replace("uint", "u").replace("int", "s")
    if key not in TYPES:
        raise UserError(f"unknown quantization type {name!r}; use one of {sorted(TYPES)}")
    return ort_api.quant_type(TYPES[key])


def parse_types(spec: str) -> list[tuple[str, str]]:
    """'u8s8,s8s8' -> [('u8', 's8'), ('s8', 's8')] (activation, weight)."""
    out = []
    for item in [s.strip().lower() for s in str(spec).split(",") if s.strip()]:
        if len(item) != 4 or item[:2] not in TYPES or item[2:] not in TYPES:
            raise UserError(f"{flag_mark('types')}: {item!r} is not an activation+weight pair like u8s8 or s8s8")
        out.append((item[:2], item[2:]))
    if not out:
        raise UserError(f"{flag_mark('types')}: give at least one pair, e.g. u8s8")
    return list(dict.fromkeys(out))


def versions() -> dict:
    import numpy
    import onnx
    import onnxruntime

    return {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__,
            "numpy": numpy.__version__, "quantbench": __version__}


def recipe_path(model_out: str | os.PathLike) -> Path:
    p = Path(model_out)
    return p.with_name(p.stem + ".recipe.json")


def ranges_path(model_out: str | os.PathLike) -> Path:
    p = Path(model_out)
    return p.with_name(p.stem + ".ranges.json")


def _model_name(model_path, model_name):
    return model_name or Path(model_path).stem


def _check_nodes(model, exclude_nodes, exclude_op_types, model_path):
    names = {n.name for n in model.graph.node}
    missing = [n for n in exclude_nodes if n not in names]
    if missing:
        raise UserError(f"{flag_mark('exclude_nodes')}: {model_path} has no node named {', '.join(map(repr, missing))}")
    import onnx

    known = {s.name for s in onnx.defs.get_all_schemas()}
    unknown = [t for t in exclude_op_types if t not in known]
    if unknown:
        raise UserError(f"{flag_mark('exclude_op_types')}: {', '.join(map(repr, unknown))} is not an ONNX op type")


def read_float_where_excluded(graph, exclude_nodes: Sequence[str]) -> list[str]:
    """Rewire each excluded node that has no constant operand to read its activations before their Q/DQ pair.

    onnxruntime's quantizer leaves an excluded node out of QDQ but still quantizes the tensors it reads when their
    producer or another consumer is quantized; a node whose every operand then comes from a DequantizeLinear (a
    MatMul of two activations, an Add or Mul of two) is a QDQ group onnxruntime's graph optimizer fuses into an
    integer kernel (QLinearMatMul, QLinearAdd) whatever the quantizer meant. Reading the float tensors keeps it
    float, as its recipe says; a node with a weight stays float through its float weight and is left as it is.
    Q/DQ pairs nothing reads any more are removed. Returns the rewired nodes' names, in graph order."""
    consts = constant_names(graph)
    producer = {t: n for n in graph.node for t in n.output}
    wanted, rewired = set(exclude_nodes), []
    for node in graph.node:
        if node.name not in wanted or any(t in consts for t in node.input):
            continue
        for i, t in enumerate(node.input):
            dq = producer.get(t)
            q = producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
            if q is not None and q.op_type == "QuantizeLinear":
                node.input[i] = q.input[0]
                rewired.append(node.name)
    if rewired:
        _drop_unread_qdq(graph)
    return list(dict.fromkeys(rewired))


def _drop_unread_qdq(graph) -> None:
    """Remove Quantize/DequantizeLinear nodes whose outputs nothing reads (and no graph output is), then the scales
    and zero points only they read (onnxruntime warns of every initializer no node uses)."""
    left_over: set = set()
    while True:
        read = {t for n in graph.node for t in n.input} | {o.name for o in graph.output}
        dead = [n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")
                and not any(t in read for t in n.output)]
        if not dead:
            break
        for n in dead:
            left_over.update(n.input)
            graph.node.remove(n)
    read = {t for n in graph.node for t in n.input} | {o.name for o in graph.output}
    for init in [i for i in graph.initializer if i.name in left_over and i.name not in read]:
        graph.initializer.remove(init)


def static_op_types(exclude_op_types: Sequence[str] = ()) -> list[str]:
    return [t for t in default_op_types() if t not in set(exclude_op_types)]


def dynamic_op_types(exclude_op_types: Sequence[str] = ()) -> list[str]:
    return sorted(set(ort_api.dynamic_op_types()) - set(exclude_op_types))


def _finish(name, out_path, model_name, recipe) -> Variant:
    recipe = dict(recipe)
    recipe["semantic_sha256"] = semantic_sha256(out_path)
    atomic_write_json(recipe_path(out_path), recipe)
    return Variant(name=name, path=Path(out_path), model=model_name, recipe=recipe)


def _write_source(model_path, tmp, shape_override: Mapping | None) -> None:
    """The model's bytes as one file; with `shape_override` (modelio.with_input_shape's record), at that shape."""
    if shape_override:
        write_with_input_shape(model_path, tmp, shape_override)
    else:
        write_self_contained(model_path, tmp)


def make_fp32(model_path: str | os.PathLike, out_path: str | os.PathLike, *, name: str = "fp32",
              model_name: str | None = None, recipe_extra: Mapping | None = None,
              shape_override: Mapping | None = None) -> Variant:
    """The model as given (bytes copied; a model with external data as one file, its data embedded), with a recipe;
    `shape_override`: its input declared at the sidecar's shape (modelio.with_input_shape), nothing else changed."""
    out_path = Path(out_path)
    with atomic_path(out_path) as tmp:
        _write_source(model_path, tmp, shape_override)
    model_name = _model_name(model_path, model_name)
    recipe = {"variant": name, "model": model_name, "method": "fp32", "quant_format": None,
              "input_model_sha256": raw_sha256(model_path), "versions": versions(), **(recipe_extra or {})}
    return _finish(name, out_path, model_name, recipe)


#: the variant name of a model that arrived already quantized (published as it is, not made by quantbench)
AS_GIVEN = "as-given"


def make_as_given(model_path: str | os.PathLike, out_path: str | os.PathLike, found: Mapping, *,
                  model_name: str | None = None, recipe_extra: Mapping | None = None,
                  shape_override: Mapping | None = None) -> Variant:
    """An already-quantized model as it is (its bytes, external data embedded; `shape_override`: its input declared
    at the sidecar's shape); the recipe says quantbench did not quantize it, with the file's hashes and the
    quantized ops found in it."""
    out_path = Path(out_path)
    with atomic_path(out_path) as tmp:
        _write_source(model_path, tmp, shape_override)
    model_name = _model_name(model_path, model_name)
    formats = sorted({quant_format_of(op) for op in found})
    recipe = {"variant": AS_GIVEN, "model": model_name, "method": AS_GIVEN, "quant_format": "+".join(formats),
              "made_by": "not quantbench: the model as given, already quantized; nothing re-quantized",
              "quantized_ops": dict(found), "input_model_sha256": raw_sha256(model_path),
              "input_model_file_sha256": sha256_file(model_path), "versions": versions(), **(recipe_extra or {})}
    return _finish(AS_GIVEN, out_path, model_name, recipe)


def quant_format_of(op: str) -> str:
    """QDQ | QOperator | integer: how an op of modelio.QUANTIZED_OPS quantizes."""
    return QUANTIZED_OPS[op]


def make_dynamic(model_path: str | os.PathLike, out_path: str | os.PathLike, *, weight_type: str = "s8",
                 per_channel: bool = True, reduce_range: bool = False, exclude_nodes: Sequence[str] = (),
                 exclude_op_types: Sequence[str] = (), extra_options: Mapping | None = None,
                 name: str = "dynamic", model_name: str | None = None,
                 recipe_extra: Mapping | None = None) -> Variant:
    """onnxruntime's quantize_dynamic (ort_api.dynamic_quantize) with the given options
    (activations u8 at run time)."""
    model = load_model(model_path, check=False)
    _check_nodes(model, exclude_nodes, exclude_op_types, model_path)
    op_types = dynamic_op_types(exclude_op_types)
    out_path = Path(out_path)
    with tempfile.TemporaryDirectory(prefix="qb-dyn-", dir=out_path.parent) as td:  # beside the output
        src = Path(td) / "model.onnx"  # quantize_dynamic writes a shape-inferred copy beside its input
        shutil.copyfile(model_path, src)
        with atomic_path(out_path, suffix=".onnx") as tmp:
            ort_api.dynamic_quantize(src, tmp, op_types=op_types, per_channel=per_channel,
                                     reduce_range=reduce_range, weight_type=quant_type(weight_type),
                                     nodes_to_exclude=exclude_nodes, extra=extra_options or {})
    model_name = _model_name(model_path, model_name)
    recipe = {"variant": name, "model": model_name, "method": "dynamic", "quant_format": "QOperator",
              "activation_type": "u8", "weight_type": weight_type, "per_channel": per_channel,
              "reduce_range": reduce_range, "exclude_nodes": sorted(exclude_nodes),
              "exclude_op_types": sorted(exclude_op_types), "op_types_to_quantize": op_types,
              "extra_options": dict(sorted((extra_options or {}).items())),
              "input_model_sha256": sha256_file(model_path), "versions": versions(), **(recipe_extra or {})}
    return _finish(name, out_path, model_name, recipe)


def _own_copy(model, model_path):
    """A ModelProto of model_path this variant may change: a copy of the caller's shape-inferred `model`, else
    model_path loaded with shape inference."""
    if model is None:
        return load_with_shape_infer(model_path)
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _check_ranges_method(ranges, method: str) -> None:
    """`ranges` were computed with calibration `method` (ranges of another method make another variant)."""
    expected = ort_api.calibration_method(method) if method in methods.METHODS else None
    if expected is None or ranges.calibration_method != expected:
        raise UserError(f"make_static: ranges were computed with {ranges.calibration_method}, not {method!r}")


def make_static(model_path: str | os.PathLike, out_path: str | os.PathLike, *, ranges=None, inputs=None,
                method: str = "minmax", percentile: float | None = None, activation_type: str = "u8",
                weight_type: str = "s8", per_channel: bool = True, reduce_range: bool = False,
                exclude_nodes: Sequence[str] = (), exclude_op_types: Sequence[str] = (),
                extra_options: Mapping | None = None, chunk_size: int | None = None, calibration_options: Mapping | None = None,
                name: str | None = None, model_name: str | None = None,
                recipe_extra: Mapping | None = None, model=None, quantize_outputs: bool = False) -> Variant:
    """A static QDQ variant of `model_path` (float; use quantbench.quantize.intake.prepare's output).

    ranges: onnxruntime TensorsData from compute_ranges(model_path, ...) for
        `method`; or None to calibrate here on `inputs` (re-iterable feeds).
    method: 'minmax' | 'percentile' | 'entropy' (recorded; must match `ranges`).
    calibration_options: extra keyword arguments for compute_ranges (bins), recorded.
    model: the shape-inferred ModelProto of model_path (load_with_shape_infer), when the caller
        has it: a copy is quantized, so one load serves calibration and every variant.
    quantize_outputs: each float graph output through a Q/DQ pair at its calibrated range
        (ort_api.quantize_float_outputs); recorded in the recipe only when set (older recipes: unset).
    Writes out_path, <stem>.ranges.json and <stem>.recipe.json beside it.
    """
    name = name or f"static-{method}"
    percentile = methods.DEFAULT_PERCENTILE if percentile is None else percentile
    at, wt = quant_type(activation_type), quant_type(weight_type)
    try:
        ort_api.check_static_types(at, wt)
    except ValueError as exc:
        raise UserError(f"{flag_mark('types')} {activation_type}{weight_type}: {exc}") from None
    model = _own_copy(model, model_path)
    _check_nodes(model, exclude_nodes, exclude_op_types, model_path)
    op_types = static_op_types(exclude_op_types)
    calibration_options = dict(calibration_options or {})
    if ranges is None:
        if inputs is None:
            raise UserError("make_static: give `ranges` or calibration `inputs`")
        ranges = compute_ranges(model_path, inputs, [method], percentile=percentile, op_types=op_types,
                                chunk_size=chunk_size, model=model, **calibration_options)[method]
    _check_ranges_method(ranges, method)

    extra = dict(extra_options or {})
    out_path = Path(out_path)
    quantized = ort_api.qdq_quantize(model, per_channel, reduce_range, wt, at, ranges, exclude_nodes, op_types, extra,
                                     workdir=out_path.parent, quantize_outputs=quantize_outputs)   # calibrate's stage
    read_float_where_excluded(ort_api.quantized_graph(quantized), exclude_nodes)
    with atomic_path(out_path, suffix=".onnx") as tmp:
        ort_api.save_quantized(quantized, tmp)
    rdict = ranges_dict(ranges)
    atomic_write_json(ranges_path(out_path), {"method": method, "ranges": rdict})
    model_name = _model_name(model_path, model_name)
    calib = {"method": method}
    if methods.takes(method, "percentile"):
        calib["percentile"] = percentile
    calib.update(calibration_options)
    recipe = {"variant": name, "model": model_name, "method": "static", "quant_format": "QDQ",
              "calibration_method": method, "calibration_options": calib,
              "activation_type": activation_type, "weight_type": weight_type, "per_channel": per_channel,
              "reduce_range": reduce_range, "exclude_nodes": sorted(exclude_nodes),
              "exclude_op_types": sorted(exclude_op_types), "op_types_to_quantize": op_types,
              "extra_options": dict(sorted(extra.items())), "ranges_sha256": ranges_sha256(ranges),
              "ranges_file": ranges_path(out_path).name, "calibrated_tensors": len(rdict),
              "input_model_sha256": sha256_file(model_path), "versions": versions(),
              **({"quantize_outputs": True} if quantize_outputs else {}), **(recipe_extra or {})}
    return _finish(name, out_path, model_name, recipe)
