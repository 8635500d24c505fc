"""The `equiv` section of the report, from an EquivResult: its tables (hosts, providers, classes, predicted
tiers, distances, decisions, gates, margins), plots and gallery, and everything an equiv analysis leaves
behind (publish_equiv).
"""

from __future__ import annotations

import os
from pathlib import Path

from quantbench.analysis.accuracy import report_accuracy
from quantbench.analysis.decisions import band_labels
from quantbench.analysis.equiv import as_json, write_tables
from quantbench.analysis.gates import budget_words
from quantbench.store.resultpaths import RESULTS_DIR
from quantbench.errors import render_params
from quantbench.fsutil import atomic_write_text
from quantbench.hosts.deploy import describe as describe_session
from quantbench.runs.placement import summary_text as placement_text
from quantbench.report import accuracysection, charts, document, gallerysection, termsummary, verdict
from quantbench.textfmt import md_section, md_table, num
from quantbench.inputs.variantdir import DEMO_NOTE, is_demo

SECTION = document.registered("equiv")


# --------------------------------------------------------------------------- the equiv section


def render_equiv(result, results_dir: str | os.PathLike = RESULTS_DIR, plots: bool = True, *,
                 accuracy: dict | None = None, tables_root=None, shows: list | None = None,
                 render=render_params) -> tuple[str, list[Path]]:
    """The equiv section's Markdown and the files written (plots, gallery thumbnails).

    `accuracy`: quantbench.analysis.accuracy.accuracy_table's answer (None: no labels given);
    `tables_root`: where the fixtures table is (the gallery draws the input tensors), default
    results_dir/tables; `shows`: gallery_shows' answer (None: found here); `render`: how a parameter a line points
    at is named (errors.render_params: its name; the command line passes its flag's).
    """
    s = result.settings
    rdir = Path(results_dir)
    tables_root = Path(tables_root) if tables_root is not None else rdir / "tables"
    written: list[Path] = []
    lines = ["## Equivalence and decisions (`quantbench equiv`)", ""]
    if is_demo(v.get("path", "") for v in s.get("variants", [])):
        lines += [f"> {DEMO_NOTE}", ""]
    lines += ["### Verdict", ""]
    lines += verdict.verdict_lines(result)
    lines.append("")
    lines += verdict.requirement_lines(result)
    lines.append(f"Analysis `{result.equiv_id[:12]}`: hosts {', '.join(result.hosts)} (reference "
                 f"**{s['reference']}**); tensor gate atol {s['atol']:g}, rtol {s['rtol']:g}; decision budget "
                 f"{budget_words(s['budget'])}. Flips count against fp32 on the reference host; the gate is "
                 f"{', '.join(verdict.gates_checked(result))} over every comparison of the variant.")
    lines.append("")
    lines += accuracysection.accuracy_lines(result, accuracy)
    lines += hosts_lines(result)
    if plots:
        lines += charts.embed_plot(charts.plot_class_map, result, rdir, charts.CLASS_MAP, "class map", written)
    lines += classes_lines(result)
    lines += pairs_lines(result)
    lines += confirmed_lines(result)
    lines += predicted_lines(result)
    lines += providers_lines(result)
    lines += distance_lines(result)
    lines += decisions_lines(result)
    lines += gallerysection.gallery_lines(result, rdir, tables_root, written, shows=shows)
    lines += gates_lines(result)
    lines += margins_lines(result, rdir, plots, written)
    lines.append("Tables: `results/tables/classes`, `results/tables/decisions`, `results/tables/flips`.")
    return render("\n".join(lines) + "\n"), written


def hosts_lines(result) -> list[str]:
    split: dict = {}
    for h, i in result.hosts.items():
        if i.get("split_from"):
            split.setdefault(i["split_from"], []).append(h)
    said = {name: ", ".join(f"{h} ({result.hosts[h]['cpu']})" for h in hs) for name, hs in split.items()}
    intro = " ".join(f"Imported host **{name}** ran on {len(hs)} CPU models (its runners differ), so its results "
                     f"are {len(hs)} hosts, one per fingerprint: {said[name]}." for name, hs in split.items()) or None
    return md_section("Hosts", intro, ["host", "kind", "runs as", "arch", "cpu", "onnxruntime", "session",
                                       "fingerprint"],
                      [[h, i["kind"], i.get("cpu_mechanism") or "-", i["arch"], i["cpu"], i["ort_version"],
                        describe_session(i["session"]) if i.get("session") else "-", f"`{i['fingerprint_id'][:12]}`"]
                       for h, i in result.hosts.items()])


