"""Command-line entry point: `quantbench <command>` and `python -m quantbench`."""

from __future__ import annotations

import argparse
import importlib
import sys

from quantbench import __version__
from quantbench.commands import COMMANDS
from quantbench.errors import GateFailed, UserError


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)


def _load_commands():
    mods = []
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"quantbench.commands.{name}")
        except ModuleNotFoundError as exc:  # command not built in this checkout
            if exc.name == f"quantbench.commands.{name}":
                continue
            raise
        mods.append((name, mod))
    return mods


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="quantbench",
        description=(
            "Tells, before a release, what quantizing one ONNX model does on each CPU "
            "it ships to: equivalence classes of byte-identical hosts and the served "
            "decisions that flip against fp32."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"quantbench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, mod in _load_commands():
        p = sub.add_parser(
            name,
            help=mod.HELP,
            description=mod.HELP,
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except UserError as exc:
        sys.stderr.write(f"quantbench {args.command}: error: {exc}\n")
        return exc.exit_code
    except GateFailed as exc:
        sys.stderr.write(f"quantbench {args.command}: gate failed: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write(f"quantbench {args.command}: interrupted; finished results are kept, rerun to resume\n")
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
