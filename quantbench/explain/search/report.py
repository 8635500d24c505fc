"""The search's report section and its console summary, from a SearchResult (explain.search.walk): the frontier
(worst-host flips against the share kept in float and the size, and the latency where a latency ceiling had it
measured), the chosen recipe, and for each node kept in float the measurement that put it there."""

from __future__ import annotations

from pathlib import Path

from quantbench.explain.search.identity import class_text, identity_line
from quantbench.hosts.requirements import entries_text
from quantbench.report import document
from quantbench.textfmt import md_section, text_table

SECTION = document.registered("search")


def _worst(r: dict):
    if r["worst"] is not None:
        return r["worst"]
    vals = list((r.get("screen") or {}).values())
    return None if not vals or None in vals else max(vals)


def _slowest(r: dict) -> float:
    """The candidate's slowest median over the hosts that measured it (unmeasured: no better than any)."""
    return max((r.get("latency_ms") or {}).values(), default=float("inf"))


def _confirmed(r: dict) -> bool:
    """Confirmed on every host: stage confirm, or over the latency ceiling (only confirmed survivors are timed)."""
    return r["worst"] is not None and (r["stage"] == "confirm" or bool(r.get("latency_ms")))


def frontier(rows: list[dict]) -> list[dict]:
    """The candidates confirmed on every host that no other beats on worst-host flips, float share and (where
    measured) latency alike; those over the latency ceiling among them: they are points of the trade-off."""
    done = [r for r in rows if _confirmed(r)]

    def point(r):
        return r["worst"], r["float_share"], _slowest(r)

    return sorted([r for r in done if not any(point(o) != point(r) and all(a <= b for a, b in zip(point(o), point(r)))
                                              for o in done)],
                  key=lambda r: (r["float_share"], r["worst"], r["size"]))


def _latency(r: dict) -> str:
    lat, spread = r.get("latency_ms") or {}, r.get("latency_spread_ms") or {}
    return "; ".join(f"{h} {ms:.3g} (spread {spread.get(h, 0.0):.2g})" for h, ms in lat.items()) or "-"


def _cand(r: dict, timed: bool = False) -> list:
    macs = (r.get("int8") or {}).get("macs")
    return [r["choice"], ", ".join(r["exclude"]) or "-", f"{r['float_share']:.1%}",
            "-" if macs is None else f"{macs:.1%}", r["size"], r["stage"],
            _worst(r), "yes" if r["passes"] else "no", *([_latency(r)] if timed else []), r["variant_id"][:12],
            r["note"] or ""]


_HEAD = ["choice", "kept in float", "float share (weights)", "MACs in int8", "bytes", "stage", "worst-host flips", "meets budget",
         "variant id", "note"]
LATENCY_HEAD = "latency ms (median of medians)"


def _table(rows: list[dict]) -> tuple[list, list]:
    """(head, rows) of a candidates table; a latency column when some row of it was timed."""
    timed = any(r.get("latency_ms") for r in rows)
    head = _HEAD[:8] + [LATENCY_HEAD] + _HEAD[8:] if timed else _HEAD
    return head, [_cand(r, timed) for r in rows]


def sqnr_change(loss_db: float) -> str:
    """A node's SQNR loss in words: a negative loss is a gain (its output nearer the float model's than its
    inputs), said so rather than "loses -5.55 dB"."""
    if loss_db > 0:
        return f"loses {loss_db:.2f} dB SQNR"
    return f"gains {-loss_db:.2f} dB SQNR" if loss_db < 0 else "loses no SQNR"


def _why(m: dict) -> str:
    parts = []
    if m.get("lint"):
        parts.append(f"lint: {m['lint_pairs']} pair(s) can diverge on {', '.join(m['lint_hosts'])}")
    loc = m.get("localize_first")
    if loc:
        parts.append(f"localize: first divergent tensor {loc['tensor']} ({' vs '.join(loc['hosts'])}, fixture "
                     f"{loc['fixture'][:12]})")
    if m.get("sqnr_loss_db") is not None:
        parts.append(f"qdq_loss_debug: {sqnr_change(m['sqnr_loss_db'])} ({m['error_on']})")
    if m.get("sqnr_loss_db_flipping") is not None:
        parts.append(f"{sqnr_change(m['sqnr_loss_db_flipping'])} on {len(m['flipping_fixtures'])} flipping "
                     "fixture(s)")
    w = m.get("without_it")
    if w:
        parts.append(f"without it: {w['worst'] if w['worst'] is not None else 'no result'} flips worst host "
                     f"({w['host']}, {w['stage']})")
    return "; ".join(parts)


