"""Host names -> host specs: built-ins, emulated presets, and the user's hosts file.

Built-ins: `local` and `x86` are this machine; every emulated preset (pi, pi4, pi3,
graviton2, graviton3, from quantbench.hosts.emulated.PRESETS) is an emulated host of that name;
every x86 tier (x86-sse4 ... x86-zen4, quantbench.hosts.cpuprofiles.PROFILES) is a masked host where
that works here, else its qemu preset (`NAME:masked` / `NAME:qemu` force one: split_mechanism).
The hosts file (`quantbench.toml` in the working folder, or --hosts-file) adds names, either at top level or under a `[hosts]` table;
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

from quantbench.errors import UserError, flag_mark
from quantbench.fsutil import MAX_SETTINGS_BYTES, canonical_json, parse_toml, read_user_text
from quantbench.hosts import cpuprofiles, emulated, masked, runtimes
from quantbench.inputs.configkeys import check_entries
from quantbench.hosts.deploy import HOST_SESSION_KEYS, check_host_session, deployed_session
from quantbench.hosts.kinds import KINDS, check_runtime, kind_names
from quantbench.hosts.process import AnyHost

DEFAULT_HOSTS_FILE = Path("quantbench.toml")
#: where host names come from unless a caller says (`hosts check`): the hosts parameter, a flag on the command line
HOSTS_OPTION = flag_mark("hosts")
@dataclass(frozen=True)
class HostSpec:
    """A host as the user named it: name, kind (local | emulated | ssh | imported), kind options."""

    name: str
    kind: str
    options: dict = field(default_factory=dict, hash=False, compare=True)
    #: where it was defined: "built-in", "preset", or "FILE:LINE"
    origin: str = "built-in"
    #: the session options the hosts file sets for it (providers, threads, ...; quantbench.hosts.deploy)
    session: dict = field(default_factory=dict, hash=False, compare=True)


def preset_names() -> list[str]:
    return list(emulated.PRESETS)


def builtin_hosts() -> dict[str, HostSpec]:
    out = {
        "local": HostSpec("local", "local", {}, "built-in"),
        "x86": HostSpec("x86", "local", {}, "built-in"),
    }
    for name in preset_names():
        out[name] = HostSpec(name, "emulated", {"preset": name}, "preset")
    for name, options in runtimes.NATIVE_PRESETS.items():
        out[name] = HostSpec(name, "local", dict(options), "preset", dict(runtimes.NATIVE_SESSIONS.get(name, {})))
    for name in cpuprofiles.PROFILES:  # x86 tiers: masked natively where that works, else qemu (hosts.masked)
        kind, opts = masked.tier_choice(name, None)
        out[name] = HostSpec(name, kind, opts, "preset")
    return out


def split_mechanism(name: str) -> tuple[str, str | None]:
    """`NAME[:MECH]` -> (NAME, MECH or None): how an x86 tier runs, `masked` or `qemu`; or, after an ssh
    machine's name, the x86 tier it shows (`box:x86-avx2`)."""
    base, sep, mech = name.partition(":")
    if not sep:
        return name, None
    if mech not in masked.MECHANISMS and mech not in cpuprofiles.PROFILES:
        raise UserError(f"host {name!r}: {mech!r} is neither a mechanism ({', '.join(masked.MECHANISMS)}) nor an "
                        f"x86 tier ({', '.join(cpuprofiles.PROFILES)})")
    return base, mech


def _on_machine(spec: HostSpec, label: str, tier: str) -> HostSpec:
    """An x86 tier shown by an ssh machine, masked there (hosts.remotetier)."""
    if not KINDS[spec.kind].shows_tiers:
        raise UserError(f"host {label!r}: a tier after a host's name needs an ssh host (the machine that shows it); "
                        f"{spec.name} is {spec.kind}")
    return HostSpec(label, spec.kind, dict(spec.options, tier=tier), spec.origin, dict(spec.session))


