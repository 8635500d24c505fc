"""Masked x86 tiers (quantbench.hosts.masked): the patched copy, the CPUID shim, the tier names and mechanisms,
the fingerprint's check of the mask, crashes that stay crashes, and outputs byte-identical to qemu's.

The masked tests need gcc + objdump on an x86-64 machine (scripts/setup.sh); the comparisons also need the
qemu presets x86-avx2 and x86-sse4 (`quantbench hosts setup --all`). Missing setup skips here and fails under
CI (tests/setup_required.py).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from quantbench.errors import UserError
from quantbench.hosts import cpuidpatch as C
from quantbench.hosts import cpuprofiles as P
from quantbench.hosts import emulated as E
from quantbench.hosts import masked as M
from quantbench.hosts.process import without_process_mask
from quantbench.hosts.registry import hosts_from_text, make_host, resolve_hosts
from quantbench.hosts.workerclient import WorkerClient
from quantbench.worker import masked_problem
from setup_required import missing_setup, need_tier


def _need_masked(name: str = "x86-avx2") -> P.Profile:
    need_tier(name)
    M.setup_masked(progress=False)
    return P.PROFILES[name]


def _need_qemu(preset: str) -> None:
    ok, msg = E.ready(preset)
    if not ok:
        missing_setup(f"{preset} not set up: {msg}")


# --------------------------------------------------------------------------- profiles and names


def test_profiles_only_take_features_away_and_mask_glibc_alike():
    avx2, sse4 = P.PROFILES["x86-avx2"], P.PROFILES["x86-sse4"]
    assert {"avx2", "fma"} <= set(avx2.features) and not {f for f in avx2.features if "avx512" in f}
    fields = P.encode(avx2).split(",")
    assert fields[0] == "GenuineIntel" and int(fields[1], 16) == 0x306C3
    assert int(fields[4], 16) & (1 << 5) and not int(fields[4], 16) & (1 << 16)  # 7.0 EBX: AVX2 kept, AVX512F cleared
    assert not int(fields[8], 16) & 0xE0  # no AVX-512 XSAVE state for Haswell
    assert "-AVX512F" in P.glibc_hwcaps(avx2) and "-AVX2" not in P.glibc_hwcaps(avx2)
    assert {"-AVX", "-AVX2", "-FMA"} <= set(P.glibc_hwcaps(sse4).split("=")[1].split(","))
    assert not int(P.encode(sse4).split(",")[2], 16) & (1 << 27 | 1 << 28)  # no OSXSAVE, no AVX
    missing = P.missing_here(P.PROFILES["x86-amx"], ["avx2", "fma"])
    assert "amx_int8" in missing and "avx2" not in missing


def test_tier_names_choose_and_force_a_mechanism(tmp_path):
    p = P.PROFILES["x86-avx2"]
    auto = resolve_hosts(["x86-avx2"])[0]
    assert auto.kind == ("masked" if M.masked_unavailable(p) is None else "emulated")
    forced = resolve_hosts(["x86-avx2:qemu", "x86-avx2:masked"])
    assert [(s.name, s.kind) for s in forced] == [("x86-avx2:qemu", "emulated"), ("x86-avx2:masked", "masked")]
    assert forced[0].options == {"preset": "x86-avx2"}
    ok, msg = make_host(resolve_hosts(["x86-vnni:qemu"])[0]).ready()
    assert not ok and "qemu has no CPU model" in msg
    with pytest.raises(UserError, match="applies only to the x86 tiers"):
        resolve_hosts(["pi:qemu"])
    with pytest.raises(UserError, match=r"'fast' is neither a mechanism \(masked, qemu\) nor an x86 tier"):
        resolve_hosts(["x86-avx2:fast"])
    text = 'old = { kind = "masked", profile = "x86-avx2", mechanism = "qemu" }\nbad = { kind = "masked", profile = "x86-p4" }\n'
    with pytest.raises(UserError, match=r"hosts.toml:2: host 'bad': unknown x86 tier profile 'x86-p4'"):
        hosts_from_text(tmp_path / "hosts.toml", text, tmp_path)
    specs = hosts_from_text(tmp_path / "hosts.toml", text.splitlines()[0], tmp_path)
    assert specs["old"].kind == "emulated" and specs["old"].options == {"preset": "x86-avx2"}


def test_a_tier_this_cpu_cannot_show_is_not_available_with_the_reason():
    amx = P.PROFILES["x86-amx"]
    missing = P.missing_here(amx, M.here_features())
    ok, msg = make_host(resolve_hosts(["x86-amx"])[0]).ready()
    if not missing:  # a Sapphire Rapids (or later) machine shows it
        assert ok or "this CPU lacks" not in msg
        return
    assert not ok and msg.startswith("not available here: this CPU lacks") and "amx_int8" in msg


def test_hosts_shown_prints_the_tiers_this_cpu_shows_and_says_why_of_the_others(capsys):
    """What a CI runner's tier step runs: the tiers whose features this CPU has, one a line on stdout; of each other
    one, why, on stderr; exit 0 either way (a fact of the CPU); an unknown tier is a one-line error."""
    from quantbench.cli import main

    need_tier("x86-sse4")  # the mechanism works here (x86-64, gcc, objdump)
    shown = [t for t, p in P.PROFILES.items() if not P.missing_here(p, M.here_features())]
    assert main(["hosts", "shown"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == shown
    assert [ln.split(":")[0] for ln in err.splitlines()] == [t for t in P.PROFILES if t not in shown]
    assert all("this CPU lacks" in ln for ln in err.splitlines())
    assert main(["hosts", "shown", "x86-amx", "x86-sse4"]) == 0
    assert capsys.readouterr().out.splitlines() == [t for t in ("x86-amx", "x86-sse4") if t in shown]
    assert main(["hosts", "shown", "x86-nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown x86 tier 'x86-nope'" in err and len(err.strip().splitlines()) == 1


def test_hosts_shown_on_a_smaller_cpu_and_on_an_arm_runner(capsys, monkeypatch):
    """A CPU without AVX-512 (a Haswell's features: what this machine may not be, so its CPUID answer is replaced)
    shows the tiers within them; an ARM runner shows none, each line saying so, and one line that none is shown."""
    from quantbench.cli import main

    need_tier("x86-sse4")
    haswell = tuple(P.PROFILES["x86-avx2"].features)
    monkeypatch.setattr(M, "here_features", lambda: haswell)
    assert main(["hosts", "shown"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [t for t, p in P.PROFILES.items() if not P.missing_here(p, haswell)]
    assert "x86-avx2" in out and "x86-avx512" not in out and "x86-amx" not in out
    monkeypatch.setattr(M.platform, "machine", lambda: "aarch64")
    assert main(["hosts", "shown"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines()[-1] == "no x86 tier shown here"
    assert all(ln.endswith("masked x86 tiers need an x86-64 machine (this is aarch64)")
               for ln in err.splitlines()[:-1]) and len(err.splitlines()) == len(P.PROFILES) + 1


# --------------------------------------------------------------------------- the patched copy


def test_patching_replaces_each_cpuid_instruction_and_nothing_else(tmp_path):
    if not (shutil.which("gcc") and shutil.which("objdump")):
        missing_setup("gcc and objdump are needed to build and patch a test library")
    src = tmp_path / "lib.c"
    src.write_text(textwrap.dedent("""
        const unsigned char not_code[] = {0x0f, 0xa2, 0x0f, 0xa2};
        unsigned leaf0(void) { unsigned a = 0, b, c = 0, d; __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d)); return b; }
        unsigned leaf1(void) { unsigned a = 1, b, c = 0, d; __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d)); return c; }
    """))
    lib = tmp_path / "lib.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    before = lib.read_bytes()
    result = C.patch_file(lib)
    after = lib.read_bytes()
    assert result["cpuid_sites"] == 2 and len(result["offsets"]) == 2
    assert all(before[o:o + 2] == C.CPUID and after[o:o + 2] == C.UD2 for o in result["offsets"])
    changed = [i for i in range(len(before)) if before[i] != after[i]]
    assert changed == sorted(o + 1 for o in result["offsets"])  # only the A2 -> 0B bytes
    assert after.count(bytes([0x0F, 0xA2, 0x0F, 0xA2])) == 1  # the data array is untouched
    stamp = {"files": {"lib.so": result}}
    assert C.verify(tmp_path, stamp) is None
    recorded = {"files": {"lib.so": dict(result, state=C.file_state(lib))}}
    assert C.verify(tmp_path, recorded) is None   # untouched since recorded: its sites are read, not the file
    lib.write_bytes(before)
    assert "changed since it was patched" in C.verify(tmp_path, stamp)
    assert "changed since it was patched" in C.verify(tmp_path, recorded)  # a write changes the state: hashed


def test_cpuid_found_from_function_entries_equals_the_whole_linear_sweep(tmp_path):
    """Each 0F A2 decoded from its function's entry (the unwind table's) up to an instruction past it: an lea whose
    displacement holds 0F A2 just after a real cpuid is not read as one (a window stopping inside the lea made
    objdump decode its cut bytes alone), and the sites equal a whole-file sweep's, here and on numpy's libraries."""
    if not (shutil.which("gcc") and shutil.which("objdump")):
        missing_setup("gcc and objdump are needed to build and patch a test library")
    src = tmp_path / "lib.c"
    src.write_text(textwrap.dedent("""
        unsigned leaf0(void) { unsigned a = 0, b, c = 0, d; __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d)); return b; }
        unsigned leaf1(void) { unsigned a = 1, b, c = 0, d; __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d)); return c; }
        void in_lea(void) { __asm__ volatile(".byte 0x48, 0x8d, 0x35, 0x0f, 0xa2, 0x00, 0x00" ::: "rsi"); }
    """))   # the lea last: its window's end is the file's last
    lib = tmp_path / "lib.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    data = lib.read_bytes()
    assert data.count(C.CPUID) >= 3 and C.cpuid_windows(data) is not None   # windows, not the fallback
    assert len(C.cpuid_addresses(lib)) == 2 and C.cpuid_addresses(lib) == C.cpuid_addresses_whole(lib)
    numpy_libs = [p for d in C._package_dirs() if d.name.startswith("numpy") for p in sorted(d.rglob("*.so*"))
                  if p.is_file() and not p.is_symlink() and C.is_elf(p) and p.stat().st_size < 2_000_000]
    found = {p.name: C.cpuid_addresses(p) for p in numpy_libs}
    assert sum(map(len, found.values())) > 0, found   # numpy's CPU dispatch asks cpuid
    assert found == {p.name: C.cpuid_addresses_whole(p) for p in numpy_libs}


def test_each_masked_copy_has_its_own_stamp():
    a, b = C.stamp_path("aaaa"), C.stamp_path("bbbb")
    assert a != b and a.name.endswith("-aaaa.json") and a.parent == C.site_dir("aaaa").parent.parent


def test_no_c_compiler_for_the_shim_is_one_line_and_makes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", str(tmp_path / "nobin"))
    monkeypatch.delenv("CC", raising=False)
    with pytest.raises(UserError, match=r"^masked hosts need a C compiler \(gcc\) to build the CPUID shim"):
        C.ensure_shim()
    assert not (tmp_path / "home").exists()  # not even its lock


def test_the_masked_copy_and_the_shim_are_built_once():
    _need_masked()
    assert M.setup_masked(progress=False) == []  # idempotent: nothing to do the second time
    site, stamp, built = C.ensure_site()
    assert not built and C.verify(site, stamp) is None
    ort = [f for f in stamp["files"] if f.startswith("onnxruntime/") and "pybind11_state" in f]
    assert ort and stamp["files"][ort[0]]["cpuid_sites"] > 10


def test_a_process_checks_the_masked_copy_once(monkeypatch):
    """Each masked worker start asks for the copy; the package files are listed and the libraries hashed once
    per process (they cost ~0.5 s per masked host of a run), and the copy found is still the checked one."""
    _need_masked()
    monkeypatch.setattr(C, "_ONCE", {})
    listed, checked = [], []
    real_files, real_verify = C._source_files, C.verify
    monkeypatch.setattr(C, "_source_files", lambda dirs: listed.append(dirs) or real_files(dirs))
    monkeypatch.setattr(C, "verify", lambda site, stamp: checked.append(site) or real_verify(site, stamp))
    sites = {C.ensure_site()[0] for _ in range(3)}
    _argv, env, _ = make_host(resolve_hosts(["x86-avx2:masked"])[0]).command()
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(sites.pop()) and not sites
    assert len(listed) == 1 and len(checked) == 1


def test_the_masked_copy_carries_its_own_bytecode():
    """Compiled where it lives, so a worker that may not write bytecode (PYTHONDONTWRITEBYTECODE) does not compile
    numpy and onnxruntime at every start, and a traceback names the copy's files."""
    import importlib.util
    import marshal

    _need_masked()
    site = C.ensure_site()[0]
    for src in (site / "numpy" / "__init__.py", site / "onnxruntime" / "__init__.py"):
        pyc = Path(importlib.util.cache_from_source(str(src)))
        assert pyc.is_file(), pyc
        assert marshal.loads(pyc.read_bytes()[16:]).co_filename == str(src)