def _budget(result) -> str:
    """The budget in words (a result written before budgets took shares: the count per host)."""
    return result.budget_text or f"{result.budget} flips per host"


def nearest_line(result) -> str:
    """Where no candidate with int8 left meets every constraint: the nearest one (its int8 share, its flips per
    host, the fixtures they were counted on) and what would change the outcome, in one line."""
    n = result.nearest or {"name": None, "change": []}
    change = " or ".join(n["change"]) or "nothing the search measured"
    if n["name"] is None:
        return f"nearest: no candidate with int8 left was evaluated; would change the outcome: {change}"
    kept = f"{len(n['exclude'])} node(s) kept in float" if n["exclude"] else "nothing kept in float"
    int8 = n.get("int8") or {}
    flips = ", ".join(f"{h} {'cannot run' if v is None else v}" for h, v in n["flips"].items())
    counted = (f"screened on {n['fixtures']} of {result.fixtures} fixtures" if n["stage"] == "screen"
               else f"confirmed on {n['fixtures']} fixtures")
    return (f"nearest: {n['name']} (choice {n['choice']}, {kept}): int8 {int8.get('macs', 1.0):.1%} of the MACs, "
            f"{int8.get('weights', 1.0):.1%} of the weights; flips {flips} ({counted}), budget {_budget(result)}; would change the outcome: {change}")


def int8_text(row: dict) -> str:
    """What an answer leads with: the share of the multiply-accumulates and of the weights it keeps in int8."""
    int8 = row.get("int8") or {}
    return (f"{int8.get('macs', 1.0):.1%} of the MACs and {int8.get('weights', 1.0):.1%} of the weights in int8 "
            f"({row['float_share']:.1%} of the weights in float)")


def accuracy_line(result, row: dict) -> str:
    """A candidate's accuracy against the labels beside fp32's, per host, and the max drop it is held to."""
    per = ", ".join(f"{h} {row.get('accuracy', {}).get(h, float('nan')):.3f} (fp32 {ref:.3f})"
                    for h, ref in result.fp32_accuracy.items() if ref is not None)
    return f"accuracy ({result.metric}): {per or 'not measured'}; max drop {result.max_drop:g}"


def holds_line(result) -> str:
    """Where the answer holds, measured: its fixtures and hosts, and the known hosts it was not checked on."""
    h = result.holds_on or {}
    if not h:
        return ""
    where = ("a limit of the eval split" if h.get("limit") is not None else "every fixture of the eval split")
    unchecked = ", ".join(h.get("unchecked_hosts") or []) or "none"
    return (f"holds on: {h['fixtures']} fixtures ({where}) on {', '.join(h['hosts'])}; not checked on: {unchecked}")


def one_class_line(result) -> str:
    """An identity search's answer: the one class it gives on the whole fleet."""
    return f"identical outputs: {class_text((result.identity or {}).get('classes') or [[]])} on the whole fleet"


def imported_lines(result) -> list[str]:
    """One line per imported host of the fleet: who stands in for it, or that the answer is unconfirmed there."""
    out = []
    for m in result.imported:
        known = f"its {result.base} flips {m['base_flips']} (from its imported results)"
        if m["stand_in"]:
            out.append(f"imported host {m['host']}: flips {m['note']}; {known}")
        else:
            out.append(f"imported host {m['host']}: no host of the fleet has its outputs, so no candidate was "
                       f"evaluated there (unconfirmed); {known}"
                       + (f", on fixtures {', '.join(f[:12] for f in m['flipping_fixtures'])} (screened first)"
                          if m["flipping_fixtures"] else ""))
    return out


