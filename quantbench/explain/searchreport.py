"""The search's report section and its console summary, from a SearchResult (explain.search): the frontier
(worst-host flips against the share kept in float and the size), the chosen recipe, and for each node kept
in float the measurement that put it there. Latency is not measured by the search (`quantbench latency`
measures a written variant on local and ssh hosts)."""

from __future__ import annotations

from pathlib import Path

from quantbench.report import document
from quantbench.textfmt import md_section, text_table

SECTION = document.registered("search")


def _worst(r: dict):
    if r["worst"] is not None:
        return r["worst"]
    vals = list((r.get("screen") or {}).values())
    return None if not vals or None in vals else max(vals)


def frontier(rows: list[dict]) -> list[dict]:
    """The candidates confirmed on every host that no other beats on both worst-host flips and float share."""
    done = [r for r in rows if r["stage"] == "confirm" and r["worst"] is not None]
    return sorted([r for r in done if not any((o["worst"], o["float_share"]) < (r["worst"], r["float_share"]) and
                                              o["worst"] <= r["worst"] and o["float_share"] <= r["float_share"]
                                              for o in done)],
                  key=lambda r: (r["float_share"], r["worst"], r["size"]))


def _cand(r: dict) -> list:
    macs = (r.get("int8") or {}).get("macs")
    return [r["choice"], ", ".join(r["exclude"]) or "-", f"{r['float_share']:.1%}",
            "-" if macs is None else f"{macs:.1%}", r["size"], r["stage"],
            _worst(r), "yes" if r["passes"] else "no", r["variant_id"][:12], r["note"] or ""]


_HEAD = ["choice", "kept in float", "float share (weights)", "MACs in int8", "bytes", "stage", "worst-host flips", "meets budget",
         "variant id", "note"]


def _why(m: dict) -> str:
    parts = []
    if m.get("lint"):
        parts.append(f"lint: {m['lint_pairs']} pair(s) can diverge on {', '.join(m['lint_hosts'])}")
    loc = m.get("localize_first")
    if loc:
        parts.append(f"localize: first divergent tensor {loc['tensor']} ({' vs '.join(loc['hosts'])}, fixture "
                     f"{loc['fixture'][:12]})")
    if m.get("sqnr_loss_db") is not None:
        parts.append(f"qdq_loss_debug: loses {m['sqnr_loss_db']:.2f} dB SQNR ({m['error_on']})")
    if m.get("sqnr_loss_db_flipping") is not None:
        parts.append(f"{m['sqnr_loss_db_flipping']:.2f} dB on {len(m['flipping_fixtures'])} flipping fixture(s)")
    w = m.get("without_it")
    if w:
        parts.append(f"without it: {w['worst'] if w['worst'] is not None else 'no result'} flips worst host "
                     f"({w['host']}, {w['stage']})")
    return "; ".join(parts)


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
             f"{result.budget} flips per host. {result.stop}. Evaluations: {result.evaluations} "
             f"({result.evaluations_run} run, {result.evaluations_cached} from the cache), {result.seconds:.1f} s.", ""]
    if result.chosen:
        c = result.chosen
        lines += [f"Chosen: **{result.variant_name}** ({result.written}): choice {c['choice']}, recipe "
                  f"{c['recipe']}, kept in float: {', '.join(c['exclude']) or 'nothing'}, session requirements: "
                  f"{c['recipe']['session'] or 'none'}, worst-host flips {c['worst']}.", ""]
    lines += [f"- {line}" for line in imported_lines(result)] + ([""] if imported_lines(result) else [])
    lines += md_section("Frontier", "Worst-host flips against the share of weights kept in float and the size "
                        "(confirmed candidates no other beats on both).", _HEAD, [_cand(r) for r in
                                                                                  frontier(result.tried)])
    if result.nodes:
        lines += md_section("Nodes kept in float", "The measurement that put each node there.",
                            ["node", "op", "why"], [[m["node"], m.get("op_type", ""), _why(m)] for m in result.nodes])
    if not result.chosen:
        lines += md_section("Best candidates", None, _HEAD, [_cand(r) for r in result.best()])
    return "\n".join(lines)


def summary(result) -> str:
    """What the command prints: the chosen variant or the best candidates, then the stop line."""
    out = []
    if result.chosen:
        c = result.chosen
        out.append(f"chosen: {result.variant_name} -> {result.written}")
        out.append(f"  choice {c['choice']}; kept in float: {', '.join(c['exclude']) or 'nothing'} "
                   f"({c['float_share']:.1%} of the weights); session requirements: {c['recipe']['session'] or 'none'}")
        out.append("  worst-host flips " + str(c["worst"]) + ": " + ", ".join(f"{h} {n}" for h, n in c["flips"].items()))
        for m in result.nodes:
            out.append(f"  {m['node']}: {_why(m)}")
    else:
        out.append("no candidate meets the budget; best found:")
        out.append(text_table(_HEAD, [_cand(r) for r in result.best()]))
    out += imported_lines(result)
    out.append(f"evaluations: {result.evaluations} ({result.evaluations_run} run, {result.evaluations_cached} cached); "
               f"result: {result.result_file}")
    out.append(result.stop)
    return "\n".join(out)


def update_report(result, results_dir) -> Path:
    document.write_section(SECTION, render(result), results_dir)
    return document.assemble(results_dir)