# --------------------------------------------------------------------------- the worker under a mask


def test_a_masked_worker_sees_only_the_profile():
    _need_masked("x86-avx2")
    with WorkerClient(resolve_hosts(["x86-avx2:masked"])[0]) as hs:
        ident = hs.frame["fingerprint"]["identity"]
    isa = set(ident["isa_flags"])
    assert {"avx2", "fma", "sse4_2"} <= isa and not {f for f in isa if f.startswith(("avx512", "amx", "avx_vnni"))}
    assert ident["cpu_mechanism"] == "native-masked" and ident["cpu"]["profile"] == "x86-avx2"
    assert ident["cpu"]["vendor_id"] == "GenuineIntel" and ident["cpu"]["model"] == "60"
    assert "i7-4770" in ident["cpu"]["model_name"] and ident["cpu"]["proc_cpuinfo"]  # the kernel's view kept apart
    assert "AVX2" in ident["numpy_cpu_features"] and "AVX512F" not in ident["numpy_cpu_features"]


def test_a_masked_worker_runs_from_a_home_reached_through_a_symbolic_link(monkeypatch, tmp_path):
    """QUANTBENCH_HOME (or ~/.cache) a symbolic link to another folder, as a home on another disk often is: the shim
    found the patched sites by the home's path as given while /proc/self/maps names the real one, so the first
    patched cpuid killed every masked worker with SIGILL."""
    from quantbench.inputs.assets import quantbench_home

    _need_masked("x86-avx2")
    link = tmp_path / "home-link"
    link.symlink_to(quantbench_home().resolve(), target_is_directory=True)
    monkeypatch.setenv("QUANTBENCH_HOME", str(link))
    with WorkerClient(resolve_hosts(["x86-avx2:masked"])[0]) as hs:
        ident = hs.frame["fingerprint"]["identity"]
    assert ident["cpu_mechanism"] == "native-masked" and "avx512f" not in ident["isa_flags"]


