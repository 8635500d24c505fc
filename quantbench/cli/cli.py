"""Command-line entry point: `quantbench <command>` and `python -m quantbench`."""

from __future__ import annotations

import argparse
import importlib
import sys

from quantbench import __version__
from quantbench.inputs import plugins
from quantbench.cli import console
from quantbench.cli import config as cli_config
from quantbench.cli.commands import COMMAND_HELP, COMMANDS, declared
from quantbench.cli.groups import OUTPUT
from quantbench.errors import GateFailed, ParameterError, PluginNotAllowed, UserError, render_params
from quantbench.fsutil import disk_full, kill_point, no_space


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)


def _load_commands(names) -> dict:
    """The named commands' modules; one that fails to import is an error, never a silently missing command."""
    return {name: importlib.import_module(f"quantbench.cli.commands.{name}") for name in names}


def _command_of(argv: list[str]) -> str | None:
    """The command argv runs: its first word (the top level has no option taking a value)."""
    return next((a for a in argv if not a.startswith("-")), None)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default once: not when the help already says it, nor an empty one (None, False, [])."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, False, [], "", argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


def _leaves(name: str, p: argparse.ArgumentParser):
    """(command name, parser) of a command, or of each action of a command with sub-actions (hosts list ...)."""
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(name, p)]
    return [(f"{name} {act}", sp) for a in subs for act, sp in a.choices.items()]


