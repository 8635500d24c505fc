"""One qemu -L prefix per preset, with a /proc/cpuinfo matching the emulated CPU, verified by importing onnxruntime
in the guest and reading back the MIDR and HWCAP (the guest probe)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from quantbench.fsutil import atomic_write_json, atomic_write_text, build_once, read_cached_json
from quantbench.hosts import emulated
from quantbench.hosts import runtimes
from quantbench.hosts.keys import local_ort_version
from quantbench.worker import ARM64_HWCAP, ARM64_HWCAP2, X86_FLAGS, decode_bits, x86_identity
from quantbench.hosts.setup.programs import ProbeDied, SetupError, say, waiting


# Top-level folders of the arm64 root NOT linked into a prefix: paths the guest opens
# there (temporary files, home folders, /proc, /dev) must resolve to the host's.
PREFIX_SKIP = {"proc", "sys", "dev", "run", "tmp", "home", "root", "mnt", "media", "srv", "opt", "boot"}
BOGOMIPS = "108.00"  # what a Raspberry Pi 4/5 kernel reports; informational only


# Runs in the guest: what the emulated process sees (auxv, /proc/cpuinfo, x86 CPUID).
PROBE = r'''
import json, platform, struct, sys
out = {"arch": platform.machine()}
try:
    data = open("/proc/self/auxv", "rb").read()
    for i in range(0, len(data) - 15, 16):
        k, v = struct.unpack_from("<QQ", data, i)
        if k == 16: out["hwcap"] = v
        if k == 26: out["hwcap2"] = v
except OSError:
    pass
try:
    out["cpuinfo"] = open("/proc/cpuinfo").read()
except OSError:
    out["cpuinfo"] = ""
if platform.machine() == "aarch64":  # PR_SVE_GET_VL, PR_SME_GET_VL: the vector lengths in bits, 0 when absent
    import ctypes
    prctl = ctypes.CDLL(None).prctl
    for key, option in (("sve_vector_bits", 51), ("sme_vector_bits", 64)):
        got = prctl(option, 0, 0, 0, 0)
        out[key] = (got & 0xffff) * 8 if got > 0 else 0
if platform.machine() in ("x86_64", "AMD64"):
    import ctypes, mmap
    code = bytes([0x53, 0x49, 0x89, 0xd0, 0x89, 0xf8, 0x89, 0xf1, 0x0f, 0xa2, 0x41, 0x89, 0x00,
                  0x41, 0x89, 0x58, 0x04, 0x41, 0x89, 0x48, 0x08, 0x41, 0x89, 0x50, 0x0c, 0x5b, 0xc3])
    buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(code)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p)(
        ctypes.addressof(ctypes.c_char.from_buffer(buf)))
    regs = (ctypes.c_uint32 * 4)()
    def cpuid(leaf, sub=0):
        fn(leaf, sub, ctypes.addressof(regs))
        return list(regs)
    out["cpuid"] = {}
    top = cpuid(0)[0]
    for leaf, sub in ((0, 0), (1, 0), (7, 0), (7, 1), (0xd, 1)):
        if leaf <= top:
            out["cpuid"]["%x.%x" % (leaf, sub)] = cpuid(leaf, sub)
    ext = cpuid(0x80000000)[0]
    for leaf in (0x80000001, 0x80000002, 0x80000003, 0x80000004):
        if leaf <= ext:
            out["cpuid"]["%x.0" % leaf] = cpuid(leaf)
if "--import" in sys.argv:
    import onnxruntime, numpy
    out["onnxruntime"] = onnxruntime.__version__
    out["numpy"] = numpy.__version__
print("PROBE " + json.dumps(out))
'''


def run_probe(argv_prefix: list[str], env: dict, import_ort: bool, timeout: float = 600) -> dict:
    argv = argv_prefix + ["-c", PROBE] + (["--import"] if import_ort else [])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SetupError(f"guest probe `{' '.join(argv_prefix[:3])} ...` took longer than {timeout:.0f} s") from None
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")), None)
    if proc.returncode != 0 or line is None:
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise ProbeDied(f"guest probe `{' '.join(argv_prefix[:3])} ...` failed ({how}){': ' + tail if tail else ''}",
                        proc.returncode)
    return json.loads(line[len("PROBE "):])


def arm_features(hwcap: int, hwcap2: int) -> list[str]:
    """Feature names in the kernel's /proc/cpuinfo order (HWCAP bits, then HWCAP2 bits)."""
    return decode_bits(hwcap, ARM64_HWCAP) + decode_bits(hwcap2, ARM64_HWCAP2)


