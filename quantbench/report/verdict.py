"""The equiv section's verdict: per variant, whether it ships (its gates, the hosts that agree, the decisions
that flip), as the report's first lines and the terminal summary's.
"""

from __future__ import annotations

from quantbench.analysis.decode import kind_of
from quantbench.errors import flag_mark
from quantbench.analysis.gates import DEFAULT_ATOL, DEFAULT_RTOL, budget_words, ship_verdict, tolerance_set
from quantbench.hosts.requirements import entries_text
from quantbench.report import accuracysection


# --------------------------------------------------------------------------- verdict


def _vs_fp32(result, v: dict, host: str) -> dict | None:
    """The comparison of `v` on `host` against fp32 on the reference host (None for fp32 on the reference)."""
    ref = result.settings["reference"]
    kind = "own-fp32" if host == ref else "ref-fp32"
    for c in result.comparisons:
        if (c["variant_id"] == v["variant_id"] and c["host"] == host and c["comparison"] == kind
                and c["ref_variant"] == "fp32"):
            return c
    return None


def gates_checked(result) -> list[str]:
    """The gates a verdict states: those named by --gate, else the decision gate; under decode none the tensor
    gate only against a tolerance the user set (the default 1e-5 fails float models across architectures), else
    none (the verdict is NO VERDICT, with the classes and the largest delta)."""
    named = list(result.settings.get("gates") or [])
    if named:
        return named
    compared = any(c.get("decisions_compared", True) for c in result.comparisons)
    if compared or not result.comparisons:
        return ["decision"]
    s = result.settings
    return ["tensor"] if tolerance_set(s.get("atol", DEFAULT_ATOL), s.get("rtol", DEFAULT_RTOL)) else []


def variant_gate(result, v: dict, gates: list[str]) -> tuple[bool, str]:
    """(passed, what failed) of one variant under `gates` (quantbench.analysis.gates' verdicts)."""
    comps = [c for c in result.comparisons if c["variant_id"] == v["variant_id"]]
    fails = []
    if "classes" in gates and len(v["classes"]) > 1:
        fails.append(f"classes: {len(v['classes'])} classes")
    if "tensor" in gates:
        n = sum(1 for c in comps if not c["tensor_gate"]["passed"])
        if n:
            fails.append(f"tensor: {n} of {len(comps)} comparisons beyond atol/rtol")
    if "decision" in gates:
        dc = [c for c in comps if c.get("decisions_compared", True)]
        n = sum(1 for c in dc if not c["decision_passed"])
        if n:
            fails.append(f"decision: {n} of {len(dc)} comparisons over {budget_words(result.settings['budget'])}")
    return not fails, "; ".join(fails)


def identical_outputs(result) -> dict:
    """{variant_id: name of an earlier variant of the same model with byte-identical outputs on every host}."""
    out = {}
    sig = {}
    for v in result.variants:
        key = (v["model"], tuple(sorted((h, c["digest"]) for c in v["classes"] for h in c["hosts"])))
        if key in sig:
            out[v["variant_id"]] = sig[key]
        else:
            sig[key] = v["variant"]
    return out


def _flips_part(result, v: dict, hosts: list) -> tuple[str, list]:
    """(the flips vs fp32 per host, in numbers; the flip counts): hosts with the same figures named together."""
    s = result.settings
    per = {h: c for h in hosts if (c := _vs_fp32(result, v, h)) is not None}
    if not per:
        if v["variant"] == "fp32":
            return "the reference itself: no other host to compare fp32 with", []
        if not any(x["model"] == v["model"] and x["variant"] == "fp32" for x in result.variants):
            return (f"no fp32 comparison was possible (no fp32 model given: pass {flag_mark('fp32')} FILE); flips count against "
                    f"the same file on {s['reference']}"), []
        return "no comparison against fp32", []
    groups: dict = {}
    for h, c in per.items():
        groups.setdefault((c["flips"], c["images_disagree"], c["fixtures"]), []).append(h)
    rows = [(fl, ", ".join(hs), f"{img} of {nfx} images disagree" if fl else f"{nfx} images compared, none disagrees")
            for (fl, img, nfx), hs in groups.items()]
    against = f"vs fp32 (fp32 on {s['reference']})"
    if len(rows) == 1:
        fl, where, seen = rows[0]
        text = f"{fl} decision flip{'s' if fl != 1 else ''} {against} on {where}, {seen}"
    else:
        text = f"decision flips {against}: " + "; ".join(f"{fl} on {where}, {seen}" for fl, where, seen in rows)
    return f"{text} (budget {s['budget']})", [c["flips"] for c in per.values()]


def _hosts_part(result, v: dict) -> tuple[str, bool | None]:
    """(whether the hosts serve identical decisions, in words; True when some host serves other decisions than the
    reference host, None with no other host) from the comparisons against the same variant on the reference."""
    ref = result.settings["reference"]
    if v["variant"] in (getattr(result, "cannot_run", {}) or {}).get(ref, {}):
        return f"the hosts' decisions are not compared with each other (the reference host {ref} cannot run it)", None
    same = [c for c in result.comparisons if c["variant_id"] == v["variant_id"] and c["ref_host"] == ref
            and c["host"] != ref and c["ref_variant"] == v["variant"] and c.get("decisions_compared", True)]
    if not same:
        return "one host", None
    differ = [c for c in same if c["flips"]]
    if not differ:
        return "the hosts serve identical decisions", False
    return "the hosts serve different decisions: " + ", ".join(
        f"{c['host']} vs {ref} {c['flips']} flip{'s' if c['flips'] != 1 else ''} on {c['images_disagree']} "
        f"image{'s' if c['images_disagree'] != 1 else ''}" for c in differ), True


