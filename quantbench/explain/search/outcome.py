"""The search's outcome: whether a candidate with int8 left meets every constraint, and, where none does, the
nearest one (its int8 share, its flips per host) and what would change the outcome.

All-float is the baseline the search is measured against, never an answer: a candidate with no int8 left (no
QuantizeLinear, DequantizeLinear or integer op in its model; or every multiply-accumulate node kept in float) is
never chosen nor written, so a search that ends without an answer says so (exit 1) instead of shipping fp32 with
extra steps.
"""

from __future__ import annotations

#: the stage of a candidate that holds no QuantizeLinear, DequantizeLinear or integer op (not evaluated)
ALL_FLOAT = "all float"
NO_INT8 = "no int8 left (no QuantizeLinear, DequantizeLinear or integer op): the fp32 baseline, not an answer"
NO_INT8_MACS = ("every multiply-accumulate node kept in float: no int8 multiply-accumulate left, so meeting the "
                "budget it is not an answer")
#: the stop line's tail when the search stopped early holding an answer it writes
NOT_DONE = ("; stopped, not done: the candidate written meets every constraint on the hosts and fixtures searched, "
            "but the rest of the space was not walked")


def int8_left(t) -> bool:
    """Whether a candidate (explain.search.walk.Tried) keeps int8 worth shipping: some int8 op in its model and some
    multiply-accumulate node (weights or MACs) left in int8."""
    return t.int8_ops > 0 and max((t.int8 or {}).values(), default=1.0) > 0


def _budget_needed(walk, t) -> str:
    """The budget that would take `t` (its flips on every host): a count, or for a share the share of the served
    decisions its worst host needs; "at least" when it was only screened."""
    least = "at least " if t.stage == "screen" else ""
    if walk.params.limit.share is None:
        return f"a budget of {least}{t.worst} flips per host"
    need = max(v / max(1, walk.served.get(h, 0)) for h, v in t.flips.items())
    return f"a budget of {least}{100 * need:.3g}% of the served decisions per host"


def changes(walk, t) -> list[str]:
    """What would change the outcome of a search that ended (walk.stop_kind: evaluations | time | exhausted)
    without an answer, `t` its nearest candidate (or None)."""
    out = []
    params, kind, tried = walk.params, walk.stop_kind, walk.tried
    flips_ok = t is not None and bool(t.flips) and all(v is not None and v <= walk.allowed(h)
                                                        for h, v in t.flips.items())
    if t is not None and not flips_ok:
        out.append(_budget_needed(walk, t))
    if t is not None and params.max_drop is not None and t.stage == "confirm" and walk.dropped(t):
        refs = dict(zip((h.label for h in walk.fleet.hosts), walk.fleet.fp32_metric))
        need = max((refs[h] - t.accuracy[h] for h in walk.dropped(t) if h in t.accuracy), default=None)
        if need is not None:
            out.append(f"a max drop of {need:.3g}")
    if t is not None and t.latency_ms and walk.meets(t):
        out.append(f"a latency ceiling of {max(t.latency_ms.values()):.3g} ms")
    if kind == "evaluations":
        out.append(f"more evaluations than {params.max_evaluations}")
    elif kind == "time":
        out.append(f"more time than {params.max_seconds:g} s")
    elif params.space != "all":
        out.append("the whole space (global choices and nodes kept in float)")
    refused = sum(1 for x in tried if x.stage == "ceiling" and not x.flips)
    if refused:
        out.append(f"a higher float-share or size ceiling ({refused} candidate{'' if refused == 1 else 's'} over "
                   "it, not evaluated)")
    return out


def nearest(walk, name_of) -> dict | None:
    """The candidate with int8 left nearest to an answer: the fewest worst-host flips, then the largest share of
    MACs in int8, then the earlier one; its row, variant name (`name_of`), the fixtures its flips were counted on
    and what would change the outcome (`changes`). None when a candidate passed."""
    tried = walk.tried
    if any(t.passes for t in tried):
        return None
    measured = [t for t in tried if int8_left(t) and t.worst is not None]
    t = min(measured, key=lambda t: (t.worst, -(t.int8 or {}).get("macs", 1.0), tried.index(t)), default=None)
    change = changes(walk, t)
    if t is None:
        return {"name": None, "change": change}
    counted = len(t.screened_on) if t.stage == "screen" else len(walk.all_ids)
    return {**t.row(), "name": name_of(t), "fixtures": counted, "change": change}


def no_answer_tail(tried: list) -> str:
    """The exhausted stop line's note on the candidates that are no answer for want of int8 ("" without any)."""
    flat = sum(1 for t in tried if t.stage == ALL_FLOAT)
    macs = sum(1 for t in tried if t.stage != ALL_FLOAT and t.int8_ops and not int8_left(t))
    parts = [f"{flat} held no int8 (the fp32 baseline, not evaluated)" if flat else "",
             f"{macs} kept every multiply-accumulate node in float" if macs else ""]
    return "".join(f"; {p}" for p in parts if p)