def arm_cpuinfo(p: emulated.Preset, features: list[str], cpus: int) -> str:
    block = (f"BogoMIPS\t: {BOGOMIPS}\nFeatures\t: {' '.join(features)}\nCPU implementer\t: 0x{p.implementer:02x}\n"
             f"CPU architecture: 8\nCPU variant\t: 0x{p.variant:x}\nCPU part\t: 0x{p.part:03x}\n"
             f"CPU revision\t: {p.revision}\n")
    return "".join(f"processor\t: {i}\n{block}\n" for i in range(cpus))


def x86_cpuinfo(cpuid: dict, cpus: int) -> tuple[str, list[str]]:
    """A /proc/cpuinfo naming the emulated model, with the flags its CPUID reports."""
    ident = x86_identity(cpuid)
    flags = [name for leaf, reg, bit, name in X86_FLAGS if name in ident["flags"]]
    block = (f"vendor_id\t: {ident['vendor_id']}\ncpu family\t: {ident['cpu_family']}\nmodel\t\t: {ident['model']}\n"
             f"model name\t: {ident['model_name']}\nstepping\t: {ident['stepping']}\nflags\t\t: {' '.join(flags)}\n")
    return "".join(f"processor\t: {i}\n{block}\n" for i in range(cpus)), flags


def _check_seen(p: emulated.Preset, seen_cpuinfo: str, features: list[str], vectors: dict | None = None) -> None:
    """The guest must see the preset's identity, features and (ARM) vector lengths, or the prefix is wrong."""
    missing = [f for f in p.expect_features if f not in features]
    extra = [f for f in p.absent_features if f in features]
    if missing or extra:
        raise SetupError(f"{p.name}: the guest on qemu -cpu {p.cpu_option} sees features {' '.join(features)}; "
                         f"expected {' '.join(p.expect_features)} and none of {' '.join(p.absent_features)}")
    want = {"sve_vector_bits": p.sve_bits, "sme_vector_bits": p.sme_bits}
    if vectors is not None and {k: vectors.get(k, 0) for k in want} != want:
        raise SetupError(f"{p.name}: the guest on qemu -cpu {p.cpu_option} has SVE {vectors.get('sve_vector_bits', 0)} "
                         f"and SME {vectors.get('sme_vector_bits', 0)} bits, not {p.sve_bits} and {p.sme_bits}")
    if p.part is not None and f"CPU part\t: 0x{p.part:03x}" not in seen_cpuinfo:
        got = re.search(r"CPU part\s*:\s*(\S+)", seen_cpuinfo)
        raise SetupError(f"{p.name}: the guest /proc/cpuinfo shows CPU part {got.group(1) if got else 'none'}, "
                         f"not 0x{p.part:03x}")


def _probe_guest(name: str, p, binary: str, tmp: Path, env: dict, cpus: int, progress: bool,
                 rt: runtimes.Runtime | None = None) -> tuple[list, str, list]:
    """The guest's argv under the prefix `tmp` (an arm64 prefix links the root of runtime `rt` in and points at
    its site; `env` is adjusted), and the /proc/cpuinfo text and features qemu's CPU model shows, probed without
    onnxruntime."""
    if p.arch == "aarch64":
        root = emulated.guest_root(rt)
        for entry in sorted(root.iterdir()):
            if entry.name not in PREFIX_SKIP:
                os.symlink(entry, tmp / entry.name)
        for k in ("PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV", "PYTHONPATH"):
            env.pop(k, None)
        if rt is None:
            env["PYTHONPATH"] = str(emulated.site_dir())
        env["PYTHONNOUSERSITE"] = "1"
        argv = [binary, "-cpu", p.cpu_option, "-L", str(tmp), str(emulated.guest_python(rt))]
        # First pass without onnxruntime (which would crash on qemu 7.2 without an ARM cpuinfo):
        # the HWCAP bits qemu gives this CPU model become the cpuinfo Features line.
        say(progress, f"{name}: probing qemu -cpu {p.cpu_option} ...")
        seen = run_probe(argv, env, import_ort=False)
        features = arm_features(seen.get("hwcap", 0), seen.get("hwcap2", 0))
        return argv, arm_cpuinfo(p, features, cpus), features
    argv = [binary, "-cpu", p.qemu_cpu, "-L", str(tmp), sys.executable]
    say(progress, f"{name}: probing qemu -cpu {p.qemu_cpu} (CPUID) ...")
    seen = run_probe(argv, env, import_ort=False)
    text, features = x86_cpuinfo(seen["cpuid"], cpus)
    return argv, text, features