@pytest.mark.slow
def test_a_masked_worker_runs_from_a_home_whose_path_is_longer_than_200_characters(monkeypatch, tmp_path):
    """A QUANTBENCH_HOME deep in a runner's work folders (a CI job's home under pytest's per-worker temp folders):
    the shim kept 199 characters of each library's path, matched none of the patched sites, and every masked
    worker died with SIGILL."""
    _need_masked("x86-avx2")
    copy, stamp, shim = C.site_dir().parent, C.stamp_path(), C.shim_path()
    home = tmp_path / ("runner-" + "r" * 80) / ("job-" + "j" * 80)
    monkeypatch.setenv("QUANTBENCH_HOME", str(home))
    # the machine's masked copy, copied (not linked: the shim reads real paths) as a runner's restored cache
    # holds it, with its list of sites for the long path; building it there again took 35 s
    shutil.copytree(copy, C.site_dir().parent, symlinks=True)
    shutil.copy2(stamp, C.stamp_path())
    shutil.copy2(shim, C.shim_path())
    C.write_sites(C.site_dir(), json.loads(C.stamp_path().read_text()), C.sites_path())
    assert M.setup_masked(progress=False) == [] and C.site_dir().is_relative_to(home)  # in place: nothing built
    with WorkerClient(resolve_hosts(["x86-avx2:masked"])[0]) as hs:
        ident = hs.frame["fingerprint"]["identity"]
    assert len(str(home)) > 200 - len("/masked/1.32.0-0123456789abcdef/site/onnxruntime/capi/x.so")
    assert ident["cpu_mechanism"] == "native-masked" and "avx512f" not in ident["isa_flags"]


