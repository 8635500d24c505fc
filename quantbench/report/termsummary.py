"""The terminal summary of an equiv result: what `quantbench equiv` prints (head, classes, flips, gates), and
the separation and prediction texts the report shares with it.
"""

from __future__ import annotations

from quantbench.analysis import classes
from quantbench.analysis.decode import IOU_SHIFT, DecoderKind, kind_of
from quantbench.report import charts, verdict
from quantbench.textfmt import text_table


def prediction_text(r: dict) -> str:
    if r["joins"]:
        return f"with class {r['joins']} ({', '.join(r['like'])})"
    return "apart from every measured host" + (f" (one class with {', '.join(r['peers'])})" if r["peers"] else "")


def runtime_lines(result) -> list[str]:
    """Hosts whose runtime does not start on their CPU, and per variant the hosts that differ in their
    onnxruntime version only (quantbench.analysis.classes.version_findings)."""
    out = [f"{h}: {why}" for h, why in sorted(getattr(result, "not_started", {}).items())]
    out += [f"{h} cannot run {name}: {why}" for h, by in sorted(getattr(result, "cannot_run", {}).items())
            for name, why in by.items()]
    for v in result.variants:
        out += [f"{v['variant']}: {classes.version_text(f)}" for f in v.get("versions", [])]
    return out


# --------------------------------------------------------------------------- terminal summary


def equiv_summary_text(result) -> str:
    """The ten-second summary: classes per variant, flips per variant and host, gates."""
    compared = [c for c in result.comparisons if c.get("decisions_compared", True)]
    out = _summary_head(result) + [""] + _summary_classes(result) + [""]
    out += _summary_flips(result, compared) + _summary_concealed_and_margins(result, compared) + [""]
    return "\n".join(out + _summary_gates(result, compared))


def _summary_head(result) -> list[str]:
    """The run line (hosts, fixtures, decoders) and the verdict."""
    ref = result.settings["reference"]
    kinds = sorted({f"plug-in {k}" if kind_of(k := v["decode"]["kind"]).plugin else k for v in result.variants})
    thr = sorted({kind_of(v["decode"]["kind"]).rule(v["decode"]["threshold"]) for v in result.variants
                  if kind_of(v["decode"]["kind"]).decides and not kind_of(v["decode"]["kind"]).plugin})  # a plug-in decides its own
    nfx = sorted({v["fixtures"] for v in result.variants})
    head = (f"equiv {result.equiv_id[:12]}: hosts {', '.join(result.hosts)} (reference {ref}); "
            f"{'/'.join(map(str, nfx))} fixtures; decode {', '.join(kinds)}" + "".join(f", {t}" for t in thr))
    return [head, "", "Verdict"] + [ln.replace("**", "") for ln in verdict.verdict_lines(result)]


def _summary_classes(result) -> list[str]:
    """Equivalence classes per variant, with the features separating them, and each class's distance to the reference."""
    out = ["Equivalence classes (byte-identical outputs over every fixture)"]
    rows = [("model", "variant", "classes", "separated by")]
    for v in result.variants:
        sep_s = separation_text(v, "(no feature splits them all: per pair below)" if named_pairs(v)
                                else "(not by fingerprint)", values=True)
        rows.append((v["model"], v["variant"], " | ".join(f"{c['label']}: {','.join(c['hosts'])}" for c in v["classes"]),
                     sep_s))
    out += text_table(rows[0], rows[1:]).splitlines() + runtime_lines(result)
    out += [f"{v['variant']}: no single feature the arithmetic reads splits its {len(v['classes'])} classes; nearest pair "
            f"{pair_text(v['pairs'][0])} (every pair: the report)" for v in result.variants if named_pairs(v)]
    out += [f"PREDICTED (not measured, no gate) {r['variant']}: {r['host']} {prediction_text(r)}"
            for r in getattr(result, "predicted", [])]
    dists = [(v, d) for v in result.variants for d in v["distances"]]
    if dists:
        out.append("")
        out.append("Distance to the reference class (max |d|, mean |d|; remaining bits: mean / min over every element "
                   "of every fixture, 0 where an element changed sign or binade, as near zero)")
        rows = [("variant", "class", "output", "max|d|", "mean|d|", "bits")]
        for v, d in dists:
            bits = "-" if d["bits_mean"] is None else f"{d['bits_mean']:.1f}/{d['bits_min']}"
            rows.append((v["variant"], f"{d['class']} ({d['host']})", d["output"], f"{d['max_abs']:.3g}",
                         f"{d['mean_abs']:.3g}", bits))
        out += text_table(rows[0], rows[1:]).splitlines()
    return out