def render(result) -> str:
    lines = ["## Ship search (`quantbench search`)", "",
             f"Base variant {result.base} on {', '.join(result.hosts)}, {result.fixtures} fixtures, budget "
             f"{_budget(result)}. {result.stop}. Evaluations: {result.evaluations} "
             f"({result.evaluations_run} run, {result.evaluations_cached} from the cache), {result.seconds:.1f} s.", ""]
    if result.chosen:
        c = result.chosen
        lines += [f"Chosen: **{result.variant_name}** keeps {int8_text(c)} ({result.written}): choice "
                  f"{c['choice']}, recipe "
                  f"{c['recipe']}, kept in float: {', '.join(c['exclude']) or 'nothing'}, session requirements: "
                  f"{entries_text(c['session_requirements']) or 'none'}, worst-host flips {c['worst']}.", "",
                  *([forms_line(c) + ".", ""] if c["recipe"].get("node_forms") else []),
                  holds_line(result) + ".", ""]
    lines += [f"- {line}" for line in imported_lines(result)] + ([""] if imported_lines(result) else [])
    timed = result.max_latency_ms is not None
    lines += md_section("Frontier", "Worst-host flips against the share of weights kept in float and the size"
                        + (f", and the latency under the ceiling {result.max_latency_ms:g} ms (confirmed candidates no "
                           "other beats on all three)." if timed else
                           " (confirmed candidates no other beats on both)."), *_table(frontier(result.tried)))
    if result.nodes:
        lines += md_section("Nodes kept in float", "The measurement that put each node there.",
                            ["node", "op", "why"], [[m["node"], m.get("op_type", ""), _why(m)] for m in result.nodes])
    if result.chosen and getattr(result, "identical", False):
        lines += [one_class_line(result) + ".", ""]
    if not result.chosen:
        lines += [nearest_line(result), ""]
        lines += [identity_line(result.identity, None), ""] if getattr(result, "identical", False) else []
        lines += md_section("Best candidates", None, *_table(result.best()))
    return "\n".join(lines)


def forms_line(row: dict) -> str:
    """The per-node tensor choices a candidate used (explain.search.tensors): which nodes, which form."""
    words = {"a16": "16-bit activations (A16W8, weights int8)", "symmetric": "symmetric activation ranges"}
    by_form: dict = {}
    for node, form in sorted(row["recipe"]["node_forms"].items()):
        by_form.setdefault(form, []).append(node)
    return "per-node tensor choices: " + "; ".join(
        f"{words.get(form, f'{form} ranges')} on {', '.join(nodes)}" for form, nodes in sorted(by_form.items()))


def summary(result) -> str:
    """What the command prints: the chosen variant or the best candidates, then the stop line."""
    out = []
    if result.chosen:
        c = result.chosen
        out.append(f"chosen: {result.variant_name} -> {result.written}")
        out.append(f"  keeps {int8_text(c)}")
        out.append(f"  choice {c['choice']}; kept in float: {', '.join(c['exclude']) or 'nothing'} "
                   f"({c['float_share']:.1%} of the weights); session requirements: "
                   f"{entries_text(c['session_requirements']) or 'none'}")
        out.append("  worst-host flips " + str(c["worst"]) + ": " + ", ".join(f"{h} {n}" for h, n in c["flips"].items())
                   + f"; budget {_budget(result)}")
        if (c.get("recipe") or {}).get("node_forms"):
            out.append(f"  {forms_line(c)}")
        if result.holds_on:
            out.append(f"  {holds_line(result)}")
        if getattr(result, "identical", False):
            out.append(f"  {one_class_line(result)}")
        if getattr(result, "max_drop", None) is not None:
            out.append(f"  {accuracy_line(result, c)}")
        if c.get("latency_ms"):
            out.append(f"  latency (median of medians, ms; ceiling {result.max_latency_ms:g}): {_latency(c)}")
        for m in result.nodes:
            out.append(f"  {m['node']}: {_why(m)}")
    else:
        out.append("no candidate meets the budget; best found:")
        out.append(text_table(*_table(result.best())))
        out.append(nearest_line(result))
        if getattr(result, "identical", False):
            out.append(identity_line(result.identity, None))
    out += imported_lines(result)
    out.append(f"evaluations: {result.evaluations} ({result.evaluations_run} run, {result.evaluations_cached} cached); "
               + _measurements(result) + f"result: {result.result_file}")
    out.append(result.stop)
    return "\n".join(out)


def _measurements(result) -> str:
    """The latency measurements spent (not evaluations), with a latency ceiling."""
    if result.max_latency_ms is None:
        return ""
    return (f"latency measurements: {result.latency_measurements} ({result.latency_measurements_run} run, "
            f"{result.latency_measurements_cached} cached); ")


def update_report(result, results_dir) -> Path:
    document.write_section(SECTION, render(result), results_dir)
    return document.assemble(results_dir)