def test_a_mask_that_does_not_take_fails_with_one_clear_line(monkeypatch, tmp_path):
    """The masked copy not on sys.path: numpy and onnxruntime load unpatched, and the fingerprint refuses."""
    _need_masked("x86-sse4")  # any CPU that can run it has AVX or more for the mask to hide
    # unmasked to start with: under a whole-process mask (`hosts exec`) its copy would still be on the path
    monkeypatch.setattr(os, "environ", without_process_mask(dict(os.environ)))
    real = M.worker_env
    monkeypatch.setattr(M, "worker_env", lambda p, site, shim: real(p, tmp_path, shim))
    with pytest.raises(UserError) as exc:
        WorkerClient(resolve_hosts(["x86-sse4:masked"])[0]).open()
    msg = str(exc.value)
    assert "\n" not in msg and "the CPUID mask did not take: numpy still sees AVX" in msg
    assert masked_problem(["avx2"], ["AVX2"], 0).startswith("onnxruntime's library never executed")


CRASH = r'''
import ctypes, mmap, sys
what = sys.argv[1]
if what.startswith("faulthandler"):
    import faulthandler
    faulthandler.enable()
import numpy, onnxruntime  # the patched libraries trap through the shim
lib = ctypes.CDLL(None)
regs = (ctypes.c_uint32 * 4)()
lib.qb_cpuid(0, 0, regs)
lib.qb_trap_count.restype = ctypes.c_ulong
print("VENDOR", bytes(regs)[4:8] + bytes(regs)[12:16] + bytes(regs)[8:12], lib.qb_trap_count(b"onnxruntime") > 0, flush=True)
if what.endswith("segv"):
    ctypes.string_at(0)
buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(b"\x0f\x0b\xc3")  # a real ud2, outside any patched library
ctypes.CFUNCTYPE(None)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))()
'''


