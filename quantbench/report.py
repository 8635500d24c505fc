"""results/report.md (and report.html): one report assembled from per-analysis sections.

Each analysis writes its own fragment, ``results/report.d/<section>.md``, with
``write_section(name, markdown)``; ``assemble()`` concatenates the fragments in
a fixed order (SECTION_ORDER, then any other section alphabetically) into
``results/report.md``, and renders the same text as ``results/report.html`` (one
page, relative image links, opens from disk in any browser). Every write is atomic, so a reader never sees half a
report, and one analysis rerunning never clobbers another's section.

Plots (PNG, when matplotlib is installed: the ``plots`` extra) go to
``results/plots/`` and are linked from the sections.

This module also renders the `equiv` section (tables, class map, flip-margin
histogram) from an EquivResult.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

from quantbench import gallery as GL
from quantbench.ahead import MAX_JOBS, Ahead
from quantbench.analysis import classes as C
from quantbench.analysis.accuracy import report_accuracy
from quantbench.analysis.decisions import band_labels
from quantbench.analysis.decode import kind_of
from quantbench.analysis.equiv import as_json, write_tables
from quantbench.analysis.gates import DEFAULT_ATOL, DEFAULT_RTOL, ship_verdict, tolerance_set
from quantbench.assets import RESULTS_DIR
from quantbench.fsutil import atomic_path, atomic_write_text, clean_stale_tmp, content_key, made_from, write_key
from quantbench.gallery import safe
from quantbench.hosts.deploy import describe as describe_session
from quantbench.hosts.placement import summary_text as placement_text
from quantbench.textfmt import md_section, md_table, num, text_table
from quantbench.variants import DEMO_NOTE, is_demo

SECTION_ORDER = ("equiv", "explain", "search", "release")
FRAGMENTS = "report.d"
PLOTS = "plots"
TITLE = "# quantbench report\n"
HTML_FILE = "report.html"
HTML_VERSION = 1   # of render_html: a change of the page's markup bumps it


def section_path(name: str, results_dir: str | os.PathLike = RESULTS_DIR) -> Path:
    return Path(results_dir) / FRAGMENTS / f"{name}.md"


def write_section(name: str, markdown: str, results_dir: str | os.PathLike = RESULTS_DIR) -> Path:
    """Write (replace) one section's fragment atomically."""
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"section name {name!r}: use letters, digits, '-' or '_'")
    return atomic_write_text(section_path(name, results_dir), markdown.rstrip() + "\n")


def sections(results_dir: str | os.PathLike = RESULTS_DIR) -> list[str]:
    """Section names present, in report order."""
    d = Path(results_dir) / FRAGMENTS
    names = sorted(p.stem for p in d.glob("*.md")) if d.is_dir() else []
    known = [n for n in SECTION_ORDER if n in names]
    return known + [n for n in names if n not in SECTION_ORDER]


def assemble(results_dir: str | os.PathLike = RESULTS_DIR) -> Path:
    """Concatenate every section into results/report.md, and render results/report.html from the
    same text (both atomically; the page only when its key file names other text); returns the Markdown's path."""
    parts = [TITLE]
    for name in sections(results_dir):
        parts.append(section_path(name, results_dir).read_text(encoding="utf-8").rstrip() + "\n")
    text = "\n".join(parts)
    html = Path(results_dir) / HTML_FILE
    key = content_key([HTML_VERSION, text])
    if not made_from(html, key):   # the same text renders the same page: not rendered again
        atomic_write_text(html, render_html(text))
        write_key(html, key)
    return atomic_write_text(Path(results_dir) / "report.md", text)


