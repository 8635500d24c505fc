"""`quantbench config`: the option defaults in effect here, and where each comes from."""

from __future__ import annotations

from quantbench.cli import config as cli_config
from quantbench.cli.commands import declared

HELP = ("Show the option defaults in effect in this folder (hosts, fixtures, threshold, budget, ...) and where "
        "each comes from: a flag > quantbench.toml [defaults] > pyproject.toml [tool.quantbench] > built-in.")
JSON_NATIVE = True
NEEDS_EVERY_COMMAND = True   # lists every command's options: cli.py builds the whole parser for it


def add_arguments(parser) -> None:
    parser.add_argument("--all", action="store_true", help="every option of every command, not only the usual keys")


def run(args) -> int:
    import json

    parser = args._parser
    rows = cli_config.effective(parser._qb_leaves, parser._qb_sources, parser._qb_builtin, every=args.all,
                                mixed=declared().mixed)
    files = [{"file": str(s.path), "table": cli_config.defaults_table(s)} for s in parser._qb_sources]
    if args.json:
        print(json.dumps({"sources": files, "precedence": ["flag", "quantbench.toml [defaults]",
                                                           "pyproject.toml [tool.quantbench]", "built-in"],
                          "options": rows}, indent=2, sort_keys=True, default=str))
        return 0
    print("config files: " + (", ".join(f"{f['file']} [{f['table']}]" for f in files) or
                              "none (built-in defaults; see quantbench.toml [defaults] or pyproject.toml [tool.quantbench])"))
    print(cli_config.effective_table(rows))
    print("precedence: flag > quantbench.toml [defaults] > pyproject.toml [tool.quantbench] > built-in")
    return 0

