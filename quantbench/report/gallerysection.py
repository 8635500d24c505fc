"""The equiv section's flip gallery: which flips it shows, the thumbnails drawn (by a forked child while
accuracy is scored: forkedfiles.py), and its lines in the report.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

from quantbench.report import gallery
from quantbench.report.forkedfiles import MAX_JOBS, Ahead
from quantbench.fsutil import made_from
from quantbench.report import charts


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

        picks = sorted(per_fx.items(), key=key)[:gallery.PER_COMPARISON]
        chosen.append((c, picks, len(per_fx)))
    recipes = gallery.fixture_recipes({f for _, picks, _ in chosen for f, _ in picks}, tables_root)
    shows = []   # per comparison: (title line, [(fixture, alt, name, key, draw arguments)])
    for c, picks, n_img in chosen:
        v = model_of.get(c["variant_id"], {})
        ref_vid = next((x["variant_id"] for x in result.variants
                        if x["model"] == v.get("model") and x["variant"] == c["ref_variant"]), c["variant_id"])
        frame = gallery.box_frame(v.get("decode") or {}, result.sidecars.get(v.get("model")))
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
            name = gallery.safe(f"{v.get('model', '')}-{c['variant']}-{c['host']}-{c['comparison']}-{f[:12]}") + ".png"
            key = gallery.thumb_key(f, recipes[f], ref, cand, rows, frame, legend) if f in recipes else None
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
            gallery.save_png(gallery.draw(rgb, *args), folder / name, key)


# a forked child joins in drawing the gallery only when there are this many thumbnails to draw: a fork and a
# wait cost about as much as drawing one
AHEAD_MIN_THUMBNAILS = 8


def draw_ahead(result, rdir: Path, tables_root, plots: bool) -> tuple[list, Ahead]:
    """(gallery_shows, an Ahead drawing the missing plots and gallery thumbnails): a forked child starts on them
    while publish_equiv scores accuracy and writes the tables, then both draw what is left (Ahead.finish)."""
    shows = gallery_shows(result, tables_root)
    folder = rdir / gallery.GALLERY
    todo = thumbnails_to_draw(shows, folder)
    jobs = []
    if plots and charts.plots_to_draw(result, rdir):
        jobs.append(functools.partial(charts.draw_plots, result, rdir))   # one job: one process imports matplotlib
    if len(todo) >= AHEAD_MIN_THUMBNAILS:
        pixels = gallery.fixture_pixels({f for f, _, _, _ in todo}, tables_root)   # read here: the child reads no table
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
    lines += [f"For each comparison with flips, up to {gallery.PER_COMPARISON} images whose flips had the largest fp32 "
              "|margin|: the reference's served boxes in green, the candidate's in magenta, flipped decisions "
              "thick; below, each flip: reference class and score -> candidate class and score.", ""]
    shows = gallery_shows(result, tables_root) if shows is None else shows
    folder = rdir / gallery.GALLERY
    # only the thumbnails not already drawn from the same inputs read their input tensors and are drawn
    todo = thumbnails_to_draw(shows, folder)
    pixels = gallery.fixture_pixels({f for f, _, _, _ in todo}, tables_root)
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
            lines += [f"![{alt}]({gallery.GALLERY}/{name})", ""]
        lines.append("")
    gallery.prune(folder, keep)
    return lines