def providers_lines(result) -> list[str]:
    """Which execution provider ran how many nodes of which op types, per variant and host (read from each
    run's profile, not from the session object), and what was flagged."""
    rows = [[v["model"], v["variant"], h, ", ".join(p.get("requested", [])), placement_text(p.get("placement", {})),
             "; ".join(p.get("findings", [])) or "-"]
            for v in result.variants for h, p in (v.get("providers") or {}).items() if p]
    if not rows:
        return []
    return md_section("Execution providers (resolved, not requested)",
                      "Nodes per provider and op type, read back from each host's run (its profile).",
                      ["model", "variant", "host", "requested", "ran", "flagged"], rows)


def classes_lines(result) -> list[str]:
    rows = []
    for v in result.variants:
        cls = "; ".join(f"{c['label']}: {', '.join(h + (' (inherited)' if h in c.get('inherited', ()) else '') for h in c['hosts'])}"
                        for c in v["classes"])
        sep_s = termsummary.separation_text(v, "not separable by the fingerprint")
        agree = ", ".join(f"{a}~{b} {n}/{v['fixtures']}" for a, b, n in
                          ((x["a"], x["b"], x["fixtures_agree"]) for x in v["agreement"]))
        flagged = ", ".join(f"{h} (provider fell back)" for h, p in (v.get("providers") or {}).items()
                            if (p or {}).get("findings")) or "-"
        rows.append([v["model"], v["variant"], v["fixtures"], cls, sep_s, agree or "-", flagged])
    return md_section("Equivalence classes",
                      "Hosts grouped by identical output hashes over every fixture; separated by: the ISA flags "
                      "onnxruntime's kernel dispatch reads that differ between the classes (in MLAS's order), then "
                      "the rest of the smallest set of fingerprint features whose values tell the classes apart, "
                      "how many other features differ, and the flags the kernels used where qemu kernel evidence "
                      "(`localize --evidence`) was taken; flagged: a host whose requested execution provider was not available "
                      "or ran no node.",
                      ["model", "variant", "fixtures", "classes", "separated by", "fixtures agreeing (pairs)",
                       "flagged"], rows) + [f"- {line}" for line in termsummary.runtime_lines(result)] + ([""] if termsummary.runtime_lines(result) else [])


def pairs_lines(result) -> list[str]:
    """Per pair of classes, what tells them apart, for the variants no single feature splits (nearest pair first)."""
    rows = []
    for v in result.variants:
        if not termsummary.named_pairs(v):
            continue
        for r in v["pairs"]:
            (a, b), (ha, hb) = r["classes"], r["hosts"]
            k = r.get("kernels") or {}
            paths = r.get("int8_path") or {}
            kernels = "; ".join([f"{a}: {', '.join(k[a])}; {b}: {', '.join(k[b])}"] if k else []
                                + [f"int8 {c}: {why}" for c, why in paths.items()]) or "-"
            evidence = "; ".join(f"{c}: {', '.join(f)}" for c, f in (r.get("evidence") or {}).items()) or "-"
            rows.append([v["model"], v["variant"], f"{a}/{b}", f"{ha} / {hb}", "-" if r.get("agree") is None
                         else f"{r['agree']}/{v['fixtures']}", termsummary.features_text(r["features"], 6),
                         kernels, evidence])
    if not rows:
        return []
    return md_section("Separation per pair of classes",
                      "Where no single fingerprint feature splits every class of a variant: per pair of classes "
                      "(nearest first: most fixtures agreeing between their first hosts), the features on which no "
                      "host of one class has a value a host of the other has; the kernels onnxruntime's x86 dispatch "
                      "chose differently on the pair's hosts for the routines the variant's graph uses (and, for an "
                      "integer variant, the U8S8 path each class's features select where they differ); and the "
                      "instruction families the kernels used where qemu kernel evidence was taken.",
                      ["model", "variant", "pair", "hosts", "fixtures agreeing", "separated by",
                       "kernels (dispatch)", "kernels used (qemu evidence)"], rows)


def confirmed_lines(result) -> list[str]:
    """Hosts that ran only the confirming fixtures and inherited the rest (equiv's confirm), and the predictions
    those fixtures refuted (the host then ran in full)."""
    rows = [[h, v, f"inherited from {a}"] for h, vs in sorted(getattr(result, "inherited", {}).items())
            for v, a in vs.items()]
    rows += [[m["host"], m.get("variant") or m["variant_id"][:12], f"predicted with {m['anchor']}, differed: ran in full"]
             for m in getattr(result, "prediction_misses", [])]
    if not rows:
        return []
    return md_section("Confirmed on a few fixtures (inherited rows)",
                      "A host predicted by onnxruntime's kernel dispatch to share the class of a host run in full ran "
                      "only the fixtures that separated classes and those nearest the threshold; byte-identical "
                      "there, it inherited that host's other rows (outputs.inherited names it): its class holds on "
                      "the fixtures it ran, the others are not measured on it.",
                      ["host", "variant", "rows"], rows)


