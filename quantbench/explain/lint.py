"""Saturation lint: which host tiers an int8 model's weights can make diverge, without running it.

Integer kernels differ by host in one place that changes bits: how products are
summed before they reach the int32 accumulator.

* x86 AVX2 (and AVX-512 without VNNI), U8S8: ``vpmaddubsw`` multiplies an unsigned
  activation byte by a signed weight byte and adds *two adjacent K products* into a
  saturating int16. With activations anywhere in [0, 255], a weight pair (w_i, w_j)
  can saturate iff both have the same sign and 255 * (|w_i| + |w_j|) > 32767
  (> 32768 for two negatives). Pairs of opposite sign cannot (each product alone
  fits). S8S8 QDQ models count too: on x86 onnxruntime rewrites S8 activations to
  U8 (``session.qdqisint8allowed`` defaults to off there), so they reach the same
  kernel. VNNI (``vpdpbusd``), AMX and the SSE4.1 ``pmaddwd`` kernel are exact.
* NEON-only ARM (Cortex-A53/A72: Raspberry Pi 3, Zero 2, 4): ``smull`` + ``smlal``
  add two adjacent K products into int16; only (-128 x -128) + (-128 x -128) = 32768
  wraps, so a pair wraps iff both weights are -128 (and both activations reach
  -128). This holds for U8 activations too: qemu's translation log of a U8S8 QDQ
  model on Cortex-A72 shows signed SMULL/SMLAL (8-bit) + SADALP, i.e. the kernel
  shifts U8 activations to S8 (activation 0 becomes -128). onnxruntime's own
  quantizer keeps weights in [-127, 127], so -128 weights come from other tools.
  Dot-product (UDOT/SDOT) and i8mm (UMMLA/SMMLA) kernels are exact.
* Everywhere: the int32 accumulator is safe iff K x 255 x 128 < 2^31.

Given a fleet (the hosts named), each host's path is read from its fingerprint's ISA flags
(analysis/tiers.int8_path: avx2/avx512bw without avx512_vnni/avx_vnni/amx_int8 saturates;
VNNI/AMX and the SSE kernel are exact; NEON without asimddp/i8mm wraps), and every layer
that can diverge names the hosts of the fleet it affects.

"Adjacent" is how MLAS packs the reduction axis: K indices (2i, 2i+1) of the
flattened reduction, an odd K padded with a zero. The reduction order is
MatMul/Gemm B: rows of B (per output column); Conv: QLinearConv reorders the
filter [M, C/g, kh, kw] to (kh, kw, C/g) with the channel fastest, per output
channel. Depthwise convolutions (C/g == 1) use a per-element kernel and form no
pairs.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import asdict, dataclass, field

import numpy as np

from quantbench.analysis.tiers import Int8Path, int8_path
from quantbench.hosts.masked import unshowable
from quantbench.hosts.startup import start_workers
from quantbench.inputs.modelio import load_model

INT16_MAX = 32767
INT32_LIMIT = 2**31
#: the tier tag of x86's saturating U8S8 path (AVX2, and AVX-512BW without VNNI): the kernel, not a host name
X86_SATURATING = "x86-vpmaddubsw"
GEMM_OPS = {"Conv", "MatMul", "Gemm"}
# op -> (index of the weight input, index of the activation input, activation zero-point input or None)
INTEGER_OPS = {
    "QLinearConv": (3, 0, 2),
    "QLinearMatMul": (3, 0, 2),
    "MatMulInteger": (1, 0, 2),
    "ConvInteger": (1, 0, 2),
}


@dataclass
class LayerLint:
    """One int8 weight tensor feeding one GEMM-like node."""

    node: str
    op_type: str
    weight: str
    shape: list
    act_type: str            # uint8 | int8 | unknown
    weight_type: str         # int8 | uint8
    k: int                   # reduction length per output
    pairs: int               # adjacent K pairs over all outputs
    x86_saturating_pairs: int
    neon_wrapping_pairs: int
    int32_ok: bool
    tiers: list = field(default_factory=list)   # int8 paths that can diverge: x86-vpmaddubsw, arm-neon, all
    reason: str = ""
    #: with a fleet (lint_model's `fleet`): the hosts of it this layer can make diverge (not a table column:
    #: the reason says it too)
    fleet_hosts: list = field(default_factory=list)

    def row(self) -> dict:
        out = asdict(self)
        del out["fleet_hosts"]
        return out


def pair_counts(wk: np.ndarray) -> tuple[int, int, int]:
    """(pairs, x86 saturating pairs, NEON wrapping pairs) of int8 weights laid out [outputs, K].

    Pairs are K indices (2i, 2i+1); an odd K is padded with a zero weight.
    """
    w = np.asarray(wk)
    if w.ndim != 2:
        raise ValueError("weights must be [outputs, K]")
    w = w.astype(np.int32)
    if w.shape[1] % 2:
        w = np.concatenate([w, np.zeros((w.shape[0], 1), np.int32)], axis=1)
    a, b = w[:, 0::2], w[:, 1::2]
    pos = (a >= 0) & (b >= 0) & (255 * (a + b) > INT16_MAX)
    neg = (a <= 0) & (b <= 0) & (255 * (a + b) < -(INT16_MAX + 1))
    wrap = (a == -128) & (b == -128)
    return int(a.size), int(np.count_nonzero(pos | neg)), int(np.count_nonzero(wrap))


def reduction_layout(op_type: str, w: np.ndarray, attrs: dict) -> np.ndarray:
    """Weights as [outputs, K] in the order MLAS reduces them (see module docstring)."""
    if op_type in ("Conv", "QLinearConv", "ConvInteger"):
        if w.ndim < 3:
            raise ValueError(f"conv weight of rank {w.ndim}")
        m, cg = w.shape[0], w.shape[1]
        taps = int(np.prod(w.shape[2:]))
        # [M, C/g, taps] -> [M, taps, C/g] (channel fastest) -> [M, K]
        return w.reshape(m, cg, taps).transpose(0, 2, 1).reshape(m, taps * cg)
    if op_type == "Gemm":
        # B is [K, N] unless transB
        return w if attrs.get("transB", 0) else w.T
    # MatMul-like: B is [..., K, N]; every trailing matrix reduces over its rows
    if w.ndim == 1:
        return w.reshape(1, -1)
    k, n = w.shape[-2], w.shape[-1]
    return np.moveaxis(w.reshape(-1, k, n), 1, 2).reshape(-1, k)


def _is_depthwise(op_type: str, w: np.ndarray, attrs: dict) -> bool:
    return op_type in ("Conv", "QLinearConv", "ConvInteger") and w.ndim >= 3 and w.shape[1] == 1 and attrs.get("group", 1) > 1


def _dtype_name(elem_type: int) -> str:
    import onnx

    try:
        return str(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        return "unknown"


def lint_model(model_or_path, fleet: list[Int8Path] | None = None) -> list[LayerLint]:
    """Lint every int8 weight tensor feeding Conv/MatMul/Gemm (QDQ) or an integer op; with a `fleet`
    (fleet_paths), each layer's reason names the hosts of the fleet it can make diverge."""
    import onnx
    from onnx import numpy_helper

    if isinstance(model_or_path, (str, os.PathLike)):
        model = load_model(model_or_path)
    else:
        model = model_or_path
    inits, producer, types = _graph_index(model)
    out: list[LayerLint] = []
    for idx, node in enumerate(model.graph.node):
        found = _int_weight_of(node, inits, producer, types)
        if found is None:
            continue
        weight_name, act = found
        w = numpy_helper.to_array(inits[weight_name])
        if w.dtype not in (np.int8, np.uint8):
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        out.append(_lint_layer(node, node.name or f"{node.op_type}_{idx}", weight_name, w, act, attrs))
    for layer in out if fleet else ():
        if layer.tiers:
            layer.fleet_hosts = [p.host for p in affected(layer, fleet)]
            layer.reason += f"; in this fleet: {', '.join(layer.fleet_hosts) or 'no host'} affected"
    return out