def _with_mechanism(spec: HostSpec, label: str, mech: str | None) -> HostSpec:
    """The spec of a tier host run the named way (`label` is its name, e.g. x86-avx2:qemu)."""
    profile = spec.options.get("profile") or (spec.name if spec.name in cpuprofiles.PROFILES else None)
    if profile not in cpuprofiles.PROFILES or not KINDS[spec.kind].tier_kind:
        raise UserError(f"host {label!r}: a mechanism suffix applies only to the x86 tiers "
                        f"({', '.join(cpuprofiles.PROFILES)})")
    kind, opts = masked.tier_choice(profile, mech)
    return HostSpec(label, kind, opts, spec.origin, dict(spec.session))


_KEY_LINE = re.compile(r'^\s*(?:\[\s*(?:hosts\.)?)?(?:"([^"]*)"|([^\s="\[\]]+))\s*(?:=|\])')


def _line_index(text: str) -> dict[str, int]:
    """name -> the first line defining it (`name = ...`, `"name" = ...`, `[name]`, `[hosts.name]`), in one pass."""
    out: dict[str, int] = {}
    for i, line in enumerate(text.splitlines(), 1):
        m = _KEY_LINE.match(line)
        if m:
            out.setdefault(m.group(1) if m.group(1) is not None else m.group(2), i)
    return out


def load_hosts_file(path: str | os.PathLike | None = None) -> dict[str, HostSpec]:
    """Host specs defined in the hosts file (empty if the default file does not exist)."""
    explicit = path is not None
    path = Path(path) if explicit else DEFAULT_HOSTS_FILE
    text = _read_hosts_file(path, explicit)
    if text is None:
        return {}
    return hosts_from_text(path, text, path.parent.resolve())


def _read_hosts_file(path: Path, explicit: bool) -> str | None:
    """The file's text; None when the default file is absent (a named one must exist)."""
    if not path.exists():
        if explicit:
            raise UserError(f"{path}: hosts file not found")
        return None
    return read_user_text(path, "hosts file", MAX_SETTINGS_BYTES)


def hosts_from_text(path: Path, text: str, base: Path) -> dict[str, HostSpec]:
    """The checked host specs of a hosts file's text; `path` names it in errors, `base` anchors relative files."""
    builtins, lines = builtin_names(), _line_index(text)
    return {name: _host_spec(name, entry, f"{path}:{lines.get(name, 0)}", base, builtins)
            for name, entry in _host_entries(parse_toml(path, text)).items()}


def _host_entries(data: dict) -> dict:
    """name -> entry: the `[hosts]` table if there is one, else the top level; `[defaults]` holds option
    defaults (quantbench.cli.config), never a host."""
    entries = data.get("hosts") if isinstance(data.get("hosts"), dict) else data
    return {k: v for k, v in entries.items() if k != "defaults"}


def _host_spec(name: str, entry, where: str, base: Path, builtins: set[str]) -> HostSpec:
    """One entry checked in a fixed order (the first problem is the one reported) and completed."""
    kind, override = _check_entry(name, entry, where)
    session = check_host_session(name, entry, where)
    opts = {k: v for k, v in entry.items() if k not in ("kind", "override") + HOST_SESSION_KEYS}
    _check_options(name, kind, opts, where)
    if name in builtins and not override:
        raise UserError(f"{where}: host {name!r} is a built-in host; a hosts file redefines it only with "
                        f"`override = true` in its table (or use another name)")
    entry_kind = KINDS[kind]
    kind, opts = entry_kind.complete(name, dict(opts), where, base)
    kind = kind or entry_kind.name
    for key in entry_kind.list_options:
        if key in opts and not (isinstance(opts[key], list) and all(isinstance(a, str) for a in opts[key])):
            raise UserError(f"{where}: host {name!r}: {key} must be a list of strings")
    return HostSpec(name, kind, opts, where, session)