def _prefix_key(p: emulated.Preset, binary: str, version: str, rt: runtimes.Runtime | None) -> dict:
    """What a prefix is made from (a change remakes it): qemu, the CPU model, the root (and the default site)."""
    key = {"qemu": binary, "qemu_version": version, "qemu_cpu": p.cpu_option, "midr": p.midr_text}
    if p.arch != "aarch64":
        return dict(key, root=None, site=sys.executable)
    if rt is not None and rt.debian:
        return dict(key, root=runtimes.read_stamp(emulated.guest_root(rt)), site=rt.tag)
    return dict(key, root=read_cached_json(emulated.root_stamp()), site=emulated.site_key(local_ort_version()))


def ensure_prefix(name: str, qemu: dict, progress: bool, actions: list[str], rt: runtimes.Runtime | None = None) -> dict:
    """The qemu -L prefix of preset `name` over the root of runtime `rt` (None or a pip runtime: the preset's
    own root), verified by importing onnxruntime in the guest."""
    p = emulated.preset(name)
    full = rt or emulated.runtime_of(name)
    rt = full if full.debian else None  # a pip runtime of any version runs on the preset's bookworm root
    binary = qemu[p.arch]["path"]
    version = emulated.version_text(emulated.qemu_version(binary))
    key = _prefix_key(p, binary, version, rt)
    final = emulated.prefix_dir(name, full)
    t0 = time.monotonic()

    def done() -> dict | None:
        stamp = read_cached_json(emulated.stamp_path(final))
        ok = stamp is not None and {k: stamp.get(k) for k in key} == key and (final / "proc" / "cpuinfo").exists()
        return stamp if ok else None

    def publish(stamp: dict) -> dict:
        atomic_write_json(emulated.stamp_path(final), stamp)
        failure = f"; onnxruntime does not start there ({stamp['import_failure']})" if stamp["import_failure"] else ""
        actions.append(f"{name}: prefix {final} for qemu {version} -cpu {p.cpu_option}; guest /proc/cpuinfo from "
                       f"{stamp['cpuinfo_source']}; features {' '.join(stamp['features'])}{failure} "
                       f"({time.monotonic() - t0:.0f} s)")
        return stamp

    return build_once(final, done, lambda tmp: _build_prefix(name, p, binary, tmp, rt, progress, key), publish,
                      waiting=waiting(progress, final))[0]


def _build_prefix(name: str, p: emulated.Preset, binary: str, tmp: Path, rt: runtimes.Runtime | None, progress: bool,
                  key: dict) -> dict:
    """Fill the prefix folder `tmp`: the root linked in, the /proc/cpuinfo of the CPU model; verified; its stamp."""
    (tmp / "proc").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QEMU_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(dict(p.env))
    argv, text, features = _probe_guest(name, p, binary, tmp, env, os.cpu_count() or 1, progress, rt)
    atomic_write_text(tmp / "proc" / "cpuinfo", text)
    check = _verify_import(name, p, argv, env, rt, progress)
    cpuinfo_source = "prefix" if check["cpuinfo"] == text else "qemu (emulated /proc/cpuinfo)"
    return dict(key, features=features, cpuinfo_source=cpuinfo_source, guest_onnxruntime=check.get("onnxruntime"),
                guest_numpy=check.get("numpy"), import_failure=check.get("import_failure"))


def _verify_import(name: str, p: emulated.Preset, argv: list, env: dict, rt: runtimes.Runtime | None, progress: bool) -> dict:
    """The guest's view with onnxruntime imported, checked against the preset. A Debian runtime that dies of
    SIGILL on this CPU is kept (its hosts report that it does not start), with `import_failure` saying so."""
    say(progress, f"{name}: importing onnxruntime in the guest to verify ...")
    try:
        check = run_probe(argv, env, import_ort=True)
    except ProbeDied as exc:
        if rt is None or exc.returncode != -signal.SIGILL:
            raise
        check = dict(run_probe(argv, env, import_ort=False), import_failure="SIGILL at import")
    vectors = None
    if p.arch == "aarch64":
        seen_features = arm_features(check.get("hwcap", 0), check.get("hwcap2", 0))
        vectors = check
    else:
        seen_features = (re.search(r"^flags\s*:\s*(.*)$", check["cpuinfo"], re.M) or [None, ""])[1].split()
    _check_seen(p, check["cpuinfo"], seen_features, vectors)
    want = rt.ort_version() if rt is not None else local_ort_version()
    if p.arch == "aarch64" and not check.get("import_failure") and not runtimes.same_version(check.get("onnxruntime"), want):
        raise SetupError(f"{name}: the guest imported onnxruntime {check.get('onnxruntime')}, not {want}")
    return check