def affected(layer: LayerLint, fleet: list[Int8Path]) -> list[Int8Path]:
    """The hosts of `fleet` whose int8 path this layer can make diverge."""
    if "all" in layer.tiers:
        return list(fleet)
    kinds = {"saturates"} if X86_SATURATING in layer.tiers else set()
    kinds |= {"wraps"} if "arm-neon" in layer.tiers else set()
    return [p for p in fleet if p.kind in kinds]


def fleet_paths(workers) -> list[Int8Path]:
    """Each started worker's int8 path (quantbench.hosts.workerclient.WorkerClient), from the fingerprint it sent."""
    out = []
    for w in workers:
        ident = w.fingerprint.get("identity", {})
        out.append(int8_path(w.label, ident.get("arch", ""), ident.get("isa_flags") or []))
    return out


def fleet_of(requests, require_providers: bool = False) -> list[Int8Path]:
    """The int8 path of each requested host (hosts.registry.HostRequest): its worker is started for its
    fingerprint only (no model runs), then closed. A tier this CPU cannot show is predicted from its profile's
    features (marked predicted), in the order asked."""
    unshown = {r.label: f for r in requests if (f := unshowable(r.spec)) is not None}
    workers = start_workers([r for r in requests if r.label not in unshown], require_providers)
    try:
        shown = {p.host: p for p in fleet_paths(workers)}
    finally:
        for w in workers:
            w.close()
    return [dataclasses.replace(int8_path(r.label, "x86_64", unshown[r.label]), predicted=True)
            if r.label in unshown else shown[r.label] for r in requests]