def predicted_lines(result) -> list[str]:
    """Tiers no machine in reach shows, each variant's predicted class: a section of its own, never a class."""
    rows = [[r["model"], r["variant"], r["host"], termsummary.prediction_text(r), "; ".join(r["deciding"]) or "-"]
            for r in getattr(result, "predicted", [])]
    notes = getattr(result, "predicted_notes", [])
    if not rows:
        return [f"- {n}" for n in notes] + ([""] if notes else [])
    return md_section("Predicted tiers (not measured)",
                      "PREDICTED, not measured: these tiers ran nowhere; no gate counts them. Each op of the variant's "
                      "optimized graph reaches MLAS kernels chosen by the tier's CPU features; a tier whose kernels "
                      "match a measured host's is predicted byte-identical to it. " + " ".join(notes),
                      ["model", "variant", "tier", "predicted", "decided by"], rows)


def distance_lines(result) -> list[str]:
    dist_rows = [[v["variant"], f"{d['class']} ({d['host']})", f"{d['ref_class']} ({d['ref_host']})", d["output"],
                  num(d["max_abs"]), num(d["mean_abs"]), num(d["bits_mean"]), num(d["bits_min"])]
                 for v in result.variants for d in v["distances"]]
    if not dist_rows:
        return []
    return md_section("Numeric distance between classes",
                      "Remaining precision: leading identical mantissa bits of binary32 (23 = equal; 0 when sign "
                      "or exponent differ); bits mean is over every element of every fixture, bits min the lowest "
                      "of them: a 0 there with a tiny max abs delta is an element that changed sign or binade near "
                      "zero, not a large error.",
                      ["variant", "class", "against", "output", "max abs delta", "mean abs delta", "bits mean",
                       "bits min"], dist_rows)


def decisions_lines(result) -> list[str]:
    lines = ["### Decisions against fp32", "",
             "Totals are the decisions served (reference -> candidate); **concealed** marks totals within one "
             "of each other while decisions flipped.", ""]
    rows = []
    compared = [c for c in result.comparisons if c.get("decisions_compared", True)]
    if len(compared) < len(result.comparisons):
        lines += ["Decisions not compared for model(s) "
                  f"{', '.join(sorted({c['model'] for c in result.comparisons if c not in compared}))} "
                  "(decode none): classes, distances and the tensor gate only.", ""]
    for c in compared:
        bk = c["by_kind"]
        m = c["margins"]
        band = "-" if not m.get("band") else f"[{m['band'][0]:.4g}, {m['band'][1]:.4g}]"
        rows.append([c["variant"], c["host"], f"{c['ref_variant']} on {c['ref_host']}", c["comparison"],
                     f"{c['ref_total']} -> {c['total']}", c["flips"],
                     f"{bk['threshold']}/{bk['class']}/{bk['box-shift']}" if "threshold" in bk else
                     f"{bk.get('text', 0)} text", f"{c['images_disagree']}/{c['fixtures']}",
                     "**concealed**" if c["concealed"] else "no", band])
    if rows:
        lines += md_table(["variant", "host", "against", "comparison", "totals", "flips", "thr/class/box",
                           "images disagree", "concealed", "fp32 band holding every flip"], rows)
        lines.append("")
        if any(c["comparison"] == "ref-same" and termsummary.matches_boxes(c, result) for c in compared):
            lines += ["Flips are counted per pair of runs, boxes matched by IoU in each, so they are not transitive: "
                      "a host's flips against the reference's same variant are not the difference of the two hosts' "
                      "flips against fp32. The fp32 band holds threshold and class flips only: a box shift crossed "
                      "no threshold.", ""]
    elif not result.comparisons:
        lines += ["Nothing compared: one host and the fp32 variant only.", ""]
    return lines


