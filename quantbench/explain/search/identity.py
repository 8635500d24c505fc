"""The search's identity constraint (`search --identical`): on top of the decision budget, the answer must give
byte-identical outputs (one class) on every measured host of the fleet.

A candidate's classes are its hosts grouped by the hashes of their outputs over the fixtures of its last stage
(the grouping `equiv` makes; different bytes on a subset are different bytes on the whole set, so screening never
lets through what confirming would split). Where the fleet splits, localize names the first divergent tensor
between two classes and the op that wrote it; the search then stacks on the choice what moves that op towards
identity (measured, not tuned to one model): for a multiply-accumulate op the exact integer paths
(`session.x64quantprecision`, reduce_range, U8U8), for an elementwise op, a lookup-table activation, Softmax or a
normalisation, that op type kept out of QDQ (and then its float outputs quantized), for the float tail writing the
outputs, those outputs put through Q/DQ at their calibrated ranges ("quantized outputs"). Where nothing makes one
class, the nearest candidate's classes and, per pair of classes, the op localize finds first divergent are the
answer's "why".
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from quantbench.explain.search.outcome import int8_left
from quantbench.explain.search.space import NODE_OPS, X64_ENTRY, Choice, mac_node_of
from quantbench.inputs.modelio import load_model
from quantbench.quantize.calibration import load_ranges, ranges_dict

#: the op types whose integer kernels (QLinearAdd/QLinearMul, lookup-table activations, QLinearSoftmax,
#: normalisations) an identity search may keep out of QDQ, one stacked choice each, when localize names one first
FLOAT_IDENTITY_OPS = ("Add", "Mul", "Softmax", "LayerNormalization", "InstanceNormalization", "Sigmoid", "LeakyRelu",
                      "GlobalAveragePool", "AveragePool")
#: ops a QDQ group fuses into the multiply-accumulate node before it (their output is that node's)
FUSED_ACTIVATIONS = ("Relu", "Clip")
#: the QDQ plumbing localize's tensor is walked back through to the op that computed it
PLUMBING = ("QuantizeLinear", "DequantizeLinear")
#: the step putting each float graph output through Q/DQ at its calibrated range
#: (quantize.ort_api.quantize_float_outputs): tiny host-to-host differences of a float tail round to one grid step
QUANTIZED_OUTPUTS = "quantized_outputs"
#: the most stacked steps an identity walk takes from one global choice (each one localize run and one candidate)
MAX_STEPS = 4
#: the share of the evaluation budget the identity walk's localize runs may take over the search (the node
#: ranking's share, explain.search.walk.LOCALIZE_SHARE; one run on one host is one evaluation)
LOCALIZE_SHARE = 8


def classes_of(t, imported=()) -> list[list[str]]:
    """The hosts of candidate `t`'s last stage grouped by their outputs' hashes over its fixtures (fleet order); an
    imported host joins the class of the host standing in for it, one with no stand-in (or a host that could not
    run it) is a class of its own: its bytes are not known to be anyone's."""
    stand_in = {m.label: m.stand_in_label for m in imported}
    groups: dict = {}
    for host in t.flips:
        src = host if host in t.hashes else stand_in.get(host)
        key = tuple(sorted(t.hashes[src].items())) if src in t.hashes and t.flips.get(host) is not None \
            else ("unknown", host)
        groups.setdefault(key, []).append(host)
    return list(groups.values())


def one_class(t, imported=()) -> bool:
    return bool(t.flips) and len(classes_of(t, imported)) == 1


def differing_fixtures(t) -> list[str]:
    """The fixture ids whose outputs hash otherwise on some host of `t`'s last stage, sorted."""
    ids = {f for h in t.hashes.values() for f in h}
    return sorted(f for f in ids if len({h.get(f) for h in t.hashes.values()}) > 1)


def class_text(classes: list) -> str:
    """'2 classes (A: x86, x86-avx2 | B: x86-sse4)' or 'one class (x86, pi)'."""
    if len(classes) == 1:
        return f"one class ({', '.join(classes[0])})"
    return f"{len(classes)} classes (" + " | ".join(f"{chr(65 + i)}: {', '.join(c)}" for i, c in
                                                     enumerate(classes)) + ")"


