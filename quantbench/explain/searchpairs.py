"""Pairs of global choices, tried when no single one meets the budget: an op type left out of QDQ (a
``float_<op>`` choice, or ``mac_only``) combined with a numeric choice (x64quantprecision, reduce_range, S8S8 /
U8U8, per-channel toggled, symmetric activations, another calibration method's ranges). A transformer can need
both, its normalisation in float and its MatMuls' ranges remade, and neither alone meets the budget.

A pair is one more global choice (named ``<op choice>+<numeric choice>``, so the report says which two it
used), measured and ranked as the others are. The most promising pairs go first (fewest worst-host flips of
the two at screening, summed), at most 1/PAIR_SHARE of the evaluation budget is spent on them (the node phase
needs the rest), and the walk over them ends at the first that meets the budget: every global candidate keeps
the same nodes in float, so a later pair could only differ in flips and size. A pair that builds the model one
of the candidates tried already is (its op type left out changes nothing) is not measured again.
"""

from __future__ import annotations

import dataclasses

#: the share of the evaluation budget pairs may take (one candidate on one host is one evaluation)
PAIR_SHARE = 4
#: the fields an op-type choice sets (which ops stay out of QDQ)
OP_FIELDS = ("exclude_op_types", "float_nodes")
#: the fields a numeric choice sets (ranges, types, granularity, session entries, quantizer options)
NUMERIC_FIELDS = ("method", "ranges_file", "activation_type", "weight_type", "per_channel", "reduce_range",
                  "session", "extra_options")


def _changes(choice, base, fields) -> dict:
    return {f: getattr(choice, f) for f in fields if getattr(choice, f) != getattr(base, f)}


def kinds(choices: list, base) -> tuple[list, list]:
    """(the op-type choices, the numeric choices) among `choices`: each changes only its own kind's fields of
    `base` (a choice changing both, or neither, is neither)."""
    ops, numeric = [], []
    for c in choices:
        op, num = _changes(c, base, OP_FIELDS), _changes(c, base, NUMERIC_FIELDS)
        if op and not num and not c.node_forms:
            ops.append(c)
        elif num and not op and not c.node_forms:
            numeric.append(c)
    return ops, numeric


def pair(op_choice, numeric_choice, base):
    """`op_choice` with `numeric_choice`'s changes of `base`, named `<op>+<numeric>`."""
    return dataclasses.replace(op_choice, name=f"{op_choice.name}+{numeric_choice.name}",
                               **_changes(numeric_choice, base, NUMERIC_FIELDS))


def _screened(walk, choices: list) -> dict:
    """{choice: its screening's worst-host flips} of the single choices measured (not refused, not all float)."""
    out = {}
    for t in walk.tried:
        if not t.exclude and t.choice in choices and t.screen and t.screen_worst is not None:
            out[t.choice] = t.screen_worst
    return out


def pairs_in_order(walk, choices: list) -> list:
    """The pairs of `choices` (an op-type choice and a numeric one, each measured alone), the fewest summed
    screening flips first, then the order of the choices."""
    base = choices[0]
    ops, numeric = kinds(choices, base)
    worst = _screened(walk, choices)
    ranked = [(worst[o] + worst[n], choices.index(o), choices.index(n), o, n)
              for o in ops for n in numeric if o in worst and n in worst]
    return [pair(o, n, base) for *_, o, n in sorted(ranked, key=lambda r: r[:3])]


def pair_phase(walk, choices: list) -> None:
    """With no single global choice meeting the budget, pairs of them (pairs_in_order) until one does or their
    share of the evaluation budget is spent; each lands in walk.tried, ranked with the others."""
    if any(t.passes for t in walk.tried if not t.exclude):
        return
    todo = pairs_in_order(walk, choices)
    if not todo:
        return
    cap = walk.params.max_evaluations // PAIR_SHARE
    start = walk.evaluations
    walk.say(f"pairs of global choices (op types left in float with a numeric choice): {len(todo)}, at most "
             f"{cap} evaluations")
    for choice in todo:
        if walk.evaluations - start >= cap:
            walk.say(f"pairs: {cap} evaluations spent, the rest left untried")
            return
        if _measured_already(walk, choice):
            continue
        if walk.try_candidate(choice, ()).passes:
            return


def _measured_already(walk, choice) -> bool:
    """Whether `choice` builds a model a candidate tried already is (a Sigmoid between two MatMuls stays in its QDQ
    group left out or not): measuring it again would only spend evaluations."""
    built = walk.space.build(choice, ())
    return built is not None and any(t.variant_id == built.variant_id and t.choice.entries == choice.entries
                                     for t in walk.tried)