# A check any browser runs on load, read back by the headless-browser test: how many images
# decoded (naturalWidth > 0), which did not, and every script or resource error.
_CHECK = """<script>
(function () {
  var errors = [];
  window.addEventListener("error", function (e) {
    var t = e.target;
    errors.push(t && t.tagName ? t.tagName.toLowerCase() + " " + (t.getAttribute("src") || "") : String(e.message));
  }, true);
  window.addEventListener("load", function () {
    var imgs = document.images, ok = 0, bad = [];
    for (var i = 0; i < imgs.length; i++) {
      if (imgs[i].complete && imgs[i].naturalWidth > 0) { ok++; } else { bad.push(imgs[i].getAttribute("src")); }
    }
    var b = document.body;
    b.setAttribute("data-images", String(imgs.length));
    b.setAttribute("data-images-loaded", String(ok));
    b.setAttribute("data-images-broken", bad.join(" "));
    b.setAttribute("data-errors", errors.join(" | "));
    b.setAttribute("data-checked", "yes");
  });
})();
</script>"""

_STYLE = """<style>
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
img { max-width: 100%; }
code { background: #f5f5f5; padding: 0 0.2em; }
h4 + p img, p > img { margin: 0.25em 0.5em 0.25em 0; vertical-align: top; }
</style>"""


def render_html(markdown_text: str) -> str:
    """report.md's text as one HTML page that opens from disk (images by relative path, no server)."""
    import html

    import markdown

    body = markdown.markdown(markdown_text, extensions=["tables", "fenced_code", "sane_lists"], output_format="html")
    title = next((ln[2:].strip() for ln in markdown_text.splitlines() if ln.startswith("# ")), "quantbench report")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n{_STYLE}\n{_CHECK}\n</head>\n<body>\n{body}\n</body>\n</html>\n")


def have_matplotlib() -> bool:
    """Whether matplotlib is installed (found, not imported: importing it costs most of a second)."""
    import importlib.util

    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        return False


PLOT_VERSION = 1


def _plot_key(kind: str, data) -> str:
    """What a plot shows, hashed: the same key means the same picture."""
    return content_key([PLOT_VERSION, kind, data])


# --------------------------------------------------------------------------- equiv section


def _savefig(fig, path: Path, key: str | None = None) -> Path:
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=100, metadata={"Software": None})
    if key is not None:
        write_key(path, key)
    return path


def _class_map_key(result) -> str:
    return _plot_key("class-map", [list(result.hosts), [[v["model"], v["variant"], [[c["label"], c["hosts"]]
                                                                                   for c in v["classes"]]]
                                                        for v in result.variants]])


def plot_class_map(result, path: Path) -> Path | None:
    """Host x variant grid, each cell coloured and lettered by its equivalence class."""
    if not have_matplotlib():
        return None
    hosts = list(result.hosts)
    variants = list(result.variants)
    key = _class_map_key(result)
    if made_from(path, key):
        return path
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    grid = np.zeros((len(hosts), len(variants)))
    labels = [["" for _ in variants] for _ in hosts]
    for j, v in enumerate(variants):
        for k, c in enumerate(v["classes"]):
            for h in c["hosts"]:
                grid[hosts.index(h), j] = k
                labels[hosts.index(h)][j] = c["label"]
    fig, ax = plt.subplots(figsize=(max(4.5, 1.2 + 1.3 * len(variants)), 1.0 + 0.5 * len(hosts)))
    ax.imshow(grid, cmap="Pastel1", vmin=0, vmax=8, aspect="auto")
    for i in range(len(hosts)):
        for j in range(len(variants)):
            ax.text(j, i, labels[i][j], ha="center", va="center", fontsize=12)
    ax.set_xticks(range(len(variants)), [f"{v['model']}\n{v['variant']}" if len({x['model'] for x in variants}) > 1
                                         else v["variant"] for v in variants], fontsize=8)
    ax.set_yticks(range(len(hosts)), hosts)
    ax.set_title("equivalence classes (same letter: identical bytes)", fontsize=9)
    fig.tight_layout()
    out = _savefig(fig, path, key)
    plt.close(fig)
    return out


def margin_axis(decode: dict) -> str:
    """The x-axis of a variant's flip margins, as its decoder defines the decision boundary."""
    return kind_of(decode["kind"]).margin_axis(decode.get("threshold"))


