"""`quantbench hosts exec TIER -- COMMAND`: a whole command (a test suite, a user's script) under an x86 tier's
CPUID mask (quantbench.hosts.masked.process_env), and the workers that must take it off again (qemu guests and
other runtimes: quantbench.hosts.process.without_process_mask).

Needs the masked mechanism (gcc, objdump, x86-64: scripts/setup.sh); the qemu check needs the x86-avx2 preset.
A tier this CPU cannot show is a fact about the CPU: the tests use the lowest tier, which every x86-64 shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quantbench.hosts import cpuidpatch as C
from quantbench.hosts import cpuprofiles as P
from quantbench.hosts import emulated as E
from quantbench.hosts import masked as M
from quantbench.hosts.process import UNMASKED_ENV, without_process_mask
from setup_required import missing_setup, need_tier

TIER = "x86-sse4"
QB = [sys.executable, "-m", "quantbench"]


def _need_mask() -> None:
    need_tier(TIER)


def _exec(*cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*QB, "hosts", "exec", "--no-progress", TIER, "--", *cmd], capture_output=True,
                          text=True, timeout=600, **kw)


def test_the_whole_process_and_its_local_workers_see_the_tier(tmp_path):
    _need_mask()
    probe = ("import json, numpy, onnxruntime; from quantbench.hosts import masked, cpuidpatch; "
             "print(json.dumps({'numpy': numpy.__file__, 'ort': onnxruntime.__file__, "
             "'features': list(masked.here_features()), 'site': str(cpuidpatch.site_dir())}))")
    r = _exec(sys.executable, "-c", probe, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    site = str(C.site_dir())
    assert seen["numpy"].startswith(site) and seen["ort"].startswith(site)   # the masked copy, in-process
    assert "avx" not in seen["features"] and "sse4_2" in seen["features"]
    assert seen["site"] == site   # under the mask, the copy is still made from the original packages
    r = _exec(*QB, "hosts", "check", "x86", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    ident = json.loads(r.stdout)["identity"]
    assert ident["cpu_mechanism"] == "native-masked" and "avx" not in ident["isa_flags"]


def test_the_command_under_the_mask_writes_to_the_real_stderr(tmp_path):
    """`hosts exec` replaces itself with the command: the command's stderr is this one's, not the pipe quantbench's
    warning filter read (its thread does not survive the exec; a write to it was a broken pipe, exit 1, silent)."""
    _need_mask()
    r = _exec(sys.executable, "-c", "import sys; sys.stderr.write('to stderr\\n'); print('to stdout')", cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (0, "to stdout\n", "to stderr\n")


def test_a_masked_copy_built_under_the_mask_in_another_home_copies_the_originals(tmp_path):
    """A command under a mask whose QUANTBENCH_HOME is another folder (a CI job's own home) builds its masked copy
    from the interpreter's own onnxruntime and numpy, not from the mask's copy first on sys.path (that copy has no
    cpuid left to patch: its workers' mask would never take)."""
    _need_mask()
    probe = "from quantbench.hosts import cpuidpatch; print('\\n'.join(map(str, cpuidpatch._package_dirs())))"
    proc = _exec("env", f"QUANTBENCH_HOME={tmp_path / 'home'}", sys.executable, "-c", probe)
    assert proc.returncode == 0, proc.stderr
    dirs = proc.stdout.split()
    outer = os.path.realpath(C.masked_root()) + os.sep
    assert dirs and not [d for d in dirs if os.path.realpath(d).startswith(outer)], (dirs, outer)


def test_workers_without_the_masked_copy_take_the_mask_off(monkeypatch):
    _need_mask()
    before = without_process_mask(dict(os.environ))   # this test may itself run under a mask (hosts exec)
    monkeypatch.setattr(os, "environ", dict(before))
    env = M.process_env(TIER, progress=False)
    assert json.loads(env[UNMASKED_ENV])["LD_PRELOAD"] == before.get("LD_PRELOAD")
    monkeypatch.setattr(os, "environ", env)
    plain = without_process_mask(dict(env))
    assert not [k for k in plain if k.startswith("QUANTBENCH_CPUID_")]
    for key in ("LD_PRELOAD", "PYTHONPATH", "GLIBC_TUNABLES", "OPENBLAS_CORETYPE"):
        assert plain.get(key) == before.get(key), key
    ok, msg = E.ready("x86-avx2")
    if not ok:
        missing_setup(f"x86-avx2 not set up: {msg}")
    _, guest = E.python_command("x86-avx2")
    assert guest.get("LD_PRELOAD") == before.get("LD_PRELOAD") and UNMASKED_ENV not in guest
    assert str(C.site_dir()) not in guest.get("PYTHONPATH", "")


def test_a_mask_inside_a_mask_replaces_it(tmp_path):
    """`hosts exec A -- quantbench hosts exec B -- CMD` (a suite run under one tier that masks its own commands):
    CMD runs under B alone, and taking the mask off gives the environment from before A, not A's mask (before,
    a qemu guest or a cold-cache masked worker inherited A's shim and masked copy and failed without a word)."""
    need_tier("x86-avx2")
    _need_mask()
    plain = without_process_mask(dict(os.environ))
    probe = ("import json, os; from quantbench.hosts.process import without_process_mask as w; "
             "print(json.dumps({'env': {k: os.environ.get(k) for k in ('LD_PRELOAD', 'PYTHONPATH')}, "
             "'off': {k: w(dict(os.environ)).get(k) for k in ('LD_PRELOAD', 'PYTHONPATH')}, "
             "'tier': os.environ.get('QUANTBENCH_CPUID_PROFILE_NAME')}))")
    r = subprocess.run([*QB, "hosts", "exec", "--no-progress", "x86-avx2", "--", *QB, "hosts", "exec", "--no-progress",
                        TIER, "--", sys.executable, "-c", probe], capture_output=True, text=True, timeout=600,
                       cwd=tmp_path, env=plain)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert seen["tier"] == TIER
    assert seen["off"] == {k: plain.get(k) for k in ("LD_PRELOAD", "PYTHONPATH")}
    shims = seen["env"]["LD_PRELOAD"].split()
    assert shims.count(str(C.shim_path())) == 1 and seen["env"]["PYTHONPATH"].count(str(C.site_dir())) == 1


@pytest.mark.slow
def test_a_qemu_guest_under_the_mask_is_qemus_cpu(tmp_path):
    _need_mask()
    ok, msg = E.ready("x86-avx2")
    if not ok:
        missing_setup(f"x86-avx2 not set up: {msg}")
    r = _exec(*QB, "hosts", "check", "x86-avx2:qemu", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    ident = json.loads(r.stdout)["identity"]
    assert ident["cpu_mechanism"] == "qemu" and {"avx2", "fma"} <= set(ident["isa_flags"])


@pytest.mark.parametrize("args, words", [
    (["x86-nosuch", "--", "true"], "unknown x86 tier 'x86-nosuch'"),
    ([TIER], f"hosts exec {TIER}: name the command to run after --"),
    ([TIER, "--", "no-such-command-here"], "no-such-command-here: no such command"),
])
def test_a_bad_exec_is_one_line(tmp_path, args, words):
    r = subprocess.run([*QB, "hosts", "exec", *args], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and words in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert list(Path(tmp_path).iterdir()) == []


def test_a_tier_this_cpu_cannot_show_says_so(tmp_path):
    missing = [t for t, p in P.PROFILES.items() if P.missing_here(p, M.here_features())]
    if not missing:
        pytest.skip("this CPU shows every x86 tier (nothing it lacks to refuse)")
    r = subprocess.run([*QB, "hosts", "exec", missing[0], "--", "true"], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 2 and f"{missing[0]}: not available here: this CPU lacks" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