def build_parser(config: bool = True, commands=None) -> argparse.ArgumentParser:
    """The parser; with config, option defaults come from ./quantbench.toml and ./pyproject.toml.

    Only the modules of `commands` (None: every command; all of them for a command that reads them all, `quantbench
    config`) are imported and get their options and defaults; the others are listed from COMMAND_HELP. A defaults
    key or table no command knows is an error whichever command runs (commands.declared(), read from the command
    modules' source); a value is checked by the commands loaded that take it.
    """
    names = list(COMMANDS) if commands is None else [n for n in COMMANDS if n in commands]
    mods = _load_commands(names)
    if len(mods) < len(COMMANDS) and any(getattr(m, "NEEDS_EVERY_COMMAND", False) for m in mods.values()):
        mods = _load_commands(COMMANDS)
    kill_point("commands-imported")

    parser = _Parser(
        prog="quantbench",
        description=(
            "Tells, before a release, what quantizing one ONNX model does on each CPU "
            "it ships to: equivalence classes of byte-identical hosts and the served "
            "decisions that flip against fp32."
        ),
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"quantbench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        mod = mods.get(name)
        p = sub.add_parser(
            name,
            help=COMMAND_HELP[name],
            description=COMMAND_HELP[name],
            formatter_class=_HelpFormatter,
        )
        if mod is None:  # not run here: listed by `quantbench --help`, its module not imported
            continue
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
        if getattr(mod, "JSON_NATIVE", False):
            p.set_defaults(_json_native=True)
        for _, leaf in _leaves(name, p):
            if any("--json" in a.option_strings for a in leaf._actions):   # its own JSON summary
                leaf.set_defaults(_json_native=True)
            OUTPUT.add(leaf)
    leaves = {n: lp for name, p in sub.choices.items() if name in mods for n, lp in _leaves(name, p)}
    parser._qb_leaves = leaves
    parser._qb_builtin = {n: {d: a.default for d, a in cli_config.option_actions(lp).items()}
                          for n, lp in leaves.items()}
    parser._qb_sources = []
    if config:
        sources = cli_config.load_sources(".", commands=list(COMMANDS) + list(declared().subcommands))
        cli_config.check_known(sources, declared().options)
        for n, lp in leaves.items():
            cli_config.apply(lp, n, sources, declared().mixed)
        parser._qb_sources = sources
    return parser


def _with_hosts_file_defaults(parser, argv, args):
    """`args` with the option defaults of the hosts file the command reads (--hosts-file, or the folder's defaults
    naming one): its `[defaults]` table applies like ./quantbench.toml's, above it and below the flags."""
    names = list(COMMANDS) + list(declared().subcommands)
    src = cli_config.hosts_file_source(args.hosts_file, names) if getattr(args, "hosts_file", None) else None
    if src is None:
        return args
    cli_config.check_known([src], declared().options)
    parser._qb_sources = [*parser._qb_sources, src]
    for n, lp in parser._qb_leaves.items():
        cli_config.apply(lp, n, parser._qb_sources, declared().mixed)
    return parser.parse_args(argv)


def _actions(parser, args) -> list:
    """The argparse actions of the command (leaf parser) that runs."""
    leaves = getattr(parser, "_qb_leaves", {})
    leaf = leaves.get(args.command) or next((p for n, p in leaves.items() if n.startswith(f"{args.command} ")), None)
    return getattr(leaf, "_actions", [])


def _flag_namer(actions):
    """param -> its flag on this command line (the command's own option, else any command's), or None."""
    def flag_of(param: str) -> str | None:
        mine = [max(a.option_strings, key=len) for a in actions if a.dest == param and a.option_strings]
        return mine[0] if mine else "--" + param.replace("_", "-") if param in declared().options else None
    return flag_of


def _renderer(parser, args):
    """text -> text with each errors.flag_mark(param) mark shown as the flag: for library messages a command prints
    itself (a run summary's errors), the same way _for_cli shows an error's."""
    flag_of = _flag_namer(_actions(parser, args))
    return lambda text: render_params(text, lambda p: flag_of(p) or p)


def _for_cli(exc: UserError, parser, args) -> str:
    """A library ParameterError names the parameter; on the command line, name its flag instead (so too a
    parameter a message points at, errors.flag_mark). A refused plug-in gets the flag that allows it."""
    actions = _actions(parser, args)
    flag_of = _flag_namer(actions)
    text = Exception.__str__(exc)
    if isinstance(exc, PluginNotAllowed) and any(a.dest == "allow_plugins" for a in actions):
        return render_params(f"{text}: pass --allow-plugins to run it", lambda p: flag_of(p) or p)
    if isinstance(exc, ParameterError) and flag_of(exc.param):
        text = exc.for_flag(flag_of(exc.param))
    return render_params(text, lambda p: flag_of(p) or p)


def _consent(args) -> None:
    """The plug-ins this command may run: the ones its command line names (--decode, --preprocess), or every
    one with --allow-plugins; none that only a file names (a defaults table may name none, config.py)."""
    plugins.reset_consent()
    if getattr(args, "allow_plugins", False):
        plugins.allow_all()
    for ref in (getattr(args, "decode", None), getattr(args, "preprocess", None)):
        if plugins.is_ref(ref):
            plugins.allow(ref)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser(commands=[_command_of(argv)])
    except UserError as exc:  # a bad [defaults] / [tool.quantbench] value
        sys.stderr.write(f"quantbench: error: {exc}\n")
        return exc.exit_code
    args = parser.parse_args(argv)
    try:
        args = _with_hosts_file_defaults(parser, argv, args)
    except UserError as exc:  # a bad [defaults] value in the hosts file
        sys.stderr.write(f"quantbench: error: {exc}\n")
        return exc.exit_code
    _consent(args)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    args._parser = parser
    args._render = _renderer(parser, args)
    if hasattr(args, "no_progress"):
        args.no_progress = not console.progress_enabled(args)
    try:
        with console.session(args, args.command) as state:
            state["rc"] = int(args._run(args) or 0)
        return state["rc"]
    except UserError as exc:
        sys.stderr.write(f"quantbench {args.command}: error: {_for_cli(exc, parser, args)}\n")
        return exc.exit_code
    except GateFailed as exc:
        sys.stderr.write(f"quantbench {args.command}: gate failed: {exc}\n")
        return exc.exit_code
    except OSError as exc:
        if not no_space(exc):
            raise
        # a full disk outside fsutil.atomic_path (a library's own temporary file): still one line
        sys.stderr.write(f"quantbench {args.command}: error: {disk_full(exc.filename or '(a temporary file)', exc)}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"quantbench {args.command}: interrupted; finished results are kept, rerun to resume\n")
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