KIND_TITLES = {"own-fp32": "vs fp32, same host", "ref-fp32": "vs fp32 on the reference host",
               "ref-same": "vs the same variant on the reference host"}


def distinct_flips(result) -> dict:
    """{(model, variant, comparison kind): [(flip row, [hosts])]}: each flip once per kind.

    A flip is the same flip on several hosts when its fixture, slots, classes and both
    scores are identical (hosts of one class serve the same bytes): counted once, with
    the hosts that showed it.
    """
    model_of = {v["variant_id"]: v["model"] for v in result.variants}
    out: dict = {}
    seen: dict = {}
    for r in result.flip_rows:
        k = (model_of.get(r["variant_id"], ""), r["variant"], r["comparison"])
        ident = (k, r["ref_variant"], r["fixture_id"], r["ref_slot"], r["slot"], r["kind"], r["ref_class"],
                 r["class_name"], repr(r["ref_score"]), repr(r["score"]))
        if ident in seen:
            seen[ident][1].append(r["host"])
            continue
        entry = (r, [r["host"]])
        seen[ident] = entry
        out.setdefault(k, []).append(entry)
    return out


def _margin_series(variants: list, flips: dict) -> tuple[list, str]:
    """([(comparison kind, [margins])], the plot's key) of the variants' flips (distinct_flips)."""
    series = []
    for v in variants:
        for kind in COMPARISON_ORDER:
            ms = [r["margin"] for r, _ in flips.get((v["model"], v["variant"], kind), [])
                  if r["margin"] is not None and not math.isnan(r["margin"])]
            if ms:
                series.append((kind, ms))
    key = _plot_key("margins", [[v["model"], v["variant"], v["decode"]] for v in variants]
                    + [[kind, [repr(m) for m in ms]] for kind, ms in series])
    return series, key


def plot_margins(result, path: Path, variant: dict | None = None, flips: dict | None = None) -> Path | None:
    """One variant's flip margins (each flip once per comparison kind); None without flips or matplotlib."""
    if not have_matplotlib():
        return None
    flips = distinct_flips(result) if flips is None else flips
    variants = [variant] if variant else result.variants
    series, key = _margin_series(variants, flips)
    if not series:
        return None
    if made_from(path, key):
        return path
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    allm = [m for _, ms in series for m in ms]
    lim = max(abs(m) for m in allm) or 1e-3
    lo = 0.0 if min(allm) >= 0 else -lim
    fig, ax = plt.subplots(figsize=(6, 3))
    for kind, ms in series:
        ax.hist(ms, bins=40, range=(lo, lim), histtype="step", lw=1.5, label=f"{KIND_TITLES[kind]} ({len(ms)})")
    if lo < 0:
        ax.axvline(0.0, color="k", lw=0.8)
    ax.set_xlabel(margin_axis(variants[0]["decode"]) + ", per flipped decision")
    ax.set_ylabel("flips")
    ax.legend(fontsize=7)
    name = variants[0]["variant"] if variant else "all variants"
    ax.set_title(f"flip margins: {name} (each flip once per comparison kind)", fontsize=9)
    fig.tight_layout()
    out = _savefig(fig, path, key)
    plt.close(fig)
    return out


COMPARISON_ORDER = ("own-fp32", "ref-fp32", "ref-same")


