"""argparse types of options whose values the library owns: a command declares the option with its type from
here, so a command module imports no layer below the API (tests/test_architecture.py). Only the commands that
take such an option import this module (it loads the decoders' module, and numpy with it)."""

from __future__ import annotations

import argparse

from quantbench.analysis.decode import decode_arg as _decode_arg
from quantbench.analysis.gates import parse_budget
from quantbench.errors import ParameterError


def decode_arg(text: str) -> str:
    """argparse type of --decode: a built-in kind, none, or a plug-in that loads (analysis.decode.decode_arg)."""
    return _decode_arg(text)


def budget_value(text: str):
    """argparse type of a --budget (command line or defaults table): a count as int, a share as given ("1%");
    neither fails before any run (analysis.gates.parse_budget)."""
    try:
        return parse_budget(text).value()
    except ParameterError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc.problem}" if exc.show_value else exc.problem) from None
