"""The host kinds: one table, one entry per kind (HostKind), read by the hosts file's checks and make_host.

A kind is what a hosts file's `kind = "..."` names. Its entry says which options a hosts file may give it (the
required ones first), which of them are one word passed to a program, which are lists of strings, how its
options are completed (`complete`), whether quantbench installs onnxruntime for it (so `NAME@VERSION` applies)
and its host class, as `module:Class` (imported when a host is made, so this table imports no host module).

A host class implements the protocols of quantbench.hosts.process: AnyHost
(ready, describe, recorded_session, latency_refusal, runs_workers, ...) for every kind, and WorkerHost
(command, died_message, version_policy, max_workers, can_fork, ...) for a kind that starts workers, which
subclasses ProcessHost and overrides what differs; a kind that starts none (imported) writes AnyHost itself.

Adding a kind: write its host class in its own module, then add one HostKind to KINDS below.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from quantbench.errors import UserError
from quantbench.hosts import cpuprofiles, emulated, masked, runtimes


def _keep(name: str, opts: dict, where: str, base: Path) -> tuple[str, dict]:
    """Options that need no completion."""
    return "", opts


@dataclass(frozen=True)
class HostKind:
    """One host kind: its name, options, option completion and host class."""

    name: str
    #: `module:Class` of its host object (quantbench.hosts.registry.make_host)
    host_class: str
    required: tuple = ()
    optional: tuple = ()
    #: options that are one word passed to a program (never an option of it) -> what each names
    word_options: tuple = ()
    #: options that are lists of strings (arguments passed on)
    list_options: tuple = ()
    #: options that are whole numbers (checked by the kind's `complete`)
    int_options: tuple = ()
    #: options that may be one path or a non-empty list of paths
    path_lists: tuple = ()
    #: (host name, options, where, hosts file's folder) -> (kind, options): the options completed and checked
    #: (kind "": this one; an x86 tier may become another kind)
    complete: Callable = _keep
    #: quantbench installs onnxruntime for it, so it may run another version (`NAME@VERSION`)
    installs_runtime: bool = False
    #: its workers run on this machine's own CPU, plain or CPUID-masked (no emulation, no network)
    on_this_cpu: bool = False
    #: it is this machine as it is (no mask, no emulation): `hosts list` says "this machine"
    this_machine: bool = False
    #: an x86 tier may run as this kind, so a mechanism suffix (NAME:qemu, NAME:masked) applies to it
    tier_kind: bool = False
    #: a machine that shows an x86 tier masked on itself (NAME:TIER, hosts.remotetier)
    shows_tiers: bool = False
    #: what `hosts setup` makes ready for it: "qemu-root" (a guest root and runtime), "runtime" (another
    #: onnxruntime on this machine), "mask" (the CPUID mask's shim); "": nothing to set up
    setup_as: str = ""

    @property
    def options(self) -> tuple:
        return self.required + self.optional

    def host_type(self):
        """Its host class (imported now: the table imports no host module)."""
        module, cls = self.host_class.split(":")
        return getattr(importlib.import_module(module), cls)

    def word(self, key: str) -> str | None:
        """What a one-word option names, None when `key` is not one."""
        return dict(self.word_options).get(key)


def check_runtime(kind: str, options: dict, where: str) -> None:
    """A local or emulated host's `runtime` and `onnxruntime` options are valid (its preset's runtime is the
    default); else a one-line UserError at `where`."""
    default = emulated.PRESETS[options["preset"]].runtime if kind == "emulated" else "pypi"
    runtimes.runtime_of(options, default, where)


def _local(name: str, opts: dict, where: str, base: Path) -> tuple[str, dict]:
    check_runtime("local", opts, f"{where}: host {name!r}")
    return "", opts


def _emulated(name: str, opts: dict, where: str, base: Path) -> tuple[str, dict]:
    """An emulated host's preset (default: its name, which must be a preset)."""
    opts.setdefault("preset", name)
    presets = list(emulated.PRESETS)
    if opts["preset"] not in presets:
        raise UserError(f"{where}: host {name!r}: unknown preset {opts['preset']!r}; presets: {', '.join(presets)}")
    check_runtime("emulated", opts, f"{where}: host {name!r}")
    emulated.check_vector_bits(opts["preset"], opts, f"{where}: host {name!r}")
    return "", opts


def _ssh(name: str, opts: dict, where: str, base: Path) -> tuple[str, dict]:
    if "tier" in opts and opts["tier"] not in cpuprofiles.PROFILES:
        raise UserError(f"{where}: host {name!r}: unknown x86 tier {opts['tier']!r}; tiers: {', '.join(cpuprofiles.PROFILES)}")
    return "", opts


def _masked(name: str, opts: dict, where: str, base: Path) -> tuple[str, dict]:
    """An x86 tier: masked, or its qemu preset (the `mechanism` key, else what works here)."""
    opts.setdefault("profile", name)
    if opts["profile"] not in cpuprofiles.PROFILES:
        raise UserError(f"{where}: host {name!r}: unknown x86 tier profile {opts['profile']!r}; profiles: "
                        f"{', '.join(cpuprofiles.PROFILES)}")
    if opts.get("mechanism", "masked") not in masked.MECHANISMS:
        raise UserError(f"{where}: host {name!r}: mechanism {opts['mechanism']!r}; choose from "
                        f"{', '.join(masked.MECHANISMS)}")
    return masked.tier_choice(opts["profile"], opts.get("mechanism"))


def _imported(name: str, opts: dict, where: str, base: Path) -> tuple[str, dict]:
    """An imported host's file(s) made absolute against the hosts file's folder."""
    files = [Path(f).expanduser() for f in (opts["file"] if isinstance(opts["file"], list) else [opts["file"]])]
    files = [str(f if f.is_absolute() else base / f) for f in files]
    opts["file"] = files if isinstance(opts["file"], list) else files[0]
    return "", opts


#: every host kind, in the order help and errors list them
KINDS = {k.name: k for k in (
    HostKind("local", "quantbench.hosts.local:LocalHost", (), ("python", "onnxruntime", "runtime"),
             complete=_local, installs_runtime=True, on_this_cpu=True, this_machine=True, setup_as="runtime"),
    HostKind("emulated", "quantbench.hosts.emulated:EmulatedHost", (),
             ("preset", "qemu_args", "onnxruntime", "runtime") + emulated.VECTOR_KEYS,
             list_options=("qemu_args",), int_options=emulated.VECTOR_KEYS, complete=_emulated, installs_runtime=True, tier_kind=True,
             setup_as="qemu-root"),
    HostKind("ssh", "quantbench.hosts.ssh:SSHHost", ("address",), ("python", "ssh_options", "ssh", "tier"),
             word_options=(("address", "the destination (user@host or an ssh config alias)"),
                           ("python", "the remote interpreter")),
             list_options=("ssh_options",), complete=_ssh, shows_tiers=True),
    HostKind("imported", "quantbench.hosts.imported:ImportedHost", ("file",), ("host",), path_lists=("file",),
             complete=_imported),
    HostKind("masked", "quantbench.hosts.masked:MaskedHost", (), ("profile", "mechanism"), complete=_masked,
             on_this_cpu=True, tier_kind=True, setup_as="mask"),
)}


def kind_names() -> str:
    """The kinds as errors list them."""
    return ", ".join(KINDS)