def divergent_op(model, tensor: str | None, op_types: dict) -> dict:
    """{node, op_type, mac_node} of the op that computed `tensor` (localize's first divergent tensor, often a
    QuantizeLinear output): its producer walked back through Q/DQ; a fused Relu/Clip names the multiply-accumulate
    node before it too (`mac_node`, NODE_OPS)."""
    if tensor is None:
        return {}
    producer = {o: n for n in model.graph.node for o in n.output}
    node = producer.get(tensor)
    while node is not None and node.op_type in PLUMBING:
        node = producer.get(node.input[0])
    if node is None:
        return {"node": None, "op_type": None, "mac_node": None}
    mac = mac_node_of(model, node.output[0], op_types) if node.op_type in (*NODE_OPS, *FUSED_ACTIVATIONS) else None
    return {"node": node.name or node.output[0], "op_type": node.op_type, "mac_node": mac}


def output_ops(model) -> list[str]:
    """'<op type> <node>' of the ops that write the model's outputs (walked back through Q/DQ), sorted: where the
    outputs differ and no intermediate QuantizeLinear output localize can observe does, those ops (or the float tail
    after the last DequantizeLinear they end) separate the hosts."""
    producer = {o: n for n in model.graph.node for o in n.output}
    out = set()
    for o in model.graph.output:
        node = producer.get(o.name)
        while node is not None and node.op_type in PLUMBING:
            node = producer.get(node.input[0])
        if node is not None:
            out.add(f"{node.op_type} {node.name or node.output[0]}")
    return sorted(out)


def stacked(choice: Choice, op_type: str | None, space) -> list[Choice]:
    """The choices that move `choice` towards identity where localize found `op_type` divergent first, in the order
    tried: for a multiply-accumulate op (or one fused into it) the exact integer paths it does not take yet
    (x64quantprecision, reduce_range, U8U8); for an op of FLOAT_IDENTITY_OPS the base quantizes, that op type kept out
    of QDQ, then (where an op of that type writes a graph output) that with its outputs quantized
    (QUANTIZED_OUTPUTS); for the float tail writing the outputs (`op_type` None: no intermediate QuantizeLinear output
    differs), the outputs quantized (either where an output has a calibrated range); nothing else (no measurement
    says what would help)."""
    if op_type in (*NODE_OPS, *FUSED_ACTIVATIONS):
        out = []
        if X64_ENTRY not in choice.entries:
            out.append(_step(choice, "x64quantprecision", session=choice.session_with(X64_ENTRY, "1")))
        if not choice.reduce_range:
            out.append(_step(choice, "reduce_range", reduce_range=True))
        if (choice.activation_type, choice.weight_type) != ("u8", "u8"):
            out.append(_step(choice, "u8u8", activation_type="u8", weight_type="u8"))
        return out
    present = {n.op_type for n in space.model.graph.node}
    out = []
    if op_type in FLOAT_IDENTITY_OPS and op_type in present and op_type not in choice.exclude_op_types:
        out.append(_step(choice, f"float_{op_type.lower()}",
                         exclude_op_types=tuple(sorted({*choice.exclude_op_types, op_type}))))
    at_output = op_type is None or (out and op_type in {o.split()[0] for o in output_ops(space.model)})
    if at_output and not choice.quantize_outputs and ranged_outputs(choice, space):
        out.append(_step(out[0] if out else choice, QUANTIZED_OUTPUTS, quantize_outputs=True))   # onto the grid
    return out


def ranged_outputs(choice: Choice, space) -> list[str]:
    """The graph outputs `choice`'s ranges file holds a range for, sorted: the ones quantized outputs can put on a
    grid (an op type calibrate left out of QDQ has no calibrated output: the step would re-make the same model)."""
    names = {o.name for o in space.model.graph.output}
    return sorted(names & set(ranges_dict(load_ranges(Path(choice.ranges_file)))))