@pytest.mark.parametrize("what,signal,message", [
    ("ud2", -4, ""), ("segv", -11, ""),
    ("faulthandler-ud2", -4, "Fatal Python error: Illegal instruction"),
    ("faulthandler-segv", -11, "Fatal Python error: Segmentation fault")])
def test_a_real_crash_stays_a_crash_and_faulthandler_chains(what, signal, message):
    p = _need_masked("x86-avx2")
    env = M.worker_env(p, C.site_dir(), C.shim_path())
    proc = subprocess.run([sys.executable, "-c", CRASH, what], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == signal, proc.stderr[-2000:]
    assert "VENDOR b'GenuineIntel' True" in proc.stdout  # the mask works before and after faulthandler
    assert message in proc.stderr


def test_a_trap_that_was_in_a_patched_library_stays_a_crash(tmp_path):
    """A ud2 the compiler put in a library (__builtin_trap) is not a patched cpuid: it still ends the process."""
    p = _need_masked("x86-avx2")
    root = tmp_path / "site"
    root.mkdir()
    src = tmp_path / "lib.c"
    src.write_text("unsigned vendor(void) { unsigned a = 0, b, c = 0, d; __asm__ volatile(\"cpuid\" : \"+a\"(a), "
                   "\"=b\"(b), \"+c\"(c), \"=d\"(d)); return b; }\nvoid trap(void) { __builtin_trap(); }\n")
    lib = root / "lib.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    stamp = {"files": {"lib.so": C.patch_file(lib)}}
    assert stamp["files"]["lib.so"]["cpuid_sites"] == 1 and lib.read_bytes().count(C.UD2) >= 2
    C.write_sites(root, stamp, tmp_path / "cpuid-sites.tsv")
    env = M.worker_env(p, root, C.shim_path())
    code = (f"import ctypes; lib = ctypes.CDLL({str(lib)!r}); print('EBX', hex(lib.vendor()), flush=True); "
            "lib.trap()")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "EBX 0x756e6547" in proc.stdout  # "Genu": the patched cpuid answered with the profile's vendor
    assert proc.returncode == -4, proc.stderr[-1000:]


def test_a_worker_that_crashes_is_reported_as_a_crash(tmp_path):
    """Through the host: a worker killed by a real SIGILL ends with the signal in the message."""
    p = _need_masked("x86-avx2")
    host = make_host(resolve_hosts(["x86-avx2:masked"])[0])
    argv, env, _ = host.command()
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    from quantbench.hosts.process import WorkerConnection, WorkerDied

    client = WorkerConnection([sys.executable, "-u", str(script), "faulthandler-ud2"], env, "x86-avx2")
    with pytest.raises(WorkerDied) as exc:
        list(client.request({"type": "fingerprint"}))
    assert "killed by signal 4" in str(exc.value) and p.name == "x86-avx2"
    client.close()


def test_hosts_setup_takes_masked_tiers_and_lists_them(capsys):
    from quantbench.cli import main

    _need_masked("x86-avx2")
    assert main(["hosts", "setup", "x86-avx2:masked", "--no-progress"]) == 0
    assert "nothing to do: already set up" in capsys.readouterr().out
    assert main(["hosts", "setup", "x86"]) == 2
    assert ("host 'x86' is kind local with its own onnxruntime; only emulated hosts, masked x86 tiers and local "
            "hosts with another runtime need setup") in capsys.readouterr().err
    assert main(["hosts", "list"]) == 0
    rows = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("x86-")}
    assert "masked" in rows["x86-avx2"] and "native-masked: AVX2 + FMA3" in rows["x86-avx2"]


def test_setting_up_a_tier_this_cpu_cannot_show_is_refused_in_one_line(workdir, capsys):
    """`hosts setup x86-zen4` on a CPU without its AVX-512 said "nothing to do: already set up", exit 0: no setup
    can make a CPUID mask add features. The tier is taken from this machine's own features."""
    from cli_helpers import digest, one_line
    from quantbench.cli import main
    from quantbench.hosts import cpuprofiles
    from quantbench.hosts.masked import masked_unavailable

    lacking = [n for n, p in cpuprofiles.PROFILES.items() if (masked_unavailable(p) or "").startswith("this CPU lacks")]
    if not lacking:
        pytest.skip("this CPU shows every x86 tier")
    name = lacking[-1]
    before = digest(workdir)
    assert main(["hosts", "setup", name, "--no-progress"]) == 2
    line = one_line(capsys.readouterr().err, "hosts")
    assert line.startswith(f"quantbench hosts: error: hosts setup {name}: this CPU lacks ") and \
        "no setup makes this CPU show it" in line, line
    assert digest(workdir) == before