def check_host_name(name, where: str) -> str:
    """A host name as a hosts file may define it (letters, digits, '.', '_', '-'; not 'all'), else a UserError."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name) or name in ("all",):
        raise UserError(f"{where}: host name {name!r}: use letters, digits, '.', '_' or '-'")
    return name


def _check_entry(name: str, entry, where: str) -> tuple[str, bool]:
    """(kind, override) of an entry that is a table with a usable name and a known kind."""
    if not isinstance(entry, dict):
        raise UserError(f"{where}: host {name!r} must be a table like {{ kind = \"ssh\", address = \"user@host\" }}")
    check_host_name(name, where)
    kind = entry.get("kind")
    if kind not in KINDS:
        raise UserError(f"{where}: host {name!r}: kind {kind!r}; choose from {kind_names()}")
    override = entry.get("override", False)
    if not isinstance(override, bool):
        raise UserError(f"{where}: host {name!r}: override must be true or false")
    return kind, override


def _check_options(name: str, kind: str, opts: dict, where: str) -> None:
    """Only the kind's options, each a string (but the argument lists), the required ones present."""
    entry = KINDS[kind]
    required, optional = entry.required, entry.optional
    unknown = sorted(set(opts) - set(required) - set(optional))
    if unknown:
        raise UserError(f"{where}: host {name!r}: unknown option(s) {', '.join(unknown)} for kind {kind}; "
                        f"known: {', '.join(required + optional + HOST_SESSION_KEYS)}")
    for key, value in opts.items():
        if key in entry.path_lists and isinstance(value, list):  # the shards of one run
            if not value or not all(isinstance(v, str) and v for v in value):
                raise UserError(f"{where}: host {name!r}: {key} must be a path or a list of paths (got {value!r:.40})")
        elif key in entry.int_options:  # its kind's `complete` checks the number
            continue
        elif key not in entry.list_options and not isinstance(value, str):
            raise UserError(f"{where}: host {name!r}: {key} must be a string (got {value!r:.40})")
        elif key not in entry.list_options and not value.strip():
            raise UserError(f"{where}: host {name!r}: {key} is empty; give a value or leave the key out")
    missing = [k for k in required if not opts.get(k)]
    if missing:
        raise UserError(f"{where}: host {name!r}: kind {kind} needs {', '.join(missing)}")
    for key, names in entry.word_options:
        if str(opts.get(key, "")).startswith("-"):
            raise UserError(f"{where}: host {name!r}: {key} {opts[key]!r} must not start with '-' ({key} names "
                            f"{names}, never an option; ssh options go in ssh_options)")


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


def resolve_hosts(names: list[str], hosts_file: str | os.PathLike | None = None, option: str = HOSTS_OPTION) -> list[HostSpec]:
    """Specs for `names` in order (duplicates dropped); an unknown name lists the known ones."""
    hosts = known_hosts(hosts_file)
    out, seen = [], set()
    for raw in names:
        name = raw.strip()
        if not name or name in seen:
            continue
        base, version = split_version(name, option)
        base, mech = split_mechanism(base)
        if base not in hosts:
            raise UserError(f"{option}: unknown host {base!r}; known hosts: {', '.join(sorted(hosts))} "
                            f"(define others in {hosts_file or DEFAULT_HOSTS_FILE})")
        seen.add(name)
        if mech in cpuprofiles.PROFILES:
            spec = _on_machine(hosts[base], f"{base}:{mech}", mech)
        else:
            spec = _with_mechanism(hosts[base], base + ':' + mech, mech) if mech else hosts[base]
        out.append(with_version(spec, version, name, option))
    if not out:
        raise UserError(f"{option}: no host named; e.g. {option} x86,pi")
    return out


def split_version(name: str, option: str = HOSTS_OPTION) -> tuple[str, str | None]:
    """`NAME@VERSION` -> (NAME, VERSION): the onnxruntime version a host runs (None: its own)."""
    base, sep, version = name.partition("@")
    if not sep:
        return name, None
    return base, runtimes.check_version(version, f"{option} {name!r}")


