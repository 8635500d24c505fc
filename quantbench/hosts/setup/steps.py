"""Which steps a host needs, run in order: `hosts setup`, and a host's first use."""

from __future__ import annotations

import os
import sys
import platform

from quantbench.errors import UserError
from quantbench.hosts import emulated
from quantbench.hosts import runtimes
from quantbench.hosts.kinds import KINDS
from quantbench.hosts.setup.debootstrap import ensure_debian_runtime, ensure_root
from quantbench.hosts.setup.prefix import ensure_prefix, run_probe
from quantbench.hosts.setup.programs import SetupError
from quantbench.hosts.setup.qemu import ensure_qemu
from quantbench.hosts.setup.wheels import AARCH64_PLATFORMS, check_wheel, ensure_local_site, ensure_site


def setup_hosts(specs, progress: bool = True) -> list[str]:
    """Make the named hosts (registry.HostSpec) ready, idempotently: emulated hosts with the runtime each
    carries (a version's wheels, a Debian root), local hosts with another runtime; returns what was done."""
    pairs, local = [], []
    for spec in specs:
        way = KINDS[spec.kind].setup_as
        if way == "qemu-root":
            name = spec.options.get("preset", spec.name)
            pairs.append((name, emulated.runtime_of(name, spec.options)))
        elif way == "runtime" and not spec.options.get("python") and runtimes.runtime_of(spec.options).tag != "pypi-local":
            local.append(runtimes.runtime_of(spec.options, where=f"host {spec.name}"))
        else:
            raise UserError(f"hosts setup: host {spec.name!r} is kind {spec.kind} with its own onnxruntime; only "
                            "emulated hosts, masked x86 tiers and local hosts with another runtime need setup")
    actions = setup_emulated(pairs, progress) if pairs else []
    for rt in dict.fromkeys(local):
        _ensure_local_runtime(rt, progress, actions)
    return actions


def first_use_setup(host) -> bool:
    """Set up a host (a host object: name, kind, options) carrying a runtime other than the default (a
    version, a Debian root) at its first use, progress on stderr; False for a host on the default runtime
    (`quantbench hosts setup` prepares those)."""
    rt = getattr(host, "runtime", None)
    if rt is None or not (rt.debian or rt.version):
        return False
    for action in setup_hosts([host]):
        print(f"setup: {action}", file=sys.stderr, flush=True)
    return True


def _ensure_local_runtime(rt: runtimes.Runtime, progress: bool, actions: list[str]) -> None:
    """Another pip version for this interpreter, or a Debian root checked by importing its onnxruntime here."""
    if not rt.debian:
        ensure_local_site(rt.version, progress, actions)
        return
    made = not runtimes.debian_ready(rt.suite, platform.machine())[0]
    ensure_debian_runtime(rt.suite, platform.machine(), progress, actions)
    if made:
        argv, changes = runtimes.native_debian_command(rt.suite)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        check = run_probe(argv, dict(env, **changes), import_ort=True)
        if not runtimes.same_version(check.get("onnxruntime"), rt.ort_version()):
            raise SetupError(f"{runtimes.debian_root(rt.suite, platform.machine())}: its python3 imported onnxruntime "
                             f"{check.get('onnxruntime')}, not {rt.ort_version()}")
        actions.append(f"Debian {rt.suite} onnxruntime {check['onnxruntime']} starts here (numpy {check['numpy']})")


def _ensure_runtimes(presets: list, progress: bool, actions: list[str]) -> None:
    """The roots and wheel folders the (preset, runtime) pairs run from."""
    arm = [rt for p, rt in presets if p.arch == "aarch64"]
    if any(not rt.debian for rt in arm):
        ensure_root(progress, actions)
        ensure_site(progress, actions)  # the default prefixes are verified with the local version
    for p, rt in dict.fromkeys(presets):
        if p.arch == "aarch64" and rt.debian:
            ensure_debian_runtime(rt.suite, "aarch64", progress, actions)
        elif p.arch == "aarch64" and rt.version:
            ensure_site(progress, actions, rt.version)
        elif rt.debian:
            raise SetupError(f"{p.name}: a Debian runtime runs on ARM presets and on local hosts, not under "
                             f"qemu-{p.arch}")
        elif rt.version:
            ensure_local_site(rt.version, progress, actions)


def setup_emulated(pairs: list, progress: bool = True) -> list[str]:
    """Make each (preset name, runtime or None: its own) ready (idempotent); returns what was done."""
    presets = list(dict.fromkeys((emulated.preset(n), rt or emulated.runtime_of(n)) for n, rt in pairs))
    if not presets:
        return []
    actions: list[str] = []
    for p, rt in presets:  # a version without a wheel fails before anything is fetched
        if rt.version:
            check_wheel(rt.version, p.arch, emulated.GUEST_PYTHON_VERSION if p.arch == "aarch64" else
                        runtimes.local_python_version(), AARCH64_PLATFORMS if p.arch == "aarch64" else ())
    qemu = ensure_qemu(max(p.min_qemu for p, _ in presets), progress, actions)
    _ensure_runtimes(presets, progress, actions)
    failed = []
    for p, rt in presets:
        if tuple(qemu["version"]) < p.min_qemu:
            # Not an error: the other presets work; `hosts list` shows why this one is not ready.
            actions.append(f"{p.name}: not ready: {p.qemu_cpu} needs qemu >= {emulated.version_text(p.min_qemu)}, "
                           f"the qemu in use is {emulated.version_text(qemu['version'])} ({qemu['source']})")
            continue
        try:
            ensure_prefix(p.name, qemu, progress, actions, rt)
        except UserError as exc:  # the other presets still get set up
            failed.append(str(exc))
    if failed:
        for action in actions:
            print(action)
        raise SetupError("hosts setup failed for " + "; ".join(failed))
    return actions
