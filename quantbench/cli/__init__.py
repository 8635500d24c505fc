"""The command line: the entry point (cli.py), its output manners (console.py), option defaults from the project's
files (config.py), the argparse types of options the library owns (argtypes.py), how an equiv result is printed
(equivprint.py) and one module per command (commands/)."""

from quantbench.cli.cli import build_parser, main

__all__ = ["build_parser", "main"]
