"""`quantbench hosts list | check NAME | setup NAME... | --all | exec TIER -- COMMAND | shown [TIER...]`."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

from quantbench.cli.console import before_exec
from quantbench.cli.groups import FleetArgs, SessionArgs
from quantbench.errors import UserError
from quantbench.hosts import cpuprofiles
from quantbench.hosts import emulated
from quantbench.hosts.deploy import deployed_session, describe
from quantbench.hosts.keys import cpu_summary, local_probe_sha256
from quantbench.hosts.masked import check_showable, masked_unavailable, process_env, setup_masked, shown_tiers
from quantbench.hosts.kinds import KINDS
from quantbench.hosts.registry import HostSpec, known_hosts, make_host, parse_hosts, resolve_hosts
from quantbench.hosts.workerclient import WorkerClient
from quantbench.hosts.setup import setup_hosts
from quantbench.textfmt import text_table

HELP = "List hosts and whether each is ready, check one with a smoke job, or set up emulated hosts."


FLEET = FleetArgs(hosts=False)
SESSION = SessionArgs(" of the check")


def add_arguments(p) -> None:
    FLEET.add(p)
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    sub.add_parser("list", help="presets and configured hosts, their kind, and whether each is ready",
                   description="Presets and configured hosts, their kind, and whether each is ready.")
    c = sub.add_parser("check", help="run a smoke job on a host and print its fingerprint",
                       description="Run a smoke job (fingerprint + a tiny model) on a host and print its fingerprint.")
    c.add_argument("name", help="host name; NAME+KEY=VALUE sets a session option or config entry for the check, "
                                "e.g. x86+session.x64quantprecision=1")
    SESSION.add(c)
    c.add_argument("--json", action="store_true", help="print the whole fingerprint as JSON")
    s = sub.add_parser("setup", help="prepare hosts: qemu-user, an arm64 Python root, the runtime each carries, "
                                     "the masked x86 tiers (idempotent)",
                       description="Prepare emulated hosts and local hosts with another runtime: qemu-user, an arm64 "
                                   "Python root, onnxruntime wheels of the host's version (NAME@VERSION; default: the "
                                   "local one) or a Debian root (pi-xnnpack, pi-debian, x86-dnnl); and masked x86 "
                                   "tiers: the CPUID shim and the masked copy of onnxruntime + numpy. Idempotent; "
                                   "prints what it did and the time it took.")
    s.add_argument("names", nargs="*", help="host names (presets, x86 tiers, NAME@VERSION, or hosts-file entries)")
    s.add_argument("--all", action="store_true", help="every preset, and the masked tiers where they work")
    x = sub.add_parser("exec", help="run a command as if this machine were an x86 tier (CPUID-masked, whole process)",
                       description="Run COMMAND with this CPU masked as TIER for the whole process: its numpy and "
                                   "onnxruntime (and the local host's workers) dispatch that tier's kernels; qemu "
                                   "guests and other runtimes keep their own CPU. For example `quantbench hosts exec "
                                   "x86-avx2 -- python -m pytest` runs a test suite as on a Haswell.")
    x.add_argument("tier", help="an x86 tier this CPU can show (`quantbench hosts list`)")
    x.add_argument("cmd", nargs=argparse.REMAINDER, metavar="COMMAND", help="the command and its arguments (after --)")
    w = sub.add_parser("shown", help="the x86 tiers this CPU shows masked, one a line (why not for the others)",
                       description="Print the x86 tiers this CPU can show (CPUID-masked), one a line on stdout, and for "
                                   "each tier it cannot show a line on stderr saying why (a fact of the CPU, not an "
                                   "error: exit 0). The tier jobs of `quantbench ci` decide with it on the runner.")
    w.add_argument("tiers", nargs="*", help="tiers to consider (default: every tier)")


def _ready(spec) -> tuple[bool, str]:
    try:
        return make_host(spec).ready()
    except UserError as exc:
        return False, str(exc)


def do_list(args) -> int:
    hosts = known_hosts(FLEET.parse(args).hosts_file)
    rows = [("host", "kind", "defined", "ready", "session", "detail")]
    for name, spec in hosts.items():
        ok, msg = _ready(spec)
        detail = msg
        kind = KINDS[spec.kind]
        if "preset" in kind.options and spec.options.get("preset", name) != name:
            detail = f"preset {spec.options['preset']}; {msg}"
        if kind.this_machine and ok:
            detail = "this machine" + (f"; {msg}" if msg != "ready" else "")
        session = describe(deployed_session(spec)) if kind.host_type().runs_workers else "as recorded in its file"
        rows.append((name, spec.kind, spec.origin, "yes" if ok else "no", session, detail))

    print(text_table(rows[0], rows[1:]))
    return 0


def do_check(args) -> int:
    import time

    given = SESSION.parse(args)
    requests = parse_hosts(args.name, given.overrides(), FLEET.parse(args).hosts_file, option="hosts check")
    if len(requests) != 1:
        raise UserError(f"hosts check {args.name!r}: name one host (it checks one at a time)")
    [req] = requests
    spec, session = req.spec, req.session
    host = make_host(spec)
    if not host.runs_workers:  # an imported file: checked (every hash), nothing to start
        ok, msg = host.ready()
        if not ok:
            raise UserError(f"host {spec.name}: {msg}")
        print(f"{spec.name}: {msg}")
        return 0
    t0 = time.monotonic()
    with WorkerClient(spec, session, given.require_providers, label=req.label, host=host) as hs:
        fp = hs.frame
    seconds = time.monotonic() - t0
    expect = local_probe_sha256()
    f = fp["fingerprint"]
    ident = f["identity"]
    if args.json:
        print(json.dumps(dict(f, fingerprint_id=fp["fingerprint_id"], host=spec.name, kind=spec.kind), indent=2, sort_keys=True))
        return 0
    ort_info = ident.get("onnxruntime", {})
    probe = (fp.get("probe_sha256") or [""])[0]
    lines = [
        ("host", f"{req.label} ({host.describe()})"),
        ("fingerprint", fp["fingerprint_id"]),
        ("os / arch", f"{ident.get('os')} {ident.get('arch')} ({ident.get('libc')})"),
        ("cpu", cpu_summary(f)),
        ("isa flags", " ".join(ident.get("isa_flags", [])) or "-"),
        *([("vector lengths", f"SVE {ident['sve_vector_bits'] or 'none'}, SME {ident['sme_vector_bits'] or 'none'} "
                              "(bits, read inside the host by prctl)")] if "sve_vector_bits" in ident else []),
        ("onnxruntime", f"{ort_info.get('version')} ({ort_info.get('build_info') or 'no build info'})"),
        ("providers", f"requested {', '.join(session['providers'])}; resolved {', '.join(ident.get('resolved_providers', []))} "
                      f"(the session object's list; which provider ran each node is read from each run's profile)"),
        ("numpy / python", f"{ident.get('numpy')} / {ident.get('python')}"),
        ("session", json.dumps(session, sort_keys=True)),
        ("smoke job", f"probe output sha256 {probe[:16]}" + ("" if expect is None else
                      (" (same as this machine)" if probe == expect else " (differs from this machine)"))),
        ("took", f"{seconds:.1f} s"),
    ]
    w = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"{k.ljust(w)}  {v}")
    return 0


def do_setup(args) -> int:
    import time

    if args.all:
        specs = [spec for spec in known_hosts(FLEET.parse(args).hosts_file).values()
                 if spec.origin == "preset" and KINDS[spec.kind].setup_as != "mask"]
        specs += [HostSpec(n, "emulated", {"preset": n}, "preset") for n in emulated.PRESETS  # an x86 tier's qemu way
                  if n not in {s.name for s in specs}]
        masked = _masked_works_here()
    elif not args.names:
        raise UserError("hosts setup: name at least one emulated host, or pass --all")
    else:
        named = resolve_hosts(args.names, FLEET.parse(args).hosts_file, option="hosts setup")
        mask = [s for s in named if KINDS[s.kind].setup_as == "mask"]
        check_showable(mask, "hosts setup")
        specs, masked = [s for s in named if s not in mask], bool(mask)
    remote = [s for s in specs if KINDS[s.kind].shows_tiers and s.options.get("tier")]  # a tier on that machine
    specs = [s for s in specs if s not in remote]
    t0 = time.monotonic()
    progress = not args.no_progress
    done = (setup_hosts(specs, progress=progress) if specs else []) + (setup_masked(progress) if masked else [])
    done += [a for s in remote for a in make_host(s).setup_tier()]
    for action in done:
        print(action)
    print(f"set up in {time.monotonic() - t0:.0f} s" if done else "nothing to do: already set up")
    return 0


def _masked_works_here() -> bool:
    """Whether masked x86 tiers can run on this machine (`--all` then builds the masked copy and the shim)."""
    return any(masked_unavailable(p) is None for p in cpuprofiles.PROFILES.values())


def do_exec(args) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise UserError(f"hosts exec {args.tier}: name the command to run after --")
    if not shutil.which(cmd[0]):
        raise UserError(f"hosts exec {args.tier}: {cmd[0]}: no such command")
    env = process_env(args.tier, progress=not args.no_progress)
    before_exec()   # the command writes to the real stderr, not to this process's warning filter
    os.execvpe(cmd[0], cmd, env)  # the command's exit code is ours; nothing of this process is left


def do_shown(args) -> int:
    """The tiers this CPU shows on stdout, one a line (what a CI runner runs); each other one, why, on stderr."""
    shown = shown_tiers(args.tiers or list(cpuprofiles.PROFILES))
    for tier, why in shown:
        if why:
            print(f"{tier}: not shown here: {why}", file=sys.stderr)
        else:
            print(tier)
    if all(why for _, why in shown):
        print("no x86 tier shown here", file=sys.stderr)
    return 0


def run(args) -> int:
    return {"list": do_list, "check": do_check, "setup": do_setup, "exec": do_exec, "shown": do_shown}[args.action](args)
