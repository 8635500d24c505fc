"""Model intake: a real third-party export -> the float graph that is calibrated and quantized.

Exports from Paddle, PyTorch and Ultralytics arrive with quirks that the
quantizer either trips over or, worse, silently mishandles (see
shared notes "real-models"): weights held in `Constant` nodes (quantized as
activations, per-tensor, growing the model), opsets too old for per-channel
QDQ (`DequantizeLinear` `axis` needs 13), custom-domain opset imports, and
graphs on which onnxruntime's symbolic shape inference asserts. Each step here
is recorded, so the recipe says what was done to the user's model:

1. nodes in a domain onnxruntime cannot run are refused by name; an opset
   import no node uses (paddle2onnx's `Paddle`) is noted and left alone;
2. `Constant` tensors become initializers;
3. an opset below 13 is converted to 13 with `onnx.version_converter` when
   per-channel weights are asked (or refused, naming the opset and the option);
4. `quant_pre_process` (ort_api.pre_process) runs in a private temporary folder (it writes
   `sym_shape_infer_temp.onnx` into the current one on failure, and its `pre.quant.` / `ort.quant.`
   folders go there too), made beside `out_path` (calibrate's staging folder, which the next run
   removes if this one is killed, never the system temp folder); when symbolic
   shape inference fails it is retried without it (constant and BatchNorm
   folding still happen) and the fallback is reported.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from quantbench.errors import DiskFull, UserError, flag_mark
from quantbench.fsutil import atomic_path, no_space
from quantbench.inputs.modelio import load_model, with_input_shape
from quantbench.inputs.plugins import one_line
from quantbench.quantize import ort_api

# Domains onnxruntime's CPU provider runs without a custom-op library.
RUNNABLE_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc", "ai.onnx.preview.training")
PER_CHANNEL_OPSET = 13  # DequantizeLinear's `axis` attribute


def default_opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def check_domains(model, model_path) -> list[str]:
    """Refuse nodes onnxruntime cannot run; return notes on unused custom opset imports."""
    used: dict[str, set] = {}
    for node in model.graph.node:
        used.setdefault(node.domain or "", set()).add(node.op_type)
    foreign = {d: ops for d, ops in used.items() if d not in RUNNABLE_DOMAINS}
    if foreign:
        what = "; ".join(f"domain {d!r}: {', '.join(sorted(ops))}" for d, ops in sorted(foreign.items()))
        raise UserError(f"{model_path}: has nodes in a custom domain ({what}); onnxruntime cannot run them without "
                        "their custom-op library, which quantbench does not load: export the model with standard ops")
    notes = []
    for o in model.opset_import:
        if o.domain not in RUNNABLE_DOMAINS and o.domain not in used:
            notes.append(f"opset import {o.domain!r} (version {o.version}) is used by no node: left as is")
    return notes


def check_finite_weights(model, model_path) -> None:
    """Refuse a float initializer (a weight) holding NaN or an infinity: no scale quantizes it (onnxruntime's
    quantizer stopped on `AssertionError: scale issue`). Read one tensor at a time."""
    import numpy as np
    from onnx import numpy_helper

    for init in model.graph.initializer:
        if init.data_type not in FLOAT_TYPES:
            continue
        arr = numpy_helper.to_array(init)
        if arr.size and not np.isfinite(arr).all():
            bad = int(arr.size - np.isfinite(arr).sum())
            raise UserError(f"{model_path}: weight {init.name!r} holds {bad} of {arr.size} values that are NaN or "
                            "infinite; quantization needs finite weights (fix or retrain the model)")


#: the most iterations a Loop with a fixed trip count may run (its condition never changes): calibration runs
#: the model on every image, and Loop(trip=1e15) never finished
MAX_LOOP_TRIPS = 1_000_000


def _constants(graph) -> dict:
    """name -> numpy value of the graph's initializers and Constant nodes' tensors."""
    from onnx import numpy_helper

    out = {i.name: numpy_helper.to_array(i) for i in graph.initializer if i.data_type in (6, 7, 9)}  # int32/64, bool
    for n in graph.node:
        attr = {a.name: a for a in n.attribute}
        if n.op_type == "Constant" and "value" in attr and len(n.output) == 1:
            out[n.output[0]] = numpy_helper.to_array(attr["value"].t)
    return out


def _fixed_condition(body) -> bool:
    """The Loop body's condition output is its condition input passed on (through Identity) or a constant: the
    loop runs its trip count, whatever it computes."""
    producers = {o: n for n in body.node for o in n.output}
    src = body.output[0].name
    while src in producers and producers[src].op_type == "Identity":
        src = producers[src].input[0]
    return src == body.input[1].name or (src in producers and producers[src].op_type == "Constant")


def check_loops(model, model_path) -> None:
    """Refuse a Loop node of the main graph that runs a fixed count of more than MAX_LOOP_TRIPS iterations (its trip
    count a constant, its condition never changing), naming the node: it would hold calibration without end."""
    import numpy as np

    consts = _constants(model.graph)
    for node in model.graph.node:
        if node.op_type != "Loop" or not node.input or node.input[0] not in consts:
            continue
        trips, cond = int(consts[node.input[0]].reshape(-1)[0]), node.input[1] if len(node.input) > 1 else ""
        body = next(a.g for a in node.attribute if a.name == "body")
        if trips > MAX_LOOP_TRIPS and (not cond or bool(np.asarray(consts.get(cond, False)).reshape(-1)[0])) and _fixed_condition(body):
            raise UserError(f"{model_path}: Loop node {node.name or node.output[0]!r} runs a fixed {trips} "
                            f"iterations, more than the limit of {MAX_LOOP_TRIPS:,}; export it with the trip count "
                            "it needs")


#: onnx TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16
FLOAT_TYPES = (1, 10, 11, 16)


def constants_to_initializers(model) -> int:
    """Move tensor-valued `Constant` nodes of the main graph into initializers; returns how many.

    The quantizer treats a Constant's output as an activation: weights held that
    way get per-tensor activation ranges instead of per-channel weight scales.
    """
    from onnx import numpy_helper

    keep, moved = [], 0
    for node in model.graph.node:
        attr = {a.name: a for a in node.attribute}
        if node.op_type == "Constant" and (node.domain or "") in ("", "ai.onnx") and "value" in attr \
                and len(node.output) == 1:
            t = numpy_helper.to_array(attr["value"].t)
            model.graph.initializer.append(numpy_helper.from_array(t, node.output[0]))
            moved += 1
        else:
            keep.append(node)
    if moved:
        del model.graph.node[:]
        model.graph.node.extend(keep)
    return moved


def convert_opset(model, model_path, target: int, why: str):
    """onnx.version_converter to `target`, or a UserError naming the opset and what asked for it."""
    import onnx

    have = default_opset(model)
    try:
        out = onnx.version_converter.convert_version(model, target)
        onnx.checker.check_model(out)
    except Exception as exc:
        raise UserError(f"{model_path}: opset {have} is too old for {why} (needs opset {target}+) and "
                        f"onnx.version_converter could not convert it ({one_line(exc)}); pass "
                        f"{flag_mark('per_channel')}, or export the model with opset {target} or newer") from None
    return out


def _pre_process(src: Path, out_path: Path, model_path: Path, notes: list) -> str:
    """onnxruntime's quant_pre_process of `src` into `out_path`, retried without symbolic shape inference when that
    fails (noted); returns what became of symbolic shape inference."""
    try:
        with atomic_path(out_path, suffix=".onnx") as tmp:
            ort_api.pre_process(src, Path(tmp).resolve(), skip_symbolic=False)
        return "done"
    except Exception as first:  # onnxruntime raises assorted errors (AssertionError, bare Exception)
        if isinstance(first, DiskFull) or no_space(first):
            raise  # not a model problem: no retry without symbolic shape inference
        reason = one_line(first)
    try:
        with atomic_path(out_path, suffix=".onnx") as tmp:
            ort_api.pre_process(src, Path(tmp).resolve(), skip_symbolic=True)
    except Exception as exc:
        raise UserError(f"{model_path}: onnxruntime quant_pre_process failed ({reason}; without symbolic "
                        f"shape inference: {one_line(exc)}); rerun with {flag_mark('pre_process')}") from None
    notes.append(f"symbolic shape inference failed ({reason}); pre-processed without it "
                 "(ONNX shape inference, constant and BatchNorm folding still done)")
    return f"failed, skipped ({reason})"


def prepare(model_path: str | os.PathLike, out_path: str | os.PathLike, *, pre_process: bool = True,
            per_channel: bool = True, shape_override: dict | None = None) -> dict:
    """Write the float model to calibrate and quantize to `out_path`; returns the intake record.

    The record ("intake" in every variant's recipe) lists each step taken and
    `notes`, one line each, that calibrate prints. `shape_override` (modelio.with_input_shape's
    record): the input is declared at the sidecar's shape first.
    """
    import onnx

    model_path = Path(model_path).resolve()
    out_path = Path(out_path)
    model = load_model(model_path, check=False)
    notes = check_domains(model, model_path)
    record: dict = {"pre_process": bool(pre_process)}
    if shape_override:
        with_input_shape(model, shape_override["input"], shape_override["used"])
        record["input_shape"] = {"declared": shape_override["declared"], "used": shape_override["used"]}
    opset = default_opset(model)
    record["opset"] = {"source": opset, "used": opset}
    moved = constants_to_initializers(model)
    record["constants_to_initializers"] = moved
    if moved:
        notes.append(f"{moved} Constant tensor(s) moved to initializers (weights are quantized as weights)")
    check_finite_weights(model, model_path)  # Constant-held weights too (the pipeline checked the initializers)
    if per_channel and opset < PER_CHANNEL_OPSET:
        model = convert_opset(model, model_path, PER_CHANNEL_OPSET, "per-channel QDQ weights")
        record["opset"]["used"] = PER_CHANNEL_OPSET
        notes.append(f"opset {opset} converted to {PER_CHANNEL_OPSET} with onnx.version_converter "
                     "(per-channel DequantizeLinear needs it)")
    with tempfile.TemporaryDirectory(prefix="qb-intake-src-", dir=out_path.resolve().parent) as td:  # in the stage: see below
        src = Path(td) / "model.onnx"
        onnx.save(model, str(src))
        if not pre_process:
            with atomic_path(out_path) as tmp:
                Path(tmp).write_bytes(src.read_bytes())
            record["symbolic_shape_inference"] = "not run (pre-processing off)"
            bn = sum(1 for n in model.graph.node if n.op_type == "BatchNormalization")
            if bn:
                notes.append(f"pre-processing off: {bn} BatchNormalization node(s) left unfolded (quantized as separate "
                             "ops, less accurate than folded into Conv)")
        else:
            record["symbolic_shape_inference"] = _pre_process(src, out_path, model_path, notes)
            # the optimiser may fold new constants; keep weights as initializers
            prepared = load_model(out_path, check=False)
            if constants_to_initializers(prepared):
                with atomic_path(out_path, suffix=".onnx") as tmp:
                    onnx.save(prepared, str(tmp))
    record["notes"] = notes
    return record
