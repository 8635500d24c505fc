"""argparse types of options whose values the library owns: a command declares the option with its type from
here, so a command module imports no layer below the API (tests/test_architecture.py). Only the commands that
take such an option import this module (it loads the decoders' module, and numpy with it)."""

from __future__ import annotations

from quantbench.analysis.decode import decode_arg as _decode_arg


def decode_arg(text: str) -> str:
    """argparse type of --decode: a built-in kind, none, or a plug-in that loads (analysis.decode.decode_arg)."""
    return _decode_arg(text)