def gates_lines(result) -> list[str]:
    s = result.settings
    lines = ["### Two gates", "",
             f"Tensor gate: an element fails when |delta| > {s['atol']:g} and |delta| > {s['rtol']:g} x |ref| "
             f"(Polygraphy's rule). Decision gate: flips <= {s['budget']}.", ""]
    rows = [[c["variant"], c["host"], f"{c['ref_variant']} on {c['ref_host']}",
             "pass" if c["tensor_gate"]["passed"] else f"FAIL ({c['tensor_gate']['failing']}/{c['tensor_gate']['elements']})",
             num(c["tensor_gate"]["max_abs"]),
             "n/a (decode none)" if c["decision_passed"] is None else "pass" if c["decision_passed"] else f"FAIL ({c['flips']})",
             c["gates_disagree"] or "agree"] for c in result.comparisons]
    if rows:
        lines += md_table(["variant", "host", "against", "tensor gate", "max abs delta", "decision gate",
                           "disagreement"], rows)
    else:
        lines.append("No comparisons: nothing for the gates to judge.")
    lines.append("")
    return lines


def margins_lines(result, rdir: Path, plots: bool, written: list) -> list[str]:
    lines = ["### Margins", "",
             "Per variant and comparison kind, every flip counted once (a flip several hosts of one class show "
             "alike is one flip), by its fp32 decision's distance to the boundary: the score minus the threshold, "
             "or for a classifier without a threshold the top-1 minus top-2 probability.", ""]
    compared = [c for c in result.comparisons if c.get("decisions_compared", True)]
    if not compared:
        lines += ["Decisions not compared (decode none): no margins." if result.comparisons
                  else "Nothing compared: no margins.", ""]
        return lines
    flips = charts.distinct_flips(result)
    if not flips:
        n_img = max(c["fixtures"] for c in compared)
        lines += [f"No flips: {len(compared)} comparisons over {n_img} images each, every decision the same.", ""]
        return lines
    labels = band_labels()
    present = [b for b in labels if any(r["band"] == b for rs in flips.values() for r, _ in rs)]
    rows = []
    for v in result.variants:
        for kind in charts.COMPARISON_ORDER:
            rs = flips.get((v["model"], v["variant"], kind))
            if not rs:
                continue
            hosts = sorted({h for _, hs in rs for h in hs}, key=list(result.hosts).index)
            counts = [sum(1 for r, _ in rs if r["band"] == b) for b in present]
            rows.append([v["variant"], charts.KIND_TITLES[kind], ", ".join(hosts), len(rs), charts.margin_axis(v["decode"]),
                         *counts])
    lines += md_table(["variant", "comparison", "hosts", "flips", "distance measured", *[f"|d| in {b}" for b in present]],
                      rows)
    lines.append("")
    for v, name in charts.margin_plots(result, flips) if plots else []:
        lines += charts.embed_plot(charts.plot_margins, result, rdir, name, f"flip margins of {v['variant']}", written,
                        variant=v, flips=flips)
    return lines


def write_equiv(result, results_dir: str | os.PathLike = RESULTS_DIR, plots: bool = True, *,
                accuracy: dict | None = None, tables_root=None, shows: list | None = None,
                render=render_params) -> list[Path]:
    """Render the equiv section, then reassemble the report (Markdown and HTML); returns every file written."""
    text, written = render_equiv(result, results_dir, plots, accuracy=accuracy, tables_root=tables_root,
                                 shows=shows, render=render)
    sec = document.write_section(SECTION, text, results_dir)
    md = document.assemble(results_dir)
    return [*written, sec, md, Path(results_dir) / document.HTML_FILE]


def publish_equiv(result, results_dir: Path, tables_root: Path, plots: bool = True, fixtures=None, images=None,
                  render=render_params) -> list:
    """Everything an equiv analysis leaves behind: its table rows, the report sections, equiv.json.

    Accuracy is computed from the labels the fixtures were built from (`fixtures` COCO
    JSON, `images` folder; None: the bundled corpus); `render` names the parameters the report points at
    (render_equiv). Returns the files written.
    """
    labels = {"fixtures": fixtures, "images": images}
    document.clean_stale_report(results_dir)
    shows, ahead = gallerysection.draw_ahead(result, Path(results_dir), tables_root, plots)   # a child starts drawing
    try:
        acc = report_accuracy(result, tables_root, fixtures, images, results_dir=results_dir)
        files = write_tables(result, tables_root)
        ahead.finish()   # draw what the child has not taken, and wait for it
    finally:
        ahead.close()    # (after an error: no child left writing files)
    files += write_equiv(result, results_dir, plots=plots, accuracy=acc, tables_root=tables_root, shows=shows,
                         render=render)
    files.append(atomic_write_text(Path(results_dir) / "equiv.json", as_json({**result.summary(), "labels": labels}) + "\n"))
    return files
