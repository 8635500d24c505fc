"""The equiv section's plots (PNG, when matplotlib is installed: the ``plots`` extra), under
``results/plots/``, each keyed by what it draws so an unchanged plot is not drawn again: the class map and the
flip-margin histograms.
"""

from __future__ import annotations

import math
from pathlib import Path

from quantbench.analysis.decode import kind_of
from quantbench.fsutil import atomic_path, content_key, made_from, write_key
from quantbench.report.gallery import safe
from quantbench.report import document


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


def embed_plot(plot, result, rdir: Path, name: str, alt: str, written: list, **kw) -> list[str]:
    """Draw one plot into results/plots; the Markdown lines that show it (none without matplotlib)."""
    p = plot(result, rdir / document.PLOTS / name, **kw)
    if not p:
        return []
    written.append(p)
    return [f"![{alt}]({document.PLOTS}/{name})", ""]


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
    if not made_from(rdir / document.PLOTS / CLASS_MAP, _class_map_key(result)):
        return True
    flips = _plot_flips(result)
    for v, name in margin_plots(result, flips):
        series, key = _margin_series([v], flips)
        if series and not made_from(rdir / document.PLOTS / name, key):
            return True
    return False


def draw_plots(result, rdir: Path) -> None:
    """Draw the equiv section's plots (class map, margins) as render_equiv embeds them."""
    plot_class_map(result, rdir / document.PLOTS / CLASS_MAP)
    flips = _plot_flips(result)
    for v, name in margin_plots(result, flips):
        plot_margins(result, rdir / document.PLOTS / name, variant=v, flips=flips)