def _summary_flips(result, compared: list[dict]) -> list[str]:
    """Which models' decisions were not compared, and the flips per variant and host against each reference."""
    ref = result.settings["reference"]
    out = []
    undecoded = {v["model"]: v["decode"].get("note", "") for v in result.variants
                 if not kind_of(v["decode"]["kind"]).decides}
    for model, note in sorted(undecoded.items()):
        out.append(f"decisions: not compared (decode none{': ' + note if note else ''})"
                   + (f" for model {model}" if len(undecoded) < len({v['model'] for v in result.variants}) else ""))
    if compared or not result.comparisons:
        out.append("Decision flips (flips, images disagreeing, totals ref->cand; ! = totals hide the flips)")
        cells: dict = {}
        for c in compared:
            cell = (f"{c['flips']} ({c['images_disagree']} img) {c['ref_total']}->{c['total']}"
                    + (" !" if c["concealed"] else ""))
            cells[(c["model"], c["variant"], c["host"], c["comparison"])] = cell
        rows = [("model", "variant", "host", "vs own fp32", f"vs {ref} fp32", f"vs {ref} same variant")]
        for v in result.variants:
            if v["model"] in undecoded:
                continue
            for h in result.hosts:
                k = (v["model"], v["variant"], h)
                rows.append((v["model"], v["variant"], h, cells.get(k + ("own-fp32",), "-"),
                             cells.get(k + ("ref-fp32",), "-"), cells.get(k + ("ref-same",), "-")))
        out += text_table(rows[0], rows[1:]).splitlines()
        if any(c["comparison"] == "ref-same" and matches_boxes(c, result) for c in compared):
            out.append("(flips are counted per pair of runs, boxes matched by IoU in each: not transitive, so a "
                       "host's flips vs the reference's variant are not the difference of the two hosts' flips vs fp32)")
    return out


def matches_boxes(comparison: dict, result) -> bool:
    """Whether a comparison's decisions are boxes (or regions) matched by IoU: a decoder with box shifts that serves
    more than one decision per image (a classifier's or a recogniser's one decision matches nothing)."""
    kinds = {v["variant_id"]: kind_of(v["decode"]["kind"]) for v in result.variants}
    k = kinds.get(comparison["variant_id"])
    return k is not None and not k.one_decision and "box-shift" in k.flips


def _summary_concealed_and_margins(result, compared: list[dict]) -> list[str]:
    """Where equal totals conceal flips, and how close to the threshold the flipped fp32 scores were."""
    out = []
    conceal = [c for c in result.comparisons if c["concealed"]]
    if conceal:
        c = max(conceal, key=lambda c: c["flips"])
        out.append(f"! {len(conceal)} comparison(s) where equal totals conceal flips, e.g. {c['variant']} on {c['host']}: "
                   f"{c['ref_total']} vs {c['total']} decisions hid {c['flips']} changed decisions")
    return out + _margin_lines(result, compared)


def _margin_lines(result, compared: list[dict]) -> list[str]:
    """How close to its decision boundary each flip against fp32 was, worded as its decoder defines the margin,
    and (threshold-map) how many regions changed shape instead, which no probability measures."""
    out = []
    against = [c for c in compared if c["comparison"] != "ref-same"]
    decode_of = {v["variant_id"]: v["decode"] for v in result.variants}
    kinds = {decode_of[c["variant_id"]]["kind"] for c in against if c["variant_id"] in decode_of}
    margins = [c["margins"] for c in against if c["margins"].get("band")]
    if margins:
        lo = min(m["band"][0] for m in margins)
        hi = max(m["band"][1] for m in margins)
        hw = max(m["half_width"] for m in margins)
        if all(m["threshold"] is not None for m in margins):
            k = kind_of(next(iter(kinds))) if len(kinds) == 1 else DecoderKind("")   # several: the plain words
            out.append(f"{k.band_subject} had {k.band_words} in [{lo:.4g}, {hi:.4g}] "
                       f"(within {hw:.3g} of the threshold)")
        else:   # worded as each decoder defines its margin (a plug-in's is its own, not a top-1/top-2 gap)
            axes = sorted({charts.margin_axis(decode_of[c["variant_id"]]) for c in against
                           if c["margins"].get("band") and c["variant_id"] in decode_of})
            out.append(f"every flip against fp32 was within {hw:.3g} of its decision boundary "
                       f"({'; '.join(axes) or 'fp32 margin'})")
    shapes = sum(c.get("by_kind", {}).get("box-shift", 0) for c in against
                 if c["variant_id"] in decode_of and kind_of(decode_of[c["variant_id"]]["kind"]).margin_flips)
    if shapes:
        out.append(f"{shapes} region flip(s) against fp32 changed a region's shape (IoU below {IOU_SHIFT:g} with its "
                   "fp32 region), not whether it is there: no probability measures those")
    shifts = sum(c.get("by_kind", {}).get("box-shift", 0) for c in against
                 if c["variant_id"] in decode_of and not kind_of(decode_of[c["variant_id"]]["kind"]).margin_flips)
    if shifts:
        out.append(f"{shifts} flip(s) against fp32 are box shifts (same class, IoU below {IOU_SHIFT:g} with the fp32 "
                   "box), not threshold crossings: no fp32 margin is given for them")
    return out


