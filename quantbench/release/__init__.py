"""Release records: semantic artifact hash, ONNX diff, release key registry, verify.

A release record carries the recipe, the builder environment, the artifact
hashes (raw and semantic) and a behavioural measurement on each target,
because neither the recipe nor the bytes alone identify what a model does.
"""

from __future__ import annotations


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """`quantbench.textfmt.text_table` with a rule: kept only for the commands that still call it
    (release, verify, config); new code calls textfmt directly."""
    from quantbench.textfmt import text_table

    return text_table(headers, rows, rule=True)
