"""The two table formats quantbench prints: fixed-width text (terminal) and Markdown (report), and their numbers.

One owner for both, so every command and report section lines up the same way.
"""

from __future__ import annotations

import math


def num(x, spec: str = ".3g", nan: str | None = "-") -> str:
    """A number as a table cell or in a sentence: None as '-', a float per `spec` (NaN as `nan`, or as `spec`
    gives it when `nan` is None), anything else as str(). One owner, so the report, the gallery and the explain
    section print a value the same way."""
    if x is None:
        return "-"
    if isinstance(x, float):
        return nan if nan is not None and math.isnan(x) else format(x, spec)
    return str(x)


def _cell(c) -> str:
    return "-" if c is None else str(c)


def text_table(headers, rows, rule: bool = False) -> str:
    """Columns padded to their widest cell, two spaces apart; `rule` adds a dashed line under the header."""
    head = [str(h) for h in headers]
    body = [[_cell(c) for c in r] for r in rows]
    n = max([len(head)] + [len(r) for r in body])
    widths = [max([len(head[i]) if i < len(head) else 0] + [len(r[i]) for r in body if i < len(r)]) for i in range(n)]

    def line(cells):
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    out = [line(head)] + ([line(["-" * w for w in widths])] if rule else []) + [line(r) for r in body]
    return "\n".join(out)


def md_table(headers, rows) -> list[str]:
    """A Markdown table as lines; '|' in cells is escaped and None shows as '-'."""
    esc = lambda c: _cell(c).replace("|", "\\|")  # noqa: E731
    out = ["| " + " | ".join(esc(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return out


def md_section(title: str, intro: str | None, headers, rows) -> list[str]:
    """A report subsection as lines: '### title', its intro paragraph (if any), the table, each followed by a blank."""
    return [f"### {title}", ""] + ([intro, ""] if intro else []) + md_table(headers, rows) + [""]
