"""Option defaults from the project's files: `quantbench.toml` `[defaults]` and `pyproject.toml` `[tool.quantbench]`.

Precedence, highest first: a flag on the command line, `./quantbench.toml` (its
`[defaults]` table), `./pyproject.toml` (its `[tool.quantbench]` table), the built-in
default. Either table may hold keys for every command (`hosts = "x86,pi"`) and
per-command tables that win over them (`[defaults.equiv]` / `[tool.quantbench.equiv]`):

    # quantbench.toml: also the hosts file; `defaults` is the one reserved name.
    # Hosts go first (or under [hosts]): in TOML every key after [defaults] belongs to it.
    board1 = { kind = "ssh", address = "pi@board1.local" }

    [defaults]
    hosts = ["x86", "board1"]
    fixtures = "data/labels.json"
    threshold = 0.5
    budget = 2

A key is an option's long name (`no-progress` or `no_progress`). A value must suit the
option (a number for --budget, one of the choices for --decode ...); a mistake is a
one-line error naming the file, as for any flag (a key no command has, whichever command
runs; a value, when a command taking it runs). `quantbench config` shows every key,
its value and where it came from. The defaults cannot define or override hosts: those
trust rules stay with the hosts file (docs/trust.md).

A hosts file named on the command line (`--hosts-file FILE`, or a defaults table's
`hosts-file`) is read the same way: its `[defaults]` table applies, above
`./quantbench.toml`'s and below the flags. A key that names where a command writes
(`results`, `tables`, `out`, `export`, `archive`) must be a relative path inside the
working folder: a cloned repository's file cannot send tables to `/etc`; a folder
elsewhere is given on the command line. A key shared by commands whose options take
different kinds of value (`gate`: names for `equiv`, true/false for `diff`) applies to
the commands whose option takes its kind, and not to the others.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

from quantbench.errors import UserError
from quantbench.fsutil import MAX_SETTINGS_BYTES, inside, parse_toml, read_user_text
from quantbench.inputs.plugins import is_ref
from quantbench.textfmt import text_table

PYPROJECT = Path("pyproject.toml")
QUANTBENCH_TOML = Path("quantbench.toml")
DEFAULTS_TABLE = "defaults"
# keys `quantbench config` lists even when no file sets them (the four, and their companions)
#: options naming where a command writes: a defaults table may set them only inside the working folder
WRITE_KEYS = ("results", "tables", "out", "export", "archive")
SHOWN = ("hosts", "fixtures", "images", "threshold", "budget", "results", "tables", "hosts_file", "jobs",
         "decode", "split", "no_progress")


@dataclass
class Source:
    name: str          # "quantbench.toml", "pyproject.toml"
    path: Path
    common: dict = field(default_factory=dict)
    per_command: dict = field(default_factory=dict)


def _norm(key: str) -> str:
    return str(key).replace("-", "_")


def _read_toml(path: Path, what: str = "settings file") -> dict:
    return parse_toml(path, read_user_text(path, what, MAX_SETTINGS_BYTES))


def _split(table, where: str, commands) -> tuple[dict, dict]:
    if not isinstance(table, dict):
        raise UserError(f"{where}: must be a table of option defaults")
    common, per = {}, {}
    for k, v in table.items():
        if isinstance(v, dict):
            if "kind" in v:
                raise UserError(f"{where}.{k}: a host inside the defaults table; in TOML every key after "
                                f"[{DEFAULTS_TABLE}] belongs to it, so define hosts above it or under [hosts]")
            if k not in commands:
                raise UserError(f"{where}.{k}: no command {k!r}; commands: {', '.join(dict.fromkeys(commands))}")
            per[k] = {_norm(a): b for a, b in v.items()}
        else:
            common[_norm(k)] = v
    return common, per


def load_sources(folder: str | os.PathLike = ".", commands=()) -> list[Source]:
    """The config sources present in `folder`, lowest precedence first."""
    folder = Path(folder)
    out = []
    pp = folder / PYPROJECT
    if pp.exists():
        tool = (_read_toml(pp).get("tool") or {}).get("quantbench")
        if tool is not None:
            out.append(Source("pyproject.toml", pp, *_split(tool, f"{pp}: [tool.quantbench]", commands)))
    qt = folder / QUANTBENCH_TOML
    if qt.exists():
        data = _read_toml(qt)
        if DEFAULTS_TABLE in data:
            out.append(Source("quantbench.toml", qt, *_split(data[DEFAULTS_TABLE], f"{qt}: [{DEFAULTS_TABLE}]",
                                                              commands)))
    return out


def hosts_file_source(path, commands=(), folder: str | os.PathLike = ".") -> Source | None:
    """The `[defaults]` table of the hosts file `path` (a command line's --hosts-file) as a source above the folder's
    own; None when it has none, is not a regular file (the hosts file reader says why), or is ./quantbench.toml."""
    path = Path(path)
    if not path.is_file() or (Path(folder) / QUANTBENCH_TOML).resolve() == path.resolve():
        return None
    data = _read_toml(path, "hosts file")
    if DEFAULTS_TABLE not in data:
        return None
    src = Source(str(path), path, *_split(data[DEFAULTS_TABLE], f"{path}: [{DEFAULTS_TABLE}]", commands))
    if "hosts_file" in src.common or any("hosts_file" in t for t in src.per_command.values()):
        raise UserError(f"{path}: [{DEFAULTS_TABLE}] hosts-file: a hosts file cannot name another hosts file")
    return src


def option_actions(parser) -> dict:
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest not in ("help", "version")}


_SWITCHES = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction)


def _other_kind(action, value) -> bool:
    """Whether `value` is of another kind than the option takes (true/false for a value option, a value for a
    switch): a key shared by commands whose options differ in kind is not meant for this one."""
    return isinstance(action, _SWITCHES) != isinstance(value, bool)


def _confined(key: str, value, where: str) -> None:
    """A defaults table names where a command writes only inside the working folder. A leading `~` (a home
    folder, as a shell would expand it: outside the working folder) is refused, never made a folder named `~`."""
    if key in WRITE_KEYS and value not in (None, "") and (str(value).startswith("~") or inside(".", str(value)) is None):
        raise UserError(f"{where}: {value!r} is not a folder inside this working folder; a defaults file writes "
                        f"nowhere else: give --{key.replace('_', '-')} on the command line")


def _coerce(action, value, where: str):
    """A TOML value as argparse would have parsed it for this option."""
    flag = action.option_strings[-1]
    if isinstance(action, _SWITCHES):
        if not isinstance(value, bool):
            raise UserError(f"{where}: {flag} takes true or false (got {value!r})")
        return value
    if isinstance(action, argparse._CountAction):
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{where}: {flag} takes a count (got {value!r})")
        return value
    if isinstance(value, list):
        if action.nargs in ("+", "*"):
            return [_coerce_one(action, v, where, flag) for v in value]
        value = ",".join(str(v) for v in value)   # --hosts x86,pi
    elif action.nargs in ("+", "*"):
        return [_coerce_one(action, value, where, flag)]
    return _coerce_one(action, value, where, flag)


def _coerce_one(action, value, where, flag):
    if isinstance(value, (dict, list)) or isinstance(value, bool):
        raise UserError(f"{where}: {flag}: {value!r} is not a value for this option")
    text = str(value)
    try:
        out = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
        raise UserError(f"{where}: {flag} {text!r}: {exc}") from None
    if action.choices is not None and out not in action.choices:
        raise UserError(f"{where}: {flag} {text!r}: choose from {', '.join(map(str, action.choices))}")
    return out


def apply(parser, command: str, sources: list[Source], mixed=frozenset()) -> dict:
    """Set the parser's defaults from the sources; returns {dest: (value, source)} of what was set.

    A key no command knows is an error; a key this command lacks, or a shared key of `mixed` (options whose
    commands take different kinds of value) whose value is of another kind than this command's option takes, is
    skipped (it is for another command).
    """
    acts = option_actions(parser)
    chosen = {}
    for src in sources:   # lowest first: later sources overwrite
        for scope, table in (("", src.common), (f".{command}", src.per_command.get(command, {}))):
            for key, value in table.items():
                if key not in acts:
                    if scope:
                        raise UserError(f"{src.path}: [{defaults_table(src)}{scope}] {key}: `quantbench {command}` has no "
                                        f"option --{key.replace('_', '-')}")
                    continue
                where = f"{src.path}: [{defaults_table(src)}{scope}] {key}"
                if not scope and key in mixed and _other_kind(acts[key], value):
                    continue   # for the commands whose option takes this kind of value
                _no_code(key, value, where)
                _confined(key, value, where)
                chosen[key] = (_coerce(acts[key], value, where), f"{src.name} [{defaults_table(src)}{scope}]")
    if chosen:
        parser.set_defaults(**{k: v for k, (v, _) in chosen.items()})
    return chosen


def _no_code(key: str, value, where: str) -> None:
    """A defaults table is a file lying in a folder: it never allows or names a plug-in (quantbench.inputs.plugins)."""
    if key == "allow_plugins" or (key in ("decode", "preprocess") and is_ref(value)):
        raise UserError(f"{where}: a defaults table cannot name or allow plug-ins (code runs only when the command "
                        "line asks for it); pass it on the command line")


def defaults_table(src: Source) -> str:
    return "tool.quantbench" if src.name == "pyproject.toml" else DEFAULTS_TABLE


def check_known(sources: list[Source], known) -> None:
    """Every common key must be an option of at least one command (`known`: every command's option dests)."""
    for src in sources:
        for key in src.common:
            if key not in known:
                raise UserError(f"{src.path}: [{defaults_table(src)}] {key}: no command has an option "
                                f"--{key.replace('_', '-')}")


def effective(parsers: dict, sources: list[Source], builtin: dict, every: bool = False,
              mixed=frozenset()) -> list[dict]:
    """Rows for `quantbench config`: key, value per command, and the source of each value."""
    rows = []
    keys = list(SHOWN)
    if every:
        keys += sorted({d for p in parsers.values() for d in option_actions(p)} - set(keys))
    keys += sorted({k for s in sources for k in s.common} | {k for s in sources for t in s.per_command.values()
                                                             for k in t})   # every key a file sets
    keys = list(dict.fromkeys(keys))   # a key both an option and set by a file is one row
    for key in keys:
        per = []
        for cmd, p in parsers.items():
            acts = option_actions(p)
            if key not in acts:
                continue
            value, src = builtin[cmd].get(key), "built-in"
            for s in sources:
                if key in s.common and not (key in mixed and _other_kind(acts[key], s.common[key])):
                    value, src = s.common[key], f"{s.name} [{defaults_table(s)}]"
                if key in s.per_command.get(cmd, {}):
                    value, src = s.per_command[cmd][key], f"{s.name} [{defaults_table(s)}.{cmd}]"
            per.append({"command": cmd, "value": value, "source": src})
        if per:
            rows.append({"key": key, "commands": per})
    return rows


def effective_table(rows: list[dict]) -> str:
    """effective()'s rows as the text table `quantbench config` prints: a key per value and source, with the
    commands that take it."""
    table = []
    for r in rows:
        groups: dict = {}
        for c in r["commands"]:
            groups.setdefault((repr(c["value"]) if not isinstance(c["value"], str) else c["value"], c["source"]),
                              []).append(c["command"])
        for (value, src), cmds in groups.items():
            table.append([r["key"], value, src, ",".join(cmds)])
    return text_table(["key", "value", "source", "commands"], table, rule=True)
