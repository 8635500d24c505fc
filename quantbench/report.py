"""results/report.md: one Markdown report assembled from per-analysis sections.

Each analysis writes its own fragment, ``results/report.d/<section>.md``, with
``write_section(name, markdown)``; ``assemble()`` concatenates the fragments in
a fixed order (SECTION_ORDER, then any other section alphabetically) into
``results/report.md``. Every write is atomic, so a reader never sees half a
report, and one analysis rerunning never clobbers another's section.

Plots (PNG, when matplotlib is installed: the ``plots`` extra) go to
``results/plots/`` and are linked from the sections.

This module also renders the `equiv` section (tables, class map, flip-margin
histogram) from an EquivResult.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from quantbench.assets import RESULTS_DIR
from quantbench.fsutil import atomic_path, atomic_write_text

SECTION_ORDER = ("equiv", "explain", "release")
FRAGMENTS = "report.d"
PLOTS = "plots"
TITLE = "# quantbench report\n"


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
    """Concatenate every section into results/report.md (atomically); returns its path."""
    parts = [TITLE]
    for name in sections(results_dir):
        parts.append(section_path(name, results_dir).read_text(encoding="utf-8").rstrip() + "\n")
    return atomic_write_text(Path(results_dir) / "report.md", "\n".join(parts))


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
    import hashlib

    from quantbench.fsutil import canonical_json

    return hashlib.sha256(canonical_json([PLOT_VERSION, kind, data]).encode()).hexdigest()


def _key_path(path: Path) -> Path:
    return path.parent / f".{path.name}.key"


def _drawn(path: Path, key: str) -> bool:
    """The PNG at `path` was drawn from the same data (its key file matches): no need to draw it again."""
    try:
        return path.exists() and _key_path(path).read_text().strip() == key
    except OSError:
        return False


# --------------------------------------------------------------------------- equiv section


def _fmt(x, digits=3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def _table(header: list, rows: list) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return out


def _savefig(fig, path: Path, key: str | None = None) -> Path:
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=100, metadata={"Software": None})
    if key is not None:
        atomic_write_text(_key_path(path), key + "\n")
    return path


def plot_class_map(result, path: Path) -> Path | None:
    """Host x variant grid, each cell coloured and lettered by its equivalence class."""
    if not have_matplotlib():
        return None
    hosts = list(result.hosts)
    variants = [v for v in result.variants]
    key = _plot_key("class-map", [hosts, [[v["model"], v["variant"], [[c["label"], c["hosts"]] for c in v["classes"]]]
                                          for v in variants]])
    if _drawn(path, key):
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


def plot_margins(result, path: Path) -> Path | None:
    """Histogram of the fp32 score's distance to the threshold, for every flip against fp32."""
    if not have_matplotlib():
        return None
    margins = [r["margin"] for r in result.flip_rows
               if r["comparison"] in ("own-fp32", "ref-fp32") and r["margin"] is not None and not math.isnan(r["margin"])]
    key = _plot_key("margins", [repr(m) for m in margins])
    if _drawn(path, key):
        return path
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    if margins:
        lim = max(abs(m) for m in margins) or 1e-3
        ax.hist(margins, bins=40, range=(-lim, lim), color="#4c72b0")
    ax.axvline(0.0, color="k", lw=0.8)
    ax.set_xlabel("fp32 score - threshold, per flipped decision")
    ax.set_ylabel("flips")
    ax.set_title(f"flip margins ({len(margins)} flips against fp32)", fontsize=9)
    fig.tight_layout()
    out = _savefig(fig, path, key)
    plt.close(fig)
    return out


def _embed(plot, result, rdir: Path, name: str, alt: str, written: list) -> list[str]:
    """Draw one plot into results/plots; the Markdown lines that show it (none without matplotlib)."""
    p = plot(result, rdir / PLOTS / name)
    if not p:
        return []
    written.append(p)
    return [f"![{alt}]({PLOTS}/{name})", ""]


