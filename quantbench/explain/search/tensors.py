"""The search's per-node tensor choices: onnxruntime's per-tensor quantization overrides (``TensorQuantOverrides``)
on the activations a node reads and writes, its weights left as the global choice makes them:

- ``a16``: 16-bit activations (the A16W8 QDQ form), where int8 activations flip decisions and the weights need not,
  with the session requirement that keeps them 16-bit as run (NBITS_ACCURACY_ENTRY: a weighted MatMul reading
  a 16-bit tensor is fused into a MatMulNBits that would otherwise quantize its input to int8 in blocks);
- a calibration method: that method's ranges (calibrate's ``<variant>.ranges.json`` of it) for the node's tensors;
- ``symmetric``: symmetric ranges for the node's tensors.

A candidate applies one form to a set of nodes (a derived global Choice: its ``node_forms``), so it stays a pure
function of (choice, nodes in float) and is named by its semantic hash. The walk over a choice's ranked nodes
(tensor_phase) grows, bisects and shrinks the set as the float walk does, the 8-bit forms before ``a16``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from quantbench.quantize.calibration import load_ranges, ranges_dict

A16 = "a16"
SYMMETRIC = "symmetric"
#: onnxruntime fuses DQ(int8 weight) -> MatMul into a MatMulNBits whose default accuracy level (4) quantizes its
#: float input to int8 on the fly; level 1 keeps that input float, so a 16-bit activation stays 16-bit as run
NBITS_ACCURACY_ENTRY = "session.qdq_matmulnbits_accuracy_level"


def node_tensors(model, node_name: str) -> list[str]:
    """The activation tensors node `node_name` reads and writes (its inputs that are not initializers, its outputs)."""
    inits = {i.name for i in model.graph.initializer}
    node = next(n for n in model.graph.node if n.name == node_name)
    return [t for t in [*node.input, *node.output] if t and t not in inits]


def _override(space, choice, form: str, tensor: str, ranges: dict) -> dict | None:
    if form == A16:
        return {"quant_type": "u16" if choice.activation_type == "u8" else "s16"}
    if form == SYMMETRIC:
        return {"symmetric": True}
    pair = ranges.setdefault(form, ranges_dict(load_ranges(Path(space.ranges_files[form])))).get(tensor)
    return None if pair is None else {"rmin": float(pair[0]), "rmax": float(pair[1])}


def tensor_extra(space, choice) -> dict:
    """{"TensorQuantOverrides": {tensor: [override]}} of `choice`'s node forms (plain JSON: the recipe records it,
    quantize.ort_api.tensor_overrides hands it to onnxruntime); {} without node forms. Only calibrated tensors
    (those onnxruntime quantizes) get one."""
    if not choice.node_forms:
        return {}
    calibrated = ranges_dict(load_ranges(Path(choice.ranges_file)))
    ranges: dict = {}
    out: dict = {}
    for node, form in choice.node_forms:
        for tensor in node_tensors(space.model, node):
            o = _override(space, choice, form, tensor, ranges) if tensor in calibrated else None
            if o is not None:
                out.setdefault(tensor, [{}])[0].update(o)
    return {"TensorQuantOverrides": dict(sorted(out.items()))} if out else {}


def sixteen_bit_nodes(space, choice) -> set:
    """The multiply-accumulate nodes of `space` that read or write a tensor `choice` puts on 16 bits: they run
    dequantized to float (no int8 kernel takes or gives a 16-bit tensor), so their MACs do not count as int8 (their
    weights still do)."""
    wide = {t for node, form in choice.node_forms if form == A16 for t in node_tensors(space.model, node)}
    if not wide:
        return set()
    return {n.name for n in space.model.graph.node if n.name in space.op_types and wide & {*n.input, *n.output}}


def forms(space, choice) -> list[str]:
    """The node forms to walk on `choice`, 8-bit first: the other calibration methods whose ranges calibrate left,
    symmetric ranges (a choice not symmetric already), then 16-bit activations."""
    out = sorted(m for m in space.ranges_files if m != choice.method)
    if not dict(choice.extra_options).get("ActivationSymmetric"):
        out.append(SYMMETRIC)
    return out + [A16]


def with_forms(choice, form: str, nodes) -> object:
    """`choice` with `form` on `nodes`, named for it: `<form>x<count>` (after the choice's name unless the base);
    16-bit activations with the session requirement that keeps them 16-bit as run."""
    nodes = tuple(sorted(nodes))
    tag = f"{form}x{len(nodes)}"
    name = tag if choice.name == "base" else f"{choice.name}+{tag}"
    session = choice.session_with(NBITS_ACCURACY_ENTRY, "1") if form == A16 else choice.session
    return dataclasses.replace(choice, name=name, node_forms=tuple((n, form) for n in nodes), session=session)


def _shortest(make, order: list) -> int | None:
    """The fewest leading nodes of `order` that pass with the form (doubling, then bisection); None if all fail."""
    lo, k = 0, 1
    while True:
        k = min(k, len(order))
        if make(order[:k]).passes:
            break
        if k == len(order):
            return None
        lo, k = k, 2 * k
    hi = k
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if make(order[:mid]).passes else (mid, hi)
    return hi


def _shrink(make, kept: list) -> list:
    """Drop the nodes whose form is not needed: chunks of half, a quarter, ... one node, least ranked first."""
    kept = list(kept)
    size = max(1, len(kept) // 2)
    while True:
        for end in range(len(kept), 0, -size):
            chunk = kept[max(0, end - size):end]
            without = [n for n in kept if n not in chunk]
            if chunk and without and make(without).passes:
                kept = without
        if size == 1:
            return kept
        size = max(1, size // 2)


def _first_passing(walk, choice, order: list, start: list | None):
    """The candidate of the first form that meets the budget: on `start` (then shrunk) when given, else on the
    smallest passing prefix of `order` (then shrunk); None when no form does."""
    for form in forms(walk.space, choice):
        def make(nodes, form=form):
            return walk.try_candidate(with_forms(choice, form, nodes), ())

        walk.say(f"{form} on the {'nodes kept in float' if start else 'ranked nodes'} of choice {choice.name}")
        if start:
            if make(start).passes:
                return make(_shrink(make, start))
            continue
        k = _shortest(make, order) if order else None
        if k is not None:
            return make(_shrink(make, order[:k]))
    return None


def _key(t) -> tuple:
    return (t.int8.get("macs", 0.0), t.int8.get("weights", 0.0))


def tensor_phase(walk, choice, order: list, floated):
    """`floated` (the float walk's candidate on `choice`) or the per-node tensor candidate that keeps more int8
    (MACs, then weights; `floated` on a tie). With `floated` an answer, the forms are tried on its nodes in float
    (their weights back in int8); without one (every node in float, no int8 left) they grow over `order` (ranked)
    from one node: not gated on a form over every node, since a form on more nodes is not always nearer fp32 as run."""
    answer = floated is not None and floated.passes
    formed = _first_passing(walk, choice, order, list(floated.exclude) if answer else None)
    if formed is None or not formed.passes:
        return floated
    return formed if not answer or _key(formed) > _key(floated) else floated