def _step(b: Choice, what: str, **changes) -> Choice:
    """`b` with `changes`, named `<b>+<what>` (the variant as calibrated: `<what>`)."""
    fields = {**asdict(b), **changes, "name": what if b.name == "base" else f"{b.name}+{what}"}
    for key in ("session", "exclude_op_types", "extra_options"):
        fields[key] = tuple(tuple(kv) if isinstance(kv, list) else kv for kv in fields[key])
    return Choice(**fields)


def pair_of(t, a: list, b: list) -> tuple[str, str, str] | None:
    """(a host of class `a`, one of class `b`, the first fixture, sorted, whose outputs differ between them), both
    run hosts; None when no such pair ran."""
    ha = next((h for h in a if h in t.hashes), None)
    hb = next((h for h in b if h in t.hashes), None)
    if ha is None or hb is None:
        return None
    fid = next((f for f in sorted(t.hashes[ha]) if t.hashes[hb].get(f) not in (None, t.hashes[ha][f])), None)
    return None if fid is None else (ha, hb, fid)


def separating_op(walk, t, pair: tuple, cap: int) -> dict:
    """Localize on `pair` (two host labels and a fixture) of candidate `t`, stopped at the first divergent
    QuantizeLinear output and before `cap` runs per host (its runs counted as evaluations): {hosts, fixture, tensor,
    node, op_type, mac_node, evaluations}; with no QuantizeLinear output divergent, the float tail computing the
    outputs (`op_type` None, `tail` its op types)."""
    labels = [h.label for h in walk.fleet.hosts]
    out = {"hosts": list(pair[:2]), "fixture": pair[2]}
    if cap < 2:
        return {**out, "skipped": "the evaluation budget is spent"}
    model = load_model(t.path, check=False)
    first, runs, _ = walk.fleet.localize(t.path, t.variant_id, t.choice.entries,
                                         (labels.index(pair[0]), labels.index(pair[1])), pair[2], cap, model)
    walk.evaluations += 2 * runs
    walk.localize_spent += 2 * runs
    out.update({"tensor": first[0] if first else None, "evaluations": 2 * runs})
    if not first and runs >= cap:
        return {**out, "skipped": f"no divergent QuantizeLinear output within localize's {cap} runs per host"}
    if not first:
        return {**out, "op_type": None, "tail": output_ops(model)}
    return {**out, **divergent_op(model, first[0], walk.space.op_types)}


def op_text(ev: dict) -> str:
    """One separating op in words: 'Conv /stem/Conv (via Relu; tensor T, fixture F)'."""
    if ev.get("skipped"):
        return f"not localized ({ev['skipped']})"
    if ev.get("op_type") is None:
        return (f"the ops writing the outputs ({', '.join(ev.get('tail') or []) or '?'}; no intermediate "
                f"QuantizeLinear output observed divergent, fixture {ev['fixture'][:12]})")
    mac = f" after {ev['mac_node']}" if ev.get("mac_node") and ev["mac_node"] != ev["node"] else ""
    return f"{ev['op_type']} {ev['node']}{mac} (tensor {ev['tensor']}, fixture {ev['fixture'][:12]})"


