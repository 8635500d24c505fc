"""results/report.md (and report.html): one report assembled from per-analysis sections.

Each analysis writes its own fragment, ``results/report.d/<section>.md``, with
``write_section(name, markdown)``; ``assemble()`` concatenates the fragments in
a fixed order (SECTIONS, then any other section alphabetically) into
``results/report.md``, and renders the same text as ``results/report.html`` (htmlpage.py). Every write is
atomic, so a reader never sees half a report, and one analysis rerunning never clobbers another's section.

The sections are registered here, in report order (SECTIONS): the module that writes one declares
``SECTION = document.registered("name")`` and writes it with ``write_section(SECTION, ...)``. Adding a section is
one Section below and that module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from quantbench.report import gallery
from quantbench.store.resultpaths import RESULTS_DIR
from quantbench.fsutil import atomic_write_text, clean_stale_tmp, content_key, made_from, write_key
from quantbench.report import htmlpage


@dataclass(frozen=True)
class Section:
    """One report section: its fragment's name and the module that writes it (its place in SECTIONS is its place in the report)."""

    name: str
    #: the module that writes it (None: none today; a fragment of that name still takes this place)
    writer: str | None


#: every report section, in report order
SECTIONS = (Section("equiv", "quantbench.report.equivsection"), Section("explain", "quantbench.report.explainsection"),
            Section("search", "quantbench.explain.searchreport"), Section("release", None))
SECTION_ORDER = tuple(s.name for s in SECTIONS)


def registered(name: str) -> str:
    """`name`, a registered section's (what a section's module declares as its SECTION), else a ValueError."""
    if name not in SECTION_ORDER:
        raise ValueError(f"report section {name!r} is not registered in quantbench.report.document.SECTIONS")
    return name

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
        atomic_write_text(html, htmlpage.render_html(text))
        write_key(html, key)
    return atomic_write_text(Path(results_dir) / "report.md", text)


def clean_stale_report(results_dir: str | os.PathLike) -> list[Path]:
    """Remove the temporary files (fsutil.atomic_path's, a dead writer's only) that a killed equiv or report left
    in the report's folders: the results folder, its plots, report fragments and flip gallery; returns them."""
    rdir = Path(results_dir)
    return [p for d in (rdir, rdir / PLOTS, rdir / FRAGMENTS, rdir / gallery.GALLERY) for p in clean_stale_tmp(d)]