def _no_gate(result, v: dict) -> str:
    """What a decode-none verdict without a gate can say: the largest delta against fp32, and how to get a gate."""
    deltas = [c["tensor_gate"]["max_abs"] for c in result.comparisons
              if c["variant_id"] == v["variant_id"] and c["comparison"] != "ref-same" and c["tensor_gate"]["elements"]]
    most = f"largest |delta| vs fp32 {max(deltas):.3g}; " if deltas else ""
    return (f"{most}no gate: no decoder and no tolerance set (give an atol/rtol for the tensor gate, a gate, or a "
            "decoder for one)")


def requirement_text(result, v: dict) -> str:
    """' Deployment requirement: K=V (...)' of a variant whose recipe requires session config entries, naming the
    hosts that could not apply it ('' without one)."""
    req = v.get("session_requirements") or {}
    if not req:
        return ""
    refused = [h for h, by in sorted((getattr(result, "cannot_run", {}) or {}).items()) if v["variant"] in by]
    where = f"; NOT RUN on {', '.join(refused)} (the host cannot apply it)" if refused else ""
    return (f" Deployment requirement: session config {entries_text(req)} (every host ran it with these entries; "
            f"a host must set them to get these results{where}).")


def requirement_lines(result) -> list[str]:
    """The "Deployment requirements" section: per variant, the session config entries a host must set to get its
    results (none: the host's own session); no section when no variant has one."""
    if not any(v.get("session_requirements") for v in result.variants):
        return []
    lines = ["### Deployment requirements", ""]
    for v in result.variants:
        req = v.get("session_requirements") or {}
        lines.append(f"- **{v['variant']}**: " + (f"session config {entries_text(req)}, applied in every run of it"
                                                 if req else "none (each host's own session)"))
    return lines + [""]


def _never_run_gate(result) -> str:
    """The gate part of a variant no host ran: a gate named (--gate) fails on it (nothing passed), else none checks it."""
    named = list(result.settings.get("gates") or [])
    return f"gate {', '.join(named)}: FAIL (never run)" if named else "no gate checks it"


def class_verdict(v: dict, refused: list | None = None) -> str:
    """A variant's classes of bytes in the verdict: "one class of bytes on the whole fleet" (every host computes the
    same bytes, so a device is commissioned by a hash check; with hosts that could not run it, `refused`, on the
    hosts that ran it), or how many classes, which hosts, and why: the fingerprint features that separate them
    (dispatch-read ISA flags first)."""
    n = len(v["classes"])
    if n == 1 and refused:
        return f"one class of bytes on the hosts that ran it ({', '.join(refused)} could not)"
    if n == 1:
        return "one class of bytes on the whole fleet"
    hosts = " | ".join(f"{c['label']}: {', '.join(c['hosts'])}" for c in v["classes"])
    why = _separated_by(v) if n > 1 and "separating_features" in v else ""
    return f"{n} classes of bytes ({hosts})" + (f", {why}" if why else "")


def _separated_by(v: dict) -> str:
    """What separates a variant's classes, shortly: the smallest separating features, then how many others differ."""
    sep = v["separating_features"]
    if not sep:
        return "no fingerprint feature tells them apart"
    shown = v.get("separation") or {"features": sep, "others": 0}
    feats = list(shown.get("features") or sep)
    others = int(shown.get("others") or 0) + max(0, len(feats) - 3)
    return f"separated by {', '.join(feats[:3])}" + (f" and {others} other feature(s)" if others else "")


def verdict_lines(result) -> list[str]:
    """One line per variant opening with its answer (gates.ship_verdict: SHIP, SHIP WITH CARE, DO NOT SHIP, NOT RUN), then
    why in numbers: flips vs fp32 per host against the budget, whether the hosts serve identical decisions, the
    classes of bytes, the gate."""
    s = result.settings
    hosts = list(result.hosts)
    gates = gates_checked(result)
    gate_name = ", ".join(f"{g} (budget {s['budget']})" if g == "decision" else g for g in gates)
    same_out = identical_outputs(result)
    multi = len({v["model"] for v in result.variants}) > 1
    lines = []
    for v in result.variants:
        name = f"{v['model']} / {v['variant']}" if multi else v["variant"]
        n = len(v["classes"])
        cls = class_verdict(v, [h for h, by in sorted((getattr(result, "cannot_run", {}) or {}).items())
                                if v["variant"] in by])
        compared = kind_of(v["decode"]["kind"]).decides
        if n == 0:
            counts, differ, why = [], None, ["no host's runtime can run it (named under the classes)"]
        elif compared:
            flips, counts = _flips_part(result, v, hosts)
            agree, differ = _hosts_part(result, v)
            why = [flips, agree, cls]
        else:
            counts, differ, why = [], None, ["decisions not compared (decode none)", cls]
        ok, failed = variant_gate(result, v, gates)
        answer = ship_verdict(ok, counts, differ, n, compared, gated=bool(gates))
        gate = (_never_run_gate(result) if n == 0 else f"gate {gate_name}: " + ("pass" if ok else f"FAIL ({failed})")
                if gates else _no_gate(result, v))
        extra = f" Outputs byte-identical to **{same_out[v['variant_id']]}** on every host and fixture." \
            if v["variant_id"] in same_out else ""
        lines.append(f"- **{answer}** {name}: {'; '.join([*why, gate])}.{extra}{requirement_text(result, v)}")
        lines += accuracysection.provider_flags(v, name)
    for d in s.get("duplicates") or []:
        name = f"{d['model']} / {d['name']}" if multi else d["name"]
        lines.append(f"- **{name}**: duplicate of **{d['duplicate_of']}** (the same model: identical semantic "
                     f"hash), run and analysed once; every figure for {d['duplicate_of']} holds for it.")
    return lines
