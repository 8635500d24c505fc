"""The equiv section's accuracy tables: each variant's scores per host against fp32, and the accuracy
differences between hosts.
"""

from __future__ import annotations

from quantbench.textfmt import md_table


# --------------------------------------------------------------------------- accuracy


def _acc_cell(sc: dict | None, base: dict | None) -> str:
    if sc is None:
        return "-"
    if sc["metric"] == "top-1":
        text = f"{sc['value']:.3f} ({sc['correct']}/{sc['images']})"
    elif sc["metric"] == "text":
        cer = "-" if sc["cer"] is None else f"{sc['cer']:.3f}"
        text = f"{sc['value']:.3f} ({sc['correct']}/{sc['images']}), CER {cer}"
    else:
        text = "-" if sc["value"] is None else f"{sc['value']:.3f} / {sc['ap50_95']:.3f}"
    if base is not None and base is not sc and sc["value"] is not None and base["value"] is not None:
        text += f" ({sc['value'] - base['value']:+.3f})"
    return text


def provider_flags(v: dict, name: str) -> list[str]:
    """The flagged provider findings of one variant (analysis.providers): a requested execution provider that was
    not available or ran no node on a host. The verdict states them; the run went on."""
    return [f"  - **FLAGGED** {name} on {h}: requested {f}" for h, p in (v.get("providers") or {}).items()
            for f in (p or {}).get("findings", [])]


def accuracy_lines(result, acc: dict | None) -> list[str]:
    lines = ["### Accuracy against the labels", ""]
    if acc is None:
        return lines + ["Accuracy: not computed (no labels were given to the report).", ""]
    multi = len(acc) > 1
    for model, a in acc.items():
        pl = a["plan"]
        who = f" for model {model}" if multi else ""
        if isinstance(pl, str):
            lines += [f"Accuracy{who}: not computed ({pl}).", ""]
            continue
        if not a["scores"]:
            lines += [f"Accuracy{who}: not computed (no decisions were decoded).", ""]
            continue
        hosts = list(result.hosts)
        if pl.metric == "text":
            lines.append(f"Text accuracy{who} on {len(pl.fixtures)} labelled images (exact match of the decoded "
                         "string with each image's \"text\" label; in brackets: matches/images; CER: character error "
                         "rate, edits per label character; then the exact-match change against fp32 on the same host).")
        elif pl.metric == "top-1":
            lines.append(f"Top-1 accuracy{who} on {len(pl.fixtures)} labelled images (argmax class against each "
                         "image's label; in brackets: correct/images, then the change against fp32 on the same host).")
        else:
            lines.append(f"AP50 / AP50:95{who} on {len(pl.fixtures)} images (pycocotools COCOeval over every decoded "
                         "decision ranked by score, boxes mapped back to image pixels; in brackets: the AP50 change "
                         "against fp32 on the same host).")
        if pl.note:
            lines.append(f"Note: {pl.note}.")
        lines.append("")
        rows = []
        names = [v["variant"] for v in result.variants if v["model"] == model]
        for name in names:
            rows.append([name] + [_acc_cell(a["scores"].get((name, h)), a["scores"].get(("fp32", h))) for h in hosts])
        lines += md_table(["variant", *hosts], rows)
        lines.append("")
        lines += difference_lines(result, a, names, hosts)
    return lines


def _difference_text(d: dict) -> str:
    """One accuracy difference with its interval; 'no measurable difference' when the interval holds zero."""
    (va, ha), (vb, hb) = d["a"], d["b"]
    who = f"{va}: {ha} vs {hb}" if va == vb else f"{va} vs {vb} on {ha}"
    text = (f"{who} {d['figure']} {d['diff']:+.3f} (95% interval [{d['low']:+.3f}, {d['high']:+.3f}] over "
            f"{d['images']} images)")
    if d["low"] <= 0 <= d["high"]:
        return text + ": no measurable difference"
    first = (d["diff"] > 0) == d["higher_better"]
    nearer = (ha if first else hb) if va == vb else (va if first else vb)
    return text + f": {nearer} nearer the labels"


def difference_lines(result, a: dict, names: list, hosts: list) -> list[str]:
    """Accuracy differences between hosts (and against fp32 on one host) with their paired bootstrap interval
    (quantbench.analysis.accuracy.differences); without any (no resamples), the plain AP difference."""
    ref = result.settings["reference"]
    diffs = a.get("differences") or []
    if diffs:
        between = [d for d in diffs if d["a"][0] == d["b"][0]]
        vs_fp32 = [d for d in diffs if d["a"][0] != d["b"][0]]
        out = []
        if between:
            out.append("Between hosts (paired bootstrap over the images: 1000 resamples, seed 0): "
                       + "; ".join(map(_difference_text, between)) + ".")
        if vs_fp32:
            out.append("Against fp32 on the same host: " + "; ".join(map(_difference_text, vs_fp32)) + ".")
        return [*out, ""]
    plain = []
    for name in names:
        base = a["scores"].get((name, ref))
        for h in hosts:
            sc = a["scores"].get((name, h))
            if h == ref or sc is None or base is None or sc["value"] is None or base["value"] is None:
                continue
            diff = sc["value"] - base["value"]
            plain.append(f"{name}: {h} vs {ref} " + ("no difference" if diff == 0 else
                                                     f"{diff:+.4f} (AP is not a mean over images: no interval)"))
    if plain:
        return ["Between hosts: " + "; ".join(plain) + ".", ""]
    return []