def _embed(plot, result, rdir: Path, name: str, alt: str, written: list, **kw) -> list[str]:
    """Draw one plot into results/plots; the Markdown lines that show it (none without matplotlib)."""
    p = plot(result, rdir / PLOTS / name, **kw)
    if not p:
        return []
    written.append(p)
    return [f"![{alt}]({PLOTS}/{name})", ""]


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
            fails.append(f"decision: {n} of {len(dc)} comparisons over {result.settings['budget']} flips")
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
            return (f"no fp32 comparison was possible (no fp32 model given: pass --fp32 FILE); flips count against "
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
        cls = "one class of bytes" if n == 1 else (f"{n} classes of bytes (" + " | ".join(
            f"{c['label']}: {', '.join(c['hosts'])}" for c in v["classes"]) + ")")
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
        gate = ("no gate checks it" if n == 0 else f"gate {gate_name}: " + ("pass" if ok else f"FAIL ({failed})")
                if gates else _no_gate(result, v))
        extra = f" Outputs byte-identical to **{same_out[v['variant_id']]}** on every host and fixture." \
            if v["variant_id"] in same_out else ""
        lines.append(f"- **{answer}** {name}: {'; '.join([*why, gate])}.{extra}")
        lines += provider_flags(v, name)
    for d in s.get("duplicates") or []:
        name = f"{d['model']} / {d['name']}" if multi else d["name"]
        lines.append(f"- **{name}**: duplicate of **{d['duplicate_of']}** (the same model: identical semantic "
                     f"hash), run and analysed once; every figure for {d['duplicate_of']} holds for it.")
    return lines


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


# --------------------------------------------------------------------------- gallery


def _flipped(result) -> list[dict]:
    """The comparisons the gallery shows: decisions compared, with flips."""
    return [c for c in result.comparisons if c.get("decisions_compared", True) and c["flips"]]


def gallery_shows(result, tables_root) -> list:
    """Per comparison with flips: (title line, [(fixture, alt, name, key, draw arguments)]), the thumbnails
    it shows (at most PER_COMPARISON); `key` is None for a fixture not in the fixtures table."""
    comps = _flipped(result)
    by_comp: dict = {}
    for r in result.flip_rows:
        by_comp.setdefault((r["comparison"], r["host"], r["variant_id"]), {}).setdefault(r["fixture_id"], []).append(r)
    model_of = {v["variant_id"]: v for v in result.variants}
    chosen = []
    for c in comps:
        per_fx = by_comp.get((c["comparison"], c["host"], c["variant_id"]), {})

        def key(item):
            ms = [abs(r["margin"]) for r in item[1] if r["margin"] is not None and not math.isnan(r["margin"])]
            return (-(max(ms) if ms else -1.0), item[1][0]["source"], item[0])

        picks = sorted(per_fx.items(), key=key)[:GL.PER_COMPARISON]
        chosen.append((c, picks, len(per_fx)))
    recipes = GL.fixture_recipes({f for _, picks, _ in chosen for f, _ in picks}, tables_root)
    shows = []   # per comparison: (title line, [(fixture, alt, name, key, draw arguments)])
    for c, picks, n_img in chosen:
        v = model_of.get(c["variant_id"], {})
        ref_vid = next((x["variant_id"] for x in result.variants
                        if x["model"] == v.get("model") and x["variant"] == c["ref_variant"]), c["variant_id"])
        frame = GL.box_frame(v.get("decode") or {}, result.sidecars.get(v.get("model")))
        title = (f"{c['variant']} on {c['host']} vs {c['ref_variant']} on {c['ref_host']} ({c['comparison']}): "
                 f"{c['flips']} flips on {c['images_disagree']} images")
        shown = f"; showing {len(picks)}" if len(picks) < n_img else ""
        items = []
        for f, rows in picks:
            src = rows[0]["source"] or f[:12]
            legend = (f"{src}  green: {c['ref_variant']} on {c['ref_host']}  magenta: {c['variant']} on {c['host']}"
                      if frame else f"{src}  reference: {c['ref_variant']} on {c['ref_host']}  candidate: "
                      f"{c['variant']} on {c['host']}")
            ref, cand = result.decoded.get((c["ref_host"], ref_vid, f)), result.decoded.get((c["host"], c["variant_id"], f))
            name = GL.safe(f"{v.get('model', '')}-{c['variant']}-{c['host']}-{c['comparison']}-{f[:12]}") + ".png"
            key = GL.thumb_key(f, recipes[f], ref, cand, rows, frame, legend) if f in recipes else None
            items.append((f, f"{src}: {len(rows)} flip(s)", name, key, (ref, cand, rows, frame, legend)))
        shows.append((f"#### {title}{shown}", items))
    return shows


def thumbnails_to_draw(shows: list, folder: Path) -> list:
    """[(fixture, name, key, draw arguments)] of the shown thumbnails not already drawn from the same inputs."""
    return [(f, name, key, args) for _, items in shows for f, _, name, key, args in items
            if key and not made_from(folder / name, key)]


def draw_thumbnails(todo: list, pixels: dict, folder: Path) -> None:
    """Draw and save `todo` (thumbnails_to_draw) from `pixels` ({fixture: HxWx3 uint8}), each with its key file."""
    for f, name, key, args in todo:
        rgb = pixels.get(f)
        if rgb is not None:
            GL.save_png(GL.draw(rgb, *args), folder / name, key)


# a forked child joins in drawing the gallery only when there are this many thumbnails to draw: a fork and a
# wait cost about as much as drawing one
AHEAD_MIN_THUMBNAILS = 8


def draw_ahead(result, rdir: Path, tables_root, plots: bool) -> tuple[list, Ahead]:
    """(gallery_shows, an Ahead drawing the missing plots and gallery thumbnails): a forked child starts on them
    while publish_equiv scores accuracy and writes the tables, then both draw what is left (Ahead.finish)."""
    shows = gallery_shows(result, tables_root)
    folder = rdir / GL.GALLERY
    todo = thumbnails_to_draw(shows, folder)
    jobs = []
    if plots and plots_to_draw(result, rdir):
        jobs.append(functools.partial(draw_plots, result, rdir))   # one job: one process imports matplotlib
    if len(todo) >= AHEAD_MIN_THUMBNAILS:
        pixels = GL.fixture_pixels({f for f, _, _, _ in todo}, tables_root)   # read here: the child reads no table
        per = -(-len(todo) // (MAX_JOBS - 1))
        jobs += [functools.partial(draw_thumbnails, todo[i:i + per], pixels, folder) for i in range(0, len(todo), per)]
    return shows, Ahead(jobs)


def gallery_lines(result, rdir: Path, tables_root, written: list, shows: list | None = None) -> list[str]:
    """A thumbnail per flipped image (at most PER_COMPARISON per comparison), and the Markdown showing them.

    `shows`: gallery_shows' answer (None: found here); the thumbnails not already drawn are drawn here."""
    lines = ["### Flip gallery", ""]
    if not _flipped(result):
        compared = any(c.get("decisions_compared", True) for c in result.comparisons)
        lines += ["No comparison has flips: nothing to show." if compared
                  else "Decisions not compared (decode none): no gallery.", ""]
        return lines
    lines += [f"For each comparison with flips, up to {GL.PER_COMPARISON} images whose flips had the largest fp32 "
              "|margin|: the reference's served boxes in green, the candidate's in magenta, flipped decisions "
              "thick; below, each flip: reference class and score -> candidate class and score.", ""]
    shows = gallery_shows(result, tables_root) if shows is None else shows
    folder = rdir / GL.GALLERY
    # only the thumbnails not already drawn from the same inputs read their input tensors and are drawn
    todo = thumbnails_to_draw(shows, folder)
    pixels = GL.fixture_pixels({f for f, _, _, _ in todo}, tables_root)
    draw_thumbnails(todo, pixels, folder)
    undrawable = {name for f, name, _, _ in todo if f not in pixels}
    keep = set()
    for title, items in shows:
        lines += [title, ""]
        for f, alt, name, key, args in items:
            if key is None or name in undrawable:
                lines.append(f"- {alt} (no input tensor in the fixtures table to draw)")
                continue
            written.append(folder / name)
            keep.add(name)
            lines += [f"![{alt}]({GL.GALLERY}/{name})", ""]
        lines.append("")
    GL.prune(folder, keep)
    return lines


# --------------------------------------------------------------------------- the equiv section


def render_equiv(result, results_dir: str | os.PathLike = RESULTS_DIR, plots: bool = True, *,
                 accuracy: dict | None = None, tables_root=None, shows: list | None = None) -> tuple[str, list[Path]]:
    """The equiv section's Markdown and the files written (plots, gallery thumbnails).

    `accuracy`: quantbench.analysis.accuracy.accuracy_table's answer (None: no labels given);
    `tables_root`: where the fixtures table is (the gallery draws the input tensors), default
    results_dir/tables; `shows`: gallery_shows' answer (None: found here).
    """
    s = result.settings
    rdir = Path(results_dir)
    tables_root = Path(tables_root) if tables_root is not None else rdir / "tables"
    written: list[Path] = []
    lines = ["## Equivalence and decisions (`quantbench equiv`)", ""]
    if is_demo(v.get("path", "") for v in s.get("variants", [])):
        lines += [f"> {DEMO_NOTE}", ""]
    lines += ["### Verdict", ""]
    lines += verdict_lines(result)
    lines.append("")
    lines.append(f"Analysis `{result.equiv_id[:12]}`: hosts {', '.join(result.hosts)} (reference "
                 f"**{s['reference']}**); tensor gate atol {s['atol']:g}, rtol {s['rtol']:g}; decision budget "
                 f"{s['budget']} flips. Flips count against fp32 on the reference host; the gate is "
                 f"{', '.join(gates_checked(result))} over every comparison of the variant.")
    lines.append("")
    lines += accuracy_lines(result, accuracy)
    lines += hosts_lines(result)
    if plots:
        lines += _embed(plot_class_map, result, rdir, CLASS_MAP, "class map", written)
    lines += classes_lines(result)
    lines += predicted_lines(result)
    lines += providers_lines(result)
    lines += distance_lines(result)
    lines += decisions_lines(result)
    lines += gallery_lines(result, rdir, tables_root, written, shows=shows)
    lines += gates_lines(result)
    lines += margins_lines(result, rdir, plots, written)
    lines.append("Tables: `results/tables/classes`, `results/tables/decisions`, `results/tables/flips`.")
    return "\n".join(lines) + "\n", written


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
        cls = "; ".join(f"{c['label']}: {', '.join(c['hosts'])}" for c in v["classes"])
        sep_s = separation_text(v, "not separable by the fingerprint")
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
                       "flagged"], rows) + [f"- {line}" for line in runtime_lines(result)] + ([""] if runtime_lines(result) else [])


