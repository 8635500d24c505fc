"""Host names -> host specs: built-ins, emulated presets, and the user's hosts file.

Built-ins: `local` and `x86` are this machine; every emulated preset (pi, pi4, pi3,
graviton2, graviton3, x86-avx2, x86-sse4, from quantbench.hosts.emulated.PRESETS) is
an emulated host of that name. The hosts file (`quantbench.toml` in the working
folder, or --hosts-file) adds names, either at top level or under a `[hosts]` table;
it redefines a built-in name only with `override = true` in that host's table, so
a hosts file lying in a working folder cannot silently take over `x86` or `pi`:

    pi     = { kind = "ssh", address = "pi@robot.local", python = "python3", override = true }
    lab    = { kind = "emulated", preset = "pi4" }
    airgap = { kind = "imported", file = "pi-results.qbr" }

`run` and `equiv` print which hosts file they read and what it defines (hosts_file_line).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from quantbench.errors import UserError
from quantbench.hosts import emulated
from quantbench.hosts.local import EmulatedHost, LocalHost
from quantbench.hosts.ssh import SSHHost

DEFAULT_HOSTS_FILE = Path("quantbench.toml")
KINDS = ("local", "emulated", "ssh", "imported")

# Options each kind accepts (required ones first).
KIND_OPTIONS = {
    "local": ((), ("python",)),
    "emulated": ((), ("preset", "qemu_args")),
    "ssh": (("address",), ("python", "ssh_options", "ssh")),
    "imported": (("file",), ("host",)),
}

# Fallback preset names when quantbench.hosts.emulated is not importable (the contract's list).
@dataclass(frozen=True)
class HostSpec:
    """A host as the user named it: name, kind (local | emulated | ssh | imported), kind options."""

    name: str
    kind: str
    options: dict = field(default_factory=dict, hash=False, compare=True)
    #: where it was defined: "built-in", "preset", or "FILE:LINE"
    origin: str = "built-in"


def preset_names() -> list[str]:
    return list(emulated.PRESETS)


def builtin_hosts() -> dict[str, HostSpec]:
    out = {
        "local": HostSpec("local", "local", {}, "built-in"),
        "x86": HostSpec("x86", "local", {}, "built-in"),
    }
    for name in preset_names():
        out[name] = HostSpec(name, "emulated", {"preset": name}, "preset")
    return out


def _line_of(text: str, name: str) -> int:
    pats = [rf"^\s*{re.escape(name)}\s*=", rf'^\s*"{re.escape(name)}"\s*=', rf"^\s*\[\s*(hosts\.)?{re.escape(name)}\s*\]"]
    for i, line in enumerate(text.splitlines(), 1):
        if any(re.match(p, line) for p in pats):
            return i
    return 0


def load_hosts_file(path: str | os.PathLike | None = None) -> dict[str, HostSpec]:
    """Host specs defined in the hosts file (empty if the default file does not exist)."""
    import tomllib

    explicit = path is not None
    path = Path(path) if explicit else DEFAULT_HOSTS_FILE
    if not path.exists():
        if explicit:
            raise UserError(f"{path}: hosts file not found")
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read the hosts file ({exc})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        if m:
            line = int(m.group(1))
            src = text.splitlines()[line - 1].strip() if line <= len(text.splitlines()) else ""
            raise UserError(f"{path}:{line}: not valid TOML ({msg[:m.start()].strip()}, column {m.group(2)}): {src!r}") from None
        raise UserError(f"{path}: not valid TOML ({msg})") from None
    entries = data.get("hosts") if isinstance(data.get("hosts"), dict) else data
    # [defaults] holds option defaults (quantbench.config), never a host
    entries = {k: v for k, v in entries.items() if k != "defaults"}
    base = path.parent.resolve()
    builtins = builtin_names()
    out = {}
    for name, entry in entries.items():
        where = f"{path}:{_line_of(text, name)}"
        if not isinstance(entry, dict):
            raise UserError(f"{where}: host {name!r} must be a table like {{ kind = \"ssh\", address = \"user@host\" }}")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name) or name in ("all",):
            raise UserError(f"{where}: host name {name!r}: use letters, digits, '.', '_' or '-'")
        kind = entry.get("kind")
        if kind not in KINDS:
            raise UserError(f"{where}: host {name!r}: kind {kind!r}; choose from {', '.join(KINDS)}")
        override = entry.get("override", False)
        if not isinstance(override, bool):
            raise UserError(f"{where}: host {name!r}: override must be true or false")
        required, optional = KIND_OPTIONS[kind]
        opts = {k: v for k, v in entry.items() if k not in ("kind", "override")}
        unknown = sorted(set(opts) - set(required) - set(optional))
        if unknown:
            raise UserError(f"{where}: host {name!r}: unknown option(s) {', '.join(unknown)} for kind {kind}; "
                            f"known: {', '.join(required + optional) or 'none'}")
        for key, value in opts.items():  # every option but the argument lists is one string
            if key not in ("ssh_options", "qemu_args") and not isinstance(value, str):
                raise UserError(f"{where}: host {name!r}: {key} must be a string (got {value!r:.40})")
        missing = [k for k in required if not opts.get(k)]
        if missing:
            raise UserError(f"{where}: host {name!r}: kind {kind} needs {', '.join(missing)}")
        if name in builtins and not override:
            raise UserError(f"{where}: host {name!r} is a built-in host; a hosts file redefines it only with "
                            f"`override = true` in its table (or use another name)")
        if kind == "emulated":
            opts.setdefault("preset", name)
            presets = preset_names()
            if opts["preset"] not in presets:
                raise UserError(f"{where}: host {name!r}: unknown preset {opts['preset']!r}; presets: {', '.join(presets)}")
        if kind == "imported":
            f = Path(opts["file"]).expanduser()
            opts["file"] = str(f if f.is_absolute() else base / f)
        for key in ("ssh_options", "qemu_args"):
            if key in opts and not (isinstance(opts[key], list) and all(isinstance(a, str) for a in opts[key])):
                raise UserError(f"{where}: host {name!r}: {key} must be a list of strings")
        out[name] = HostSpec(name, kind, opts, where)
    return out


def builtin_names() -> set[str]:
    return set(builtin_hosts())


def hosts_file_path(hosts_file: str | os.PathLike | None = None) -> Path | None:
    """The hosts file that will be read: --hosts-file, else ./quantbench.toml if present, else None."""
    if hosts_file is not None:
        return Path(hosts_file)
    return DEFAULT_HOSTS_FILE if DEFAULT_HOSTS_FILE.exists() else None


def hosts_file_line(hosts_file: str | os.PathLike | None = None) -> str | None:
    """'hosts file: ./quantbench.toml (defines: board1, x86 [overrides built-in])', or None without one."""
    path = hosts_file_path(hosts_file)
    if path is None:
        return None
    specs = load_hosts_file(path)
    builtins = builtin_names()
    names = [n + (" [overrides built-in]" if n in builtins else "") for n in sorted(specs)]
    shown = path if path.is_absolute() or str(path).startswith(".") else f"./{path}"
    return f"hosts file: {shown} (defines: {', '.join(names) or 'no hosts'})"


def announce_hosts_file(hosts_file=None, to_stderr: bool = False) -> None:
    """Print hosts_file_line (a command's first output line; on stderr when stdout is JSON)."""
    import sys

    line = hosts_file_line(hosts_file)
    if line:
        print(line, file=sys.stderr if to_stderr else sys.stdout, flush=True)


def known_hosts(hosts_file: str | os.PathLike | None = None) -> dict[str, HostSpec]:
    """Every host name usable here: built-ins and presets, overridden by the hosts file."""
    hosts = builtin_hosts()
    hosts.update(load_hosts_file(hosts_file))
    return hosts


def resolve_hosts(names: list[str], hosts_file: str | os.PathLike | None = None, option: str = "--hosts") -> list[HostSpec]:
    """Specs for `names` in order (duplicates dropped); an unknown name lists the known ones."""
    hosts = known_hosts(hosts_file)
    out, seen = [], set()
    for raw in names:
        name = raw.strip()
        if not name or name in seen:
            continue
        if name not in hosts:
            raise UserError(f"{option}: unknown host {name!r}; known hosts: {', '.join(sorted(hosts))} "
                            f"(define others in {hosts_file or DEFAULT_HOSTS_FILE})")
        seen.add(name)
        out.append(hosts[name])
    if not out:
        raise UserError(f"{option}: no host named; e.g. {option} x86,pi")
    return out


def make_host(spec: HostSpec):
    """The host object for a spec (LocalHost, EmulatedHost, SSHHost or ImportedHost)."""
    if spec.kind == "local":
        return LocalHost(spec.name, "local", dict(spec.options))
    if spec.kind == "emulated":
        # the model travels as bytes: no path lookups through qemu's -L prefix
        return EmulatedHost(spec.name, "emulated", dict(spec.options), model_by_path=False)
    if spec.kind == "ssh":
        return SSHHost(spec.name, "ssh", dict(spec.options), model_by_path=False)
    if spec.kind == "imported":
        from quantbench.hosts.imported import ImportedHost
        return ImportedHost(spec.name, dict(spec.options))
    raise UserError(f"host {spec.name}: unknown kind {spec.kind!r}; choose from {', '.join(KINDS)}")