def _summary_gates(result, compared: list[dict]) -> list[str]:
    """The tensor and decision gates over every comparison, and the first comparisons where they disagree."""
    s = result.settings
    n = len(result.comparisons)
    t_fail = sum(1 for c in result.comparisons if not c["tensor_gate"]["passed"])
    d_fail = sum(1 for c in compared if not c["decision_passed"])
    dis = [c for c in result.comparisons if c["gates_disagree"]]
    tensor = f"Gates over {n} comparisons: tensor (atol {s['atol']:g}, rtol {s['rtol']:g}) fails {t_fail}; "
    if not compared and result.comparisons:
        out = [tensor + "decision gate not applicable (decode none)"]
    else:
        na = f" ({n - len(compared)} not applicable: decode none)" if len(compared) < n else ""
        out = [tensor + f"decision (flips <= {s['budget']}) fails {d_fail}{na}; they disagree on {len(dis)}"]
    for c in dis[:6]:
        out.append(f"  {c['variant']} on {c['host']} vs {c['ref_variant']} on {c['ref_host']}: {c['gates_disagree']} "
                   f"({c['tensor_gate']['failing']} of {c['tensor_gate']['elements']} elements beyond tolerance, "
                   f"{c['flips']} flips)")
    if len(dis) > 6:
        out.append(f"  ... {len(dis) - 6} more in the report")
    return out


def _short(value, n: int = 24) -> str:
    """`value` in at most about `n` characters, cut at a word boundary (never mid-word)."""
    text = str(value)
    if len(text) <= n:
        return text
    cut = text[:n - 3].rsplit(" ", 1)[0] if " " in text[:n - 3] else text[:n - 3]
    return cut.rstrip(" (,;/") + "..."


def separation_text(v: dict, none: str, values: bool = False) -> str:
    """What separates a variant's classes, in words: the features (dispatch-read ISA flags first; with `values`,
    the smallest set's per class), "and N others differ", and the flags the kernels used (qemu evidence).
    `none`: the words for classes no fingerprint feature tells apart."""
    sep = v["separating_features"]
    if sep == []:
        return "-"
    if sep is None:
        return none
    shown = v.get("separation") or {"features": sep, "others": 0, "kernels": []}

    def named(k):
        if not values or k not in sep:
            return k
        return f"{k} ({' / '.join(_distinct_short([v['feature_values'][c['hosts'][0]].get(k) for c in v['classes']]))})"
    text = ", ".join(named(k) for k in shown["features"])
    if shown["others"]:
        text += f" and {shown['others']} other{'s' if shown['others'] > 1 else ''} differ{'' if shown['others'] > 1 else 's'}"
    used = "; ".join(f"{k['feature']} ({', '.join(k['families'])} on {', '.join(k['hosts'])}"
                     f"{'' if k.get('separates', True) else ': not what tells the classes apart'})"
                     for k in shown["kernels"])
    return text + (f"; kernels used (qemu evidence): {used}" if used else "")


def named_pairs(v: dict) -> bool:
    """Whether a variant's classes, split by no single feature, have a per-pair separation to show."""
    return bool(v.get("pairs")) and classes.needs_pairs(v["separating_features"], len(v["classes"]))


def features_text(feats: list, most: int) -> str:
    """The first `most` features, then 'and N others' ('not by fingerprint' for none)."""
    text = ", ".join(feats[:most]) if feats else "not by fingerprint"
    if len(feats) > most:
        text += f" and {len(feats) - most} other{'s' if len(feats) - most > 1 else ''}"
    return text


def pair_text(row: dict, most: int = 3) -> str:
    """One pair of classes in words: 'B/D (x86-avx2 / x86-avx512, 11 fixtures agree): isa:avx512f, isa:avx512bw and
    2 others; u8s8_gemm: MlasGemmU8S8KernelAvx2 / MlasGemmU8S8KernelAvx512Core (dispatch)'."""
    (a, b), (ha, hb) = row["classes"], row["hosts"]
    agree = "" if row.get("agree") is None else f", {row['agree']} fixture{'s' if row['agree'] != 1 else ''} agree"
    text = features_text(row["features"], most)
    kernels = row.get("kernels") or {}
    if kernels:
        text += "; " + "; ".join(f"{ka.split(': ')[0]}: {ka.split(': ', 1)[1]} / {kb.split(': ', 1)[1]}"
                                 for ka, kb in zip(kernels[a], kernels[b])) + " (dispatch)"
    paths = row.get("int8_path") or {}
    if paths:
        text += f"; int8 {paths[a]} / {paths[b]}"
    evidence = row.get("evidence") or {}
    if evidence:
        text += "; kernels used (qemu evidence): " + "; ".join(f"{c} {', '.join(f)}" for c, f in evidence.items())
    return f"{a}/{b} ({ha} / {hb}{agree}): {text}"


def _distinct_short(values: list, n: int = 24) -> list[str]:
    """Each value shortened (_short), or all of them in full when shortening would make different values read alike."""
    short = [_short(x, n) for x in values]
    return short if len(set(short)) == len({str(x) for x in values}) else [str(x) for x in values]