def fleet_note(fleet: list[Int8Path], layers: list[LayerLint] | None) -> str:
    """One line: which hosts of the fleet take which U8S8 path, and which of them the model's layers affect
    (None: no model linted)."""
    parts = []
    for kind, words in (("saturates", "saturating VPMADDUBSW path"), ("wraps", "NEON int16 pair path"),
                        ("exact", "exact")):
        hosts = [p.describe() for p in fleet if p.kind == kind]
        if hosts:
            parts.append(f"{words}: {', '.join(hosts)}")
    text = f"int8 paths of the fleet: {'; '.join(parts)}"
    if layers is None:
        return text
    hit = [p.host + (" (predicted)" if p.predicted else "") for p in fleet
           if any(p in affected(layer, fleet) for layer in layers)]
    risky = sum(1 for layer in layers if layer.tiers)
    return f"{text}. {risky} of {len(layers)} int8 layer(s) can diverge; hosts affected: {', '.join(hit) or 'none'}"


def _graph_index(model) -> tuple[dict, dict, dict]:
    """(initializers incl. Constant-held ones, {tensor: producing node}, {tensor: element type})."""
    import onnx

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    for n in g.node:  # Constant nodes are initializers too
        if n.op_type == "Constant" and n.output:
            for a in n.attribute:
                if a.name == "value":
                    inits[n.output[0]] = a.t
    producer = {o: n for n in g.node for o in n.output}
    types: dict[str, int] = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
        for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
            types[vi.name] = vi.type.tensor_type.elem_type
    except Exception:
        pass
    for name, t in inits.items():
        types[name] = t.data_type
    return inits, producer, types


def _act_type(tensor: str, types: dict, producer: dict, zp_name: str | None = None) -> str:
    """Element type of the integer activation behind `tensor` (through a DequantizeLinear)."""
    if zp_name and zp_name in types:
        return _dtype_name(types[zp_name])
    p = producer.get(tensor)
    if p is not None and p.op_type == "DequantizeLinear":
        src = p.input[0]
        if src in types:
            return _dtype_name(types[src])
        if len(p.input) > 2 and p.input[2] in types:
            return _dtype_name(types[p.input[2]])
    if tensor in types:
        dt = _dtype_name(types[tensor])
        if dt in ("uint8", "int8"):
            return dt
    return "unknown"


def _int_weight_of(node, inits: dict, producer: dict, types: dict) -> tuple[str, str] | None:
    """(weight initializer name, activation type) of a QDQ GEMM or integer op with a constant weight, else None."""
    if node.op_type in GEMM_OPS and len(node.input) > 1:
        p = producer.get(node.input[1])
        if p is None or p.op_type != "DequantizeLinear" or p.input[0] not in inits:
            return None
        return p.input[0], _act_type(node.input[0], types, producer)
    if node.op_type in INTEGER_OPS:
        wi, ai, zi = INTEGER_OPS[node.op_type]
        if len(node.input) <= wi or node.input[wi] not in inits:
            return None
        zp = node.input[zi] if len(node.input) > zi and node.input[zi] else None
        return node.input[wi], _act_type(node.input[ai], types, producer, zp)
    return None


def _lint_layer(node, name: str, weight_name: str, w: np.ndarray, act: str, attrs: dict) -> LayerLint:
    """Which host tiers can diverge on one integer weight, and why."""
    wk = reduction_layout(node.op_type, w, attrs)
    k = int(wk.shape[1])
    depthwise = _is_depthwise(node.op_type, w, attrs)
    if w.dtype == np.int8 and not depthwise:
        pairs, sat, wrap = pair_counts(wk)
    else:
        pairs, sat, wrap = (0 if depthwise else (k + 1) // 2 * wk.shape[0]), 0, 0
    int32_ok = k * 255 * 128 < INT32_LIMIT
    tiers, reasons = [], []
    if w.dtype == np.int8 and act in ("uint8", "int8", "unknown") and sat:
        tiers.append(X86_SATURATING)
        via = "" if act == "uint8" else " (S8 activations are shifted to U8 on x86)"
        reasons.append(f"{sat} weight pairs can saturate vpmaddubsw's int16 pair sum{via}; "
                       "AVX-512 without VNNI too; VNNI/AMX/SSE4 exact")
    if w.dtype == np.int8 and act in ("uint8", "int8", "unknown") and wrap:
        tiers.append("arm-neon")
        via = " (U8 activations are shifted to S8 there)" if act == "uint8" else ""
        reasons.append(f"{wrap} pairs of -128 weights can wrap smull/smlal's int16 pair sum "
                       f"on NEON-only cores (A53/A72){via}; dotprod/i8mm exact")
    if not int32_ok:
        tiers.append("all")
        reasons.append(f"K={k}: K*255*128 >= 2^31, the int32 accumulator can overflow on every host")
    if act == "unknown":
        reasons.append("activation type unknown: assumed able to reach the extremes")
    if depthwise:
        reasons.append("depthwise: per-element kernel, no pairs")
    return LayerLint(node=name, op_type=node.op_type, weight=weight_name, shape=[int(d) for d in w.shape],
                     act_type=act or "unknown", weight_type=str(w.dtype), k=k, pairs=pairs,
                     x86_saturating_pairs=sat, neon_wrapping_pairs=wrap, int32_ok=int32_ok,
                     tiers=tiers, reason="; ".join(reasons) or "exact on every tier")