def _cap(walk) -> int:
    """Runs per host a localize of the identity walk may take: its share of the evaluation budget left, halved."""
    p = walk.params
    return min(p.max_evaluations // LOCALIZE_SHARE - walk.localize_spent, p.max_evaluations - walk.evaluations) // 2


def split_candidates(walk) -> list:
    """The candidates with int8 left whose hosts split (hashes known on two hosts or more), nearest to one class
    first: confirmed before screened, fewest classes, fewest worst-host flips, the earlier."""
    imported = walk.fleet.imported
    split = [t for t in walk.tried if int8_left(t) and len(t.hashes) > 1 and len(classes_of(t, imported)) > 1]
    big = float("inf")
    return sorted(split, key=lambda t: (t.stage != "confirm", len(classes_of(t, imported)),
                                        big if t.worst is None else t.worst, walk.tried.index(t)))


def identity_phase(walk):
    """Stack on the candidates that split the fleet (nearest first, up to two) what localize says moves the first
    divergent op towards identity (`stacked`), one step at a time, keeping a step that lowers the classes; the first
    candidate meeting every constraint, or None."""
    for start in split_candidates(walk)[:2]:
        t = start
        for _ in range(MAX_STEPS):
            classes = classes_of(t, walk.fleet.imported)
            pair = pair_of(t, *classes[:2]) if len(classes) > 1 else None   # one class: another constraint missed
            if pair is None or _cap(walk) < 2:
                break
            ev = separating_op(walk, t, pair, _cap(walk))
            walk.say(f"identity: {t.choice.name} splits the fleet, first divergent {op_text(ev)}")
            steps = [walk.try_candidate(c, ()) for c in stacked(t.choice, ev.get("op_type"), walk.space)]
            passed = next((u for u in steps if u.passes), None)
            if passed is not None:
                return passed
            better = [u for u in steps if len(u.hashes) > 1 and
                      len(classes_of(u, walk.fleet.imported)) < len(classes_of(t, walk.fleet.imported))]
            if not better:
                break
            t = better[0]
    return None


def separation(walk, t) -> list[dict]:
    """Per pair of `t`'s classes (at most six pairs): the op localize finds first divergent between a host of each
    (its runs counted as evaluations: the explanation of a search that ended, up to a sixteenth of the evaluation
    budget per host and pair, at least 4 runs)."""
    classes = classes_of(t, walk.fleet.imported)
    out = []
    per_pair = max(4, walk.params.max_evaluations // LOCALIZE_SHARE // 2)
    for i in range(len(classes)):
        for j in range(i + 1, len(classes)):
            if len(out) == 6:
                return out
            pair = pair_of(t, classes[i], classes[j])
            tag = {"classes": [chr(65 + i), chr(65 + j)]}
            if pair is None:
                out.append({**tag, "skipped": "no two run hosts of these classes to localize on"})
                continue
            out.append({**tag, **separating_op(walk, t, pair, per_pair)})
    return out


def outcome(walk, chosen) -> dict:
    """The identity block of a search's result: the classes of the answer (one); without an answer, the first
    candidate confirmed in one class that another constraint kept out (`over`), else the nearest candidate that splits
    the fleet and the op separating each pair of its classes."""
    imported = walk.fleet.imported
    if chosen is not None:
        return {"candidate": chosen.choice.name, "classes": classes_of(chosen, imported), "separating": []}
    whole = [t for t in walk.tried if int8_left(t) and t.stage == "confirm" and one_class(t, imported)]
    if whole:   # one class, but over another constraint (the nearest line says which)
        t = whole[0]
        return {"candidate": t.choice.name, "exclude": list(t.exclude), "stage": t.stage,
                "classes": classes_of(t, imported), "separating": [], "over": "another constraint"}
    split = split_candidates(walk)
    if not split:
        return {"candidate": None, "classes": [], "separating": []}
    t = split[0]
    return {"candidate": t.choice.name, "exclude": list(t.exclude), "stage": t.stage,
            "classes": classes_of(t, imported), "separating": separation(walk, t)}


def identity_line(identity: dict, name: str | None) -> str:
    """The one line an identity search without an answer ends with: the nearest candidate's classes and the ops that
    still separate them."""
    if not identity or not identity.get("classes"):
        return "not one class: no candidate with int8 left was run on two hosts"
    if len(identity["classes"]) == 1:
        return (f"one class: {name or identity['candidate']} gives {class_text(identity['classes'])} on the whole "
                "fleet, but does not meet the other constraints (see the nearest candidate)")
    ops = "; ".join(f"{'|'.join(s['classes'])}: {op_text(s)}" for s in identity["separating"]) or "not localized"
    return (f"not one class: nearest {name or identity['candidate']} gives {class_text(identity['classes'])}"
            f"{' (screened only)' if identity.get('stage') == 'screen' else ''}; separated by: {ops}")
