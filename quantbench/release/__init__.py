"""Release records: semantic artifact hash, ONNX diff, release key registry, verify.

A release record carries the recipe, the builder environment, the artifact
hashes (raw and semantic) and a behavioural measurement on each target,
because neither the recipe nor the bytes alone identify what a model does.
"""

from __future__ import annotations


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain fixed-width text table (the summary every command prints)."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])