def render_equiv(result, results_dir: str | os.PathLike = RESULTS_DIR, plots: bool = True) -> tuple[str, list[Path]]:
    """The equiv section's Markdown and the plot files written."""
    s = result.settings
    rdir = Path(results_dir)
    written: list[Path] = []
    lines = ["## Equivalence and decisions (`quantbench equiv`)", ""]
    lines.append(f"Analysis `{result.equiv_id[:12]}`: hosts {', '.join(result.hosts)} (reference "
                 f"**{s['reference']}**); tensor gate atol {s['atol']:g}, rtol {s['rtol']:g}; decision budget "
                 f"{s['budget']} flips.")
    lines.append("")
    lines += _table(["host", "kind", "arch", "cpu", "onnxruntime", "fingerprint"],
                    [[h, i["kind"], i["arch"], i["cpu"][:60], i["ort_version"], f"`{i['fingerprint_id'][:12]}`"]
                     for h, i in result.hosts.items()])
    lines.append("")
    if plots:
        lines += _embed(plot_class_map, result, rdir, "equiv-classes.png", "class map", written)
    lines += ["### Equivalence classes", "",
              "Hosts grouped by identical output hashes over every fixture; the separating features are the "
              "smallest set of fingerprint features whose values tell the classes apart.", ""]
    rows = []
    for v in result.variants:
        cls = "; ".join(f"{c['label']}: {', '.join(c['hosts'])}" for c in v["classes"])
        sep = v["separating_features"]
        sep_s = "-" if sep == [] else ("not separable by the fingerprint" if sep is None else ", ".join(sep))
        agree = ", ".join(f"{a}~{b} {n}/{v['fixtures']}" for a, b, n in
                          ((x["a"], x["b"], x["fixtures_agree"]) for x in v["agreement"]))
        rows.append([v["model"], v["variant"], v["fixtures"], cls, sep_s, agree or "-"])
    lines += _table(["model", "variant", "fixtures", "classes", "separated by", "fixtures agreeing (pairs)"], rows)
    lines.append("")
    dist_rows = [[v["variant"], f"{d['class']} ({d['host']})", f"{d['ref_class']} ({d['ref_host']})", d["output"],
                  _fmt(d["max_abs"]), _fmt(d["mean_abs"]), _fmt(d["bits_mean"]), _fmt(d["bits_min"])]
                 for v in result.variants for d in v["distances"]]
    if dist_rows:
        lines += ["### Numeric distance between classes", "",
                  "Remaining precision: leading identical mantissa bits of binary32 (23 = equal; 0 when sign "
                  "or exponent differ).", ""]
        lines += _table(["variant", "class", "against", "output", "max abs delta", "mean abs delta",
                         "bits mean", "bits min"], dist_rows)
        lines.append("")
    lines += ["### Decisions against fp32", "",
              "Totals are the decisions served (reference -> candidate); **concealed** marks totals within one "
              "of each other while decisions flipped.", ""]
    rows = []
    for c in result.comparisons:
        bk = c["by_kind"]
        m = c["margins"]
        band = "-" if not m.get("band") else f"[{m['band'][0]:.4g}, {m['band'][1]:.4g}]"
        rows.append([c["variant"], c["host"], f"{c['ref_variant']} on {c['ref_host']}", c["comparison"],
                     f"{c['ref_total']} -> {c['total']}", c["flips"],
                     f"{bk['threshold']}/{bk['class']}/{bk['box-shift']}", f"{c['images_disagree']}/{c['fixtures']}",
                     "**concealed**" if c["concealed"] else "", band])
    lines += _table(["variant", "host", "against", "comparison", "totals", "flips", "thr/class/box",
                     "images disagree", "", "fp32 band holding every flip"], rows)
    lines.append("")
    lines += ["### Two gates", "",
              f"Tensor gate: an element fails when |delta| > {s['atol']:g} and |delta| > {s['rtol']:g} x |ref| "
              f"(Polygraphy's rule). Decision gate: flips <= {s['budget']}.", ""]
    rows = [[c["variant"], c["host"], f"{c['ref_variant']} on {c['ref_host']}",
             "pass" if c["tensor_gate"]["passed"] else f"FAIL ({c['tensor_gate']['failing']}/{c['tensor_gate']['elements']})",
             _fmt(c["tensor_gate"]["max_abs"]), "pass" if c["decision_passed"] else f"FAIL ({c['flips']})",
             c["gates_disagree"] or ""] for c in result.comparisons]
    lines += _table(["variant", "host", "against", "tensor gate", "max abs delta", "decision gate",
                     "disagreement"], rows)
    lines.append("")
    bands: dict = {}
    for r in result.flip_rows:
        if r["comparison"] in ("own-fp32", "ref-fp32"):
            bands[r["band"]] = bands.get(r["band"], 0) + 1
    lines += ["### Margins", "",
              "Every flip against fp32 by the fp32 score's distance to the threshold.", ""]
    if bands:
        from quantbench.analysis.decisions import band_labels

        lines += _table(["distance of the fp32 score to the threshold", "flips"], [[b, bands[b]] for b in band_labels() if b in bands])
    else:
        lines.append("No flips against fp32.")
    lines.append("")
    if plots:
        lines += _embed(plot_margins, result, rdir, "equiv-margins.png", "flip margins", written)
    lines.append("Tables: `results/tables/classes`, `results/tables/decisions`, `results/tables/flips`.")
    return "\n".join(lines) + "\n", written


def write_equiv(result, results_dir: str | os.PathLike = RESULTS_DIR, plots: bool = True) -> list[Path]:
    """Render the equiv section, then reassemble the report; returns every file written."""
    text, written = render_equiv(result, results_dir, plots)
    sec = write_section("equiv", text, results_dir)
    return [*written, sec, assemble(results_dir)]