def predicted_lines(result) -> list[str]:
    """Tiers no machine in reach shows, each variant's predicted class: a section of its own, never a class."""
    rows = [[r["model"], r["variant"], r["host"], _prediction(r), "; ".join(r["deciding"]) or "-"]
            for r in getattr(result, "predicted", [])]
    notes = getattr(result, "predicted_notes", [])
    if not rows:
        return [f"- {n}" for n in notes] + ([""] if notes else [])
    return md_section("Predicted tiers (not measured)",
                      "PREDICTED, not measured: these tiers ran nowhere; no gate counts them. Each op of the variant's "
                      "optimized graph reaches MLAS kernels chosen by the tier's CPU features; a tier whose kernels "
                      "match a measured host's is predicted byte-identical to it. " + " ".join(notes),
                      ["model", "variant", "tier", "predicted", "decided by"], rows)


def _prediction(r: dict) -> str:
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
        out += [f"{v['variant']}: {C.version_text(f)}" for f in v.get("versions", [])]
    return out


def distance_lines(result) -> list[str]:
    dist_rows = [[v["variant"], f"{d['class']} ({d['host']})", f"{d['ref_class']} ({d['ref_host']})", d["output"],
                  num(d["max_abs"]), num(d["mean_abs"]), num(d["bits_mean"]), num(d["bits_min"])]
                 for v in result.variants for d in v["distances"]]
    if not dist_rows:
        return []
    return md_section("Numeric distance between classes",
                      "Remaining precision: leading identical mantissa bits of binary32 (23 = equal; 0 when sign "
                      "or exponent differ).",
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
    flips = distinct_flips(result)
    if not flips:
        n_img = max(c["fixtures"] for c in compared)
        lines += [f"No flips: {len(compared)} comparisons over {n_img} images each, every decision the same.", ""]
        return lines
    labels = band_labels()
    present = [b for b in labels if any(r["band"] == b for rs in flips.values() for r, _ in rs)]
    rows = []
    for v in result.variants:
        for kind in COMPARISON_ORDER:
            rs = flips.get((v["model"], v["variant"], kind))
            if not rs:
                continue
            hosts = sorted({h for _, hs in rs for h in hs}, key=list(result.hosts).index)
            counts = [sum(1 for r, _ in rs if r["band"] == b) for b in present]
            rows.append([v["variant"], KIND_TITLES[kind], ", ".join(hosts), len(rs), margin_axis(v["decode"]),
                         *counts])
    lines += md_table(["variant", "comparison", "hosts", "flips", "distance measured", *[f"|d| in {b}" for b in present]],
                      rows)
    lines.append("")
    for v, name in margin_plots(result, flips) if plots else []:
        lines += _embed(plot_margins, result, rdir, name, f"flip margins of {v['variant']}", written,
                        variant=v, flips=flips)
    return lines


def margin_plots(result, flips: dict) -> list[tuple[dict, str]]:
    """[(variant, plot file name)] of the variants with flips (distinct_flips), each with a margins plot."""
    multi = len({v["model"] for v in result.variants}) > 1
    return [(v, safe(f"margins-{v['model']}-{v['variant']}" if multi else f"margins-{v['variant']}") + ".png")
            for v in result.variants if any(flips.get((v["model"], v["variant"], k)) for k in COMPARISON_ORDER)]


CLASS_MAP = "equiv-classes.png"


def _plot_flips(result) -> dict:
    """distinct_flips of a result whose decisions were compared (decode none: none to plot)."""
    return distinct_flips(result) if any(c.get("decisions_compared", True) for c in result.comparisons) else {}


def plots_to_draw(result, rdir: Path) -> bool:
    """Whether a plot of the equiv section is not yet drawn from its data (its key file)."""
    if not have_matplotlib():
        return False
    if not made_from(rdir / PLOTS / CLASS_MAP, _class_map_key(result)):
        return True
    flips = _plot_flips(result)
    for v, name in margin_plots(result, flips):
        series, key = _margin_series([v], flips)
        if series and not made_from(rdir / PLOTS / name, key):
            return True
    return False


def draw_plots(result, rdir: Path) -> None:
    """Draw the equiv section's plots (class map, margins) as render_equiv embeds them."""
    plot_class_map(result, rdir / PLOTS / CLASS_MAP)
    flips = _plot_flips(result)
    for v, name in margin_plots(result, flips):
        plot_margins(result, rdir / PLOTS / name, variant=v, flips=flips)


def write_equiv(result, results_dir: str | os.PathLike = RESULTS_DIR, plots: bool = True, *,
                accuracy: dict | None = None, tables_root=None, shows: list | None = None) -> list[Path]:
    """Render the equiv section, then reassemble the report (Markdown and HTML); returns every file written."""
    text, written = render_equiv(result, results_dir, plots, accuracy=accuracy, tables_root=tables_root,
                                 shows=shows)
    sec = write_section("equiv", text, results_dir)
    md = assemble(results_dir)
    return [*written, sec, md, Path(results_dir) / HTML_FILE]


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
    return [head, "", "Verdict"] + [ln.replace("**", "") for ln in verdict_lines(result)]


def _summary_classes(result) -> list[str]:
    """Equivalence classes per variant, with the features separating them, and each class's distance to the reference."""
    out = ["Equivalence classes (byte-identical outputs over every fixture)"]
    rows = [("model", "variant", "classes", "separated by")]
    for v in result.variants:
        sep_s = separation_text(v, "(not by fingerprint)", values=True)
        rows.append((v["model"], v["variant"], " | ".join(f"{c['label']}: {','.join(c['hosts'])}" for c in v["classes"]),
                     sep_s))
    out += text_table(rows[0], rows[1:]).splitlines() + runtime_lines(result)
    out += [f"PREDICTED (not measured, no gate) {r['variant']}: {r['host']} {_prediction(r)}"
            for r in getattr(result, "predicted", [])]
    dists = [(v, d) for v in result.variants for d in v["distances"]]
    if dists:
        out.append("")
        out.append("Distance to the reference class (max |d|, mean |d|, remaining bits mean/min)")
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
    return out


def _summary_concealed_and_margins(result, compared: list[dict]) -> list[str]:
    """Where equal totals conceal flips, and how close to the threshold the flipped fp32 scores were."""
    out = []
    conceal = [c for c in result.comparisons if c["concealed"]]
    if conceal:
        c = max(conceal, key=lambda c: c["flips"])
        out.append(f"! {len(conceal)} comparison(s) where equal totals conceal flips, e.g. {c['variant']} on {c['host']}: "
                   f"{c['ref_total']} vs {c['total']} decisions hid {c['flips']} changed decisions")
    margins = [m for c in compared if c["comparison"] != "ref-same" and c["margins"].get("band")
               for m in [c["margins"]]]
    if margins:
        lo = min(m["band"][0] for m in margins)
        hi = max(m["band"][1] for m in margins)
        hw = max(m["half_width"] for m in margins)
        if all(m["threshold"] is not None for m in margins):
            out.append(f"every flip against fp32 had an fp32 score in [{lo:.4g}, {hi:.4g}] "
                       f"(within {hw:.3g} of the threshold)")
        else:   # worded as each decoder defines its margin (a plug-in's is its own, not a top-1/top-2 gap)
            decode_of = {v["variant_id"]: v["decode"] for v in result.variants}
            axes = sorted({margin_axis(decode_of[c["variant_id"]]) for c in compared
                           if c["comparison"] != "ref-same" and c["margins"].get("band")
                           and c["variant_id"] in decode_of})
            out.append(f"every flip against fp32 was within {hw:.3g} of its decision boundary "
                       f"({'; '.join(axes) or 'fp32 margin'})")
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


def _distinct_short(values: list, n: int = 24) -> list[str]:
    """Each value shortened (_short), or all of them in full when shortening would make different values read alike."""
    short = [_short(x, n) for x in values]
    return short if len(set(short)) == len({str(x) for x in values}) else [str(x) for x in values]


def clean_stale_report(results_dir: str | os.PathLike) -> list[Path]:
    """Remove the temporary files (fsutil.atomic_path's, a dead writer's only) that a killed equiv or report left
    in the report's folders: the results folder, its plots, report fragments and flip gallery; returns them."""
    rdir = Path(results_dir)
    return [p for d in (rdir, rdir / PLOTS, rdir / FRAGMENTS, rdir / GL.GALLERY) for p in clean_stale_tmp(d)]


def publish_equiv(result, results_dir: Path, tables_root: Path, plots: bool = True, fixtures=None, images=None) -> list:
    """Everything an equiv analysis leaves behind: its table rows, the report sections, equiv.json.

    Accuracy is computed from the labels the fixtures were built from (`fixtures` COCO
    JSON, `images` folder; None: the bundled corpus). Returns the files written.
    """
    labels = {"fixtures": fixtures, "images": images}
    clean_stale_report(results_dir)
    shows, ahead = draw_ahead(result, Path(results_dir), tables_root, plots)   # a child starts drawing
    try:
        acc = report_accuracy(result, tables_root, fixtures, images, results_dir=results_dir)
        files = write_tables(result, tables_root)
        ahead.finish()   # draw what the child has not taken, and wait for it
    finally:
        ahead.close()    # (after an error: no child left writing files)
    files += write_equiv(result, results_dir, plots=plots, accuracy=acc, tables_root=tables_root, shows=shows)
    files.append(atomic_write_text(Path(results_dir) / "equiv.json", as_json({**result.summary(), "labels": labels}) + "\n"))
    return files