def with_version(spec: HostSpec, version: str | None, label: str, option: str = HOSTS_OPTION) -> HostSpec:
    """`spec` running onnxruntime `version` under the name `label` (its results are kept apart from the
    host's own): only hosts quantbench installs onnxruntime for (local, emulated) carry another version."""
    if version is None:
        return spec
    where = f"{option} {label!r}"
    if not KINDS[spec.kind].installs_runtime or spec.options.get("python"):
        raise UserError(f"{where}: host {spec.name!r} runs its own onnxruntime (kind {spec.kind}"
                        f"{', python ' + spec.options['python'] if spec.options.get('python') else ''}); "
                        "a version can be put on local and emulated hosts only")
    options = dict(spec.options, onnxruntime=version)
    check_runtime(spec.kind, options, where)
    return HostSpec(label, spec.kind, options, spec.origin, dict(spec.session))


#: session option names an override sets directly; any other KEY is an onnxruntime session config entry
SESSION_KEYS = ("intra_op_num_threads", "inter_op_num_threads", "execution_mode", "graph_optimization_level", "batch",
                "providers")
#: the commands whose --hosts items may carry session overrides (the others run every host under one session)
OVERRIDE_COMMANDS = "localize, noise, remedy, latency and hosts check"


@dataclass
class HostRequest:
    """One `--hosts` item: the text as written (`label`), its host spec, the normalised session it runs under."""

    label: str
    spec: HostSpec
    session: dict


def parse_hosts(text: str, base_session: dict | None = None, hosts_file: str | os.PathLike | None = None,
                option: str = HOSTS_OPTION, overrides: bool = True) -> list[HostRequest]:
    """The one parser of `--hosts`: comma-separated `NAME` or `NAME+KEY=VALUE[+KEY=VALUE...]` items.

    KEY is a session option (SESSION_KEYS) or an onnxruntime session config entry
    (session.x64quantprecision, ...); it overrides `base_session` for that item only, which overrides the
    host's own deployed session (its preset and hosts-file keys: hosts.deploy.deployed_session).
    Every command parses its hosts here, so one bad item reads the same everywhere;
    `overrides=False` (run, equiv: one session for every host) refuses `+KEY=VALUE`
    after the item parsed. Identical items (same host, same session) count once.
    """
    out, seen = [], set()
    for item in [t.strip() for t in (text or "").split(",") if t.strip()]:
        name, *items = [part.strip() for part in item.split("+")]
        spec = resolve_hosts([name], hosts_file, option=option)[0]
        session = deployed_session(spec, base_session)
        session["config_entries"] = dict(session["config_entries"])
        given_entries: list = []
        for ov in items:
            key, sep, value = (x.strip() for x in ov.partition("="))
            if not sep or not key:
                raise UserError(f"{option} {item!r}: override {ov!r} must be KEY=VALUE, e.g. x86+session.x64quantprecision=1")
            if key == "providers":  # in priority order, '/'-separated: x86+providers=DnnlExecutionProvider/CPUExecutionProvider
                session[key] = [p.strip() for p in value.split("/") if p.strip()]
            elif key in SESSION_KEYS:
                session[key] = value
            else:
                given = [(k, v) for k, v in given_entries if k == key] + [(key, value)]
                check_entries(given, f"{option} {item!r}")   # known key, one line, not empty, one value
                given_entries.append((key, value))
                session["config_entries"][key] = value
        if items and not overrides:
            raise UserError(f"{option} {item!r}: per-host session overrides (NAME+KEY=VALUE) are taken by "
                            f"{OVERRIDE_COMMANDS}; this command runs every host under one session: "
                            f"name the host alone and set the session with {flag_mark('session_config')} KEY=VALUE / {flag_mark('graph_opt')}")
        session = deployed_session(spec, session)
        if (spec.name, canonical_json(session)) not in seen:
            seen.add((spec.name, canonical_json(session)))
            out.append(HostRequest(item, spec, session))
    if not out:
        raise UserError(f"{option}: no host named; e.g. {option} x86,pi")
    return out


def make_host(spec: HostSpec) -> AnyHost:
    """The host object for a spec: its kind's host class (quantbench.hosts.kinds.KINDS)."""
    if spec.kind not in KINDS:
        raise UserError(f"host {spec.name}: unknown kind {spec.kind!r}; choose from {kind_names()}")
    return KINDS[spec.kind].host_type()(name=spec.name, kind=spec.kind, options=dict(spec.options))
