"""Emulated hosts: qemu-user running a Python with onnxruntime on a chosen CPU model.

ARM presets run an arm64 Debian Python (an extracted debootstrap root) with aarch64
wheels of the *local* onnxruntime version; x86 presets run this machine's own
interpreter under qemu-x86_64 with a lower CPU model. Everything lives under
QUANTBENCH_HOME (see quantbench.hosts.setup, which builds it):

  tools/qemu.json                 which qemu is used (path, version, where it came from)
  tools/qemu-<version>/           qemu-aarch64 + qemu-x86_64 extracted from Debian's qemu-user
  arm64-root/bookworm/            the arm64 root (ROOT); arm64-root/bookworm.json its stamp
  wheels/<key>/                   aarch64 onnxruntime + numpy (SITE), keyed by the ORT version
  prefixes/<preset>/              qemu -L folder per preset: symlinks into ROOT + proc/cpuinfo
  pycache/arm64-<suite>-python<v>/  the arm64 Python's compiled modules (written by the workers)

Why a per-preset prefix: qemu resolves every absolute path the guest opens under
`-L PREFIX` first. qemu 7.2 does not emulate /proc/cpuinfo for aarch64 guests, so
onnxruntime's cpuinfo library reads the host's x86 text and crashes on import; a
PREFIX/proc/cpuinfo in ARM format fixes that and carries the preset's MIDR. qemu 10
emulates /proc/cpuinfo itself (with the same MIDR). For x86 presets the prefix holds
only proc/cpuinfo, so the guest's /proc/cpuinfo names the emulated model and flags
instead of the host's (the ISA onnxruntime dispatches on comes from CPUID either way).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from quantbench.inputs.assets import quantbench_home
from quantbench.errors import UserError
from quantbench.fsutil import read_cached_json
from quantbench.hosts import runtimes
from quantbench.hosts.keys import local_ort_version
from quantbench.hosts.process import WORKER_PATH, ProcessHost, without_process_mask
from quantbench.hosts.trace import run_probe

ROOT_SUITE = "bookworm"
GUEST_PYTHON_VERSION = "3.11"  # bookworm's python3; the aarch64 wheels are fetched for it


@dataclass(frozen=True)
class Preset:
    """One emulated CPU: the qemu model, and what a guest fingerprint should show on it."""

    name: str
    arch: str  # "aarch64" | "x86_64"
    qemu_cpu: str
    description: str
    implementer: int | None = None  # ARM MIDR fields, as qemu's model reports them
    variant: int | None = None
    part: int | None = None
    revision: int | None = None
    min_qemu: tuple[int, int, int] = (7, 2, 0)
    fingerprint_hint: str = ""
    #: features a guest must see (ARM: HWCAP names; x86: /proc/cpuinfo flag names)
    expect_features: tuple[str, ...] = field(default=())
    #: features a guest must not see
    absent_features: tuple[str, ...] = field(default=())
    #: extra environment for the guest process
    env: tuple[tuple[str, str], ...] = field(default=())
    #: where its onnxruntime comes from (quantbench.hosts.runtimes): "pypi" or "debian:SUITE"
    runtime: str = "pypi"
    #: the device's deployed session (quantbench.hosts.deploy): ordered execution providers, intra-op threads
    #: (onnxruntime's default is one per physical core; under qemu-user the default would be this machine's
    #: core count, so the count is always explicit) and the device it models
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    intra_op_threads: int = 1
    device: str = ""
    #: the SVE and SME streaming vector lengths (bits; 0: none) the guest must show, read by prctl at setup and in
    #: every fingerprint: MLAS's SVE kernels and KleidiAI's SME ones follow them, and qemu's `max` defaults to
    #: 512-bit SVE, which no shipping core has
    sve_bits: int = 0
    sme_bits: int = 0

    @property
    def cpu_option(self) -> str:
        """qemu's -cpu value: the model, with the vector lengths pinned where they are not the model's own."""
        return cpu_option(self.qemu_cpu, self.sve_bits, self.sme_bits)

    @property
    def vector_text(self) -> str:
        """'SVE 128-bit, SME 512-bit' ('' for a core with neither)."""
        return ", ".join(f"{what} {bits}-bit" for what, bits in (("SVE", self.sve_bits), ("SME", self.sme_bits)) if bits)

    @property
    def midr_text(self) -> str:
        if self.part is None:
            return ""
        return f"implementer 0x{self.implementer:02x}, variant 0x{self.variant:x}, part 0x{self.part:03x}, revision {self.revision}"


#: SVE/SME vector lengths (bits) a qemu CPU model can run and the ones qemu-user gives it by default: named cores
#: have their silicon's lengths (qemu silently keeps 128 when neoverse-n2 is asked for 256), `max` any power of two
#: from 128 to 2048 (measured with qemu-user 10.0.13; prctl inside the guest)
_ANY = (128, 256, 512, 1024, 2048)
CORE_VECTORS = {"neoverse-v1": ((128, 256), 256, (), 0), "neoverse-n2": ((128,), 128, (), 0),
                "cortex-a710": ((128,), 128, (), 0), "a64fx": ((128, 256, 512), 512, (), 0),
                "max": (_ANY, 512, _ANY, 256)}


def vector_lengths(qemu_cpu: str) -> tuple[tuple, tuple]:
    """(SVE lengths, SME lengths) qemu model `qemu_cpu` can run, in bits; () where it has none."""
    sve, _, sme, _ = CORE_VECTORS.get(qemu_cpu, ((), 0, (), 0))
    return sve, sme


def cpu_option(qemu_cpu: str, sve_bits: int, sme_bits: int) -> str:
    """`qemu_cpu` with sve-/sme-default-vector-length (bytes) where the lengths differ from the model's defaults."""
    _, sve_default, _, sme_default = CORE_VECTORS.get(qemu_cpu, ((), 0, (), 0))
    props = [f"{what}-default-vector-length={bits // 8}" for what, bits, default
             in (("sve", sve_bits, sve_default), ("sme", sme_bits, sme_default)) if bits and bits != default]
    return ",".join([qemu_cpu, *props])


VECTOR_KEYS = ("sve_vector_bits", "sme_vector_bits")


def check_vector_bits(preset_name: str, options: dict, where: str) -> dict:
    """The vector lengths a hosts file sets for an emulated host (`sve_vector_bits`, `sme_vector_bits`), checked
    against what the preset's qemu model can run (qemu would silently run another length); a one-line UserError at
    `where` (the hosts file's line and host) naming the key otherwise. Returns {key: bits} of the keys set."""
    p = preset(preset_name)
    out = {}
    for key, what, lengths in zip(VECTOR_KEYS, ("SVE", "SME"), vector_lengths(p.qemu_cpu)):
        if key not in options:
            continue
        value = options[key]
        if not lengths:
            raise UserError(f"{where}: {key} = {value!r}: preset {p.name} (qemu -cpu {p.qemu_cpu}) has no {what}")
        if isinstance(value, bool) or not isinstance(value, int) or value not in lengths:
            can = " or ".join([", ".join(map(str, lengths[:-1])), str(lengths[-1])] if len(lengths) > 1 else [str(lengths[0])])
            raise UserError(f"{where}: {key} = {value!r}: preset {p.name} (qemu -cpu {p.qemu_cpu}) runs {what} at "
                            f"{can} bits" + ("" if len(lengths) > 1 else " only"))
        out[key] = value
    return out


def _arm(name, cpu, desc, variant, part, revision, expect, absent, min_qemu=(7, 2, 0), threads=4, device="",
         sve=0, sme=0, implementer=0x41) -> Preset:
    vectors = ", ".join(f"{w} {b}-bit" for w, b in (("SVE", sve), ("SME", sme)) if b)
    hint = (f"aarch64; CPU implementer 0x{implementer:02x}, CPU part 0x{part:03x}, variant 0x{variant:x}, revision "
            f"{revision}; features include {', '.join(expect)}" + (f"; no {', '.join(absent)}" if absent else "")
            + (f"; vector lengths {vectors}" if vectors else ""))
    return Preset(name, "aarch64", cpu, desc, implementer, variant, part, revision, min_qemu, hint, tuple(expect),
                  tuple(absent), intra_op_threads=threads, device=device, sve_bits=sve, sme_bits=sme)


def _x86(name, cpu, desc, expect, absent) -> Preset:
    hint = f"x86_64; {cpu} model; flags include {', '.join(expect)}; no {', '.join(absent)}"
    # numpy's bundled OpenBLAS detects "Haswell" on qemu's Nehalem model and dies on its first
    # AVX instruction (numpy's import-time sanity check runs a dot product); naming the core
    # fixes that. It only picks numpy's BLAS kernels: onnxruntime (MLAS) dispatches on CPUID.
    return Preset(name, "x86_64", cpu, desc, fingerprint_hint=hint, expect_features=tuple(expect),
                  absent_features=tuple(absent), env=(("OPENBLAS_CORETYPE", cpu),))


# MIDR variant/revision are qemu's values for the model (what qemu 10's emulated
# /proc/cpuinfo shows), so the guest sees the same identity under qemu 7.2 and 10.
PRESETS: dict[str, Preset] = {p.name: p for p in (
    _arm("pi", "cortex-a76", "Raspberry Pi 5 (BCM2712, Cortex-A76): NEON + dot product",
         0x4, 0xd0b, 1, ("asimd", "asimddp"), ("sve", "i8mm"), device="Raspberry Pi 5: 4 cores"),
    _arm("pi4", "cortex-a72", "Raspberry Pi 4 (BCM2711, Cortex-A72): NEON, no dot product",
         0x0, 0xd08, 3, ("asimd",), ("asimddp", "sve", "i8mm"), device="Raspberry Pi 4: 4 cores"),
    _arm("pi3", "cortex-a53", "Raspberry Pi 3 / Zero 2 (Cortex-A53): NEON, no dot product, narrow loads",
         0x0, 0xd03, 4, ("asimd",), ("asimddp", "sve", "i8mm"), device="Raspberry Pi 3: 4 cores"),
    _arm("graviton2", "neoverse-n1", "AWS Graviton2 (Neoverse-N1): NEON + dot product",
         0x4, 0xd0c, 1, ("asimd", "asimddp"), ("sve", "i8mm"), device="c6g.xlarge: 4 vCPUs, one core each"),
    _arm("graviton3", "neoverse-v1", "AWS Graviton3 (Neoverse-V1): SVE, int8 matrix multiply, bf16",
         0x1, 0xd40, 2, ("asimd", "asimddp", "sve", "i8mm", "bf16"), (), min_qemu=(8, 1, 0),
         device="c7g.xlarge: 4 vCPUs, one core each", sve=256),
    # Armv9 and later. qemu 10.0 has no Neoverse-V2 or Cortex-A78AE model: a stand-in with the same features MLAS
    # dispatches on (HWCAP bits and the vector lengths; the core's MIDR only picks narrow-load variants on
    # A53/A55) gives the same bytes (docs/hosts.md, "ARM generations"; checked where qemu has two models of one
    # feature set: neoverse-n2, cortex-a710 and max at 128-bit SVE without SME agree).
    _arm("graviton4", "neoverse-n2", "AWS Graviton4 / Google Axion (Neoverse-V2; stand-in Neoverse-N2, the same "
         "features): SVE2 128-bit, int8 matrix multiply, bf16", 0x0, 0xd49, 3,
         ("asimd", "asimddp", "sve", "sve2", "i8mm", "bf16"), ("sme",), min_qemu=(8, 1, 0),
         device="AWS Graviton4 c8g.xlarge (Neoverse-V2): 4 vCPUs, one core each", sve=128),
    _arm("orin", "cortex-a76", "NVIDIA Jetson Orin (Cortex-A78AE; stand-in Cortex-A76, the same features): NEON + "
         "dot product + fp16, no SVE", 0x4, 0xd0b, 1, ("asimd", "asimddp", "asimdhp"), ("sve", "i8mm", "bf16"),
         threads=6, device="NVIDIA Jetson Orin Nano 8GB (Cortex-A78AE): 6 cores"),
    _arm("phone-sme2", "max", "Armv9.2 phone big core (Arm C1-Ultra class): SVE2 128-bit + SME with a 512-bit "
         "streaming vector length, where KleidiAI's SME kernels replace MLAS's (qemu's max; qemu 10.0 shows SME, not "
         "SME2)", 0x0, 0x051, 0, ("asimd", "asimddp", "sve", "sve2", "i8mm", "bf16", "sme"), (), min_qemu=(10, 0, 0),
         threads=8, device="MediaTek Dimensity 9500 phone (Arm C1 cores, SME2): 8 cores", sve=128, sme=512,
         implementer=0x00),
    _arm("docker-arm64", "max", "an arm64 container on an x86 machine (binfmt runs it under qemu's max with its "
         "defaults): SVE 512-bit + SME 256-bit, which no shipping device has", 0x0, 0x051, 0,
         ("asimd", "asimddp", "sve", "sve2", "i8mm", "bf16", "sme"), (), min_qemu=(10, 0, 0),
         device="no shipping device: the CPU an arm64 container runs on an x86 machine (docker --platform "
         "linux/arm64 under binfmt); 4 vCPUs", sve=512, sme=256, implementer=0x00),
    dataclasses.replace(_arm("pi-xnnpack", "cortex-a76", "Raspberry Pi 5 (Cortex-A76), Debian trixie's onnxruntime "
                             "1.21.0: XNNPACK, then the CPU provider", 0x4, 0xd0b, 1, ("asimd", "asimddp"),
                             ("sve", "i8mm")),
                        runtime="debian:trixie", providers=("XnnpackExecutionProvider", "CPUExecutionProvider")),
    dataclasses.replace(_arm("pi-debian", "cortex-a76", "Raspberry Pi 5 (Cortex-A76), Debian trixie's onnxruntime "
                             "1.21.0: the CPU provider", 0x4, 0xd0b, 1, ("asimd", "asimddp"), ("sve", "i8mm")),
                        runtime="debian:trixie"),
    _x86("x86-avx2", "Haswell", "x86-64 with AVX2 + FMA3, no AVX-512 (Haswell)",
         ("avx2", "fma"), ("avx512f", "avx512_vnni")),
    _x86("x86-avx", "SandyBridge", "x86-64 with AVX, no AVX2/FMA3 (Sandy Bridge)",
         ("avx",), ("avx2", "fma", "avx512f")),
    _x86("x86-sse4", "Nehalem", "x86-64 with SSE4.2, no AVX (Nehalem)",
         ("sse4_2",), ("avx", "avx2", "avx512f")),
)}


def preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(f"unknown emulated preset {name!r}; presets: {', '.join(PRESETS)}") from None


# --------------------------------------------------------------------------- layout


def home() -> Path:
    return quantbench_home()


def tools_record_path() -> Path:
    return home() / "tools" / "qemu.json"


def root_dir() -> Path:
    return home() / "arm64-root" / ROOT_SUITE


def stamp_path(folder: Path) -> Path:
    """FOLDER.json beside FOLDER (not with_suffix: folder names hold version dots)."""
    return folder.parent / f"{folder.name}.json"


def root_stamp() -> Path:
    return stamp_path(root_dir())


def site_key(ort_version: str) -> str:
    return runtimes.site_key(ort_version, "aarch64", GUEST_PYTHON_VERSION)


def site_dir(ort_version: str | None = None) -> Path:
    return runtimes.site_dir(ort_version or local_ort_version(), "aarch64", GUEST_PYTHON_VERSION)


def site_stamp(ort_version: str | None = None) -> Path:
    return stamp_path(site_dir(ort_version))


def runtime_of(preset_name: str, options: dict | None = None) -> runtimes.Runtime:
    """The runtime a host of this preset carries (its options, else the preset's own)."""
    return runtimes.runtime_of(options or {}, preset(preset_name).runtime, f"host {preset_name}")


def _root_tag(rt: runtimes.Runtime) -> str:
    return rt.tag if rt.debian else ROOT_SUITE


def prefix_dir(preset_name: str, rt: runtimes.Runtime | None = None) -> Path:
    """prefixes/<preset> for the preset's own root; prefixes/<preset>+<runtime> for another root."""
    own = _root_tag(runtime_of(preset_name))
    tag = own if rt is None else _root_tag(rt)
    return home() / "prefixes" / (preset_name if tag == own else f"{preset_name}+{tag}")


def prefix_stamp(preset_name: str, rt: runtimes.Runtime | None = None) -> Path:
    return stamp_path(prefix_dir(preset_name, rt))


def guest_root(rt: runtimes.Runtime | None = None) -> Path:
    """The arm64 root a guest runs from: bookworm (pip wheels on its PYTHONPATH) or a Debian runtime's root."""
    return runtimes.debian_root(rt.suite, "aarch64") if rt is not None and rt.debian else root_dir()


def pycache_dir(rt: runtimes.Runtime | None = None) -> Path:
    """Where the arm64 guest's Python keeps its compiled modules (PYTHONPYCACHEPREFIX)."""
    if rt is not None and rt.debian:
        return home() / "pycache" / f"arm64-{rt.suite}-python{guest_python(rt).name[len('python'):]}"
    return home() / "pycache" / f"arm64-{ROOT_SUITE}-python{GUEST_PYTHON_VERSION}"


def guest_python(rt: runtimes.Runtime | None = None) -> Path:
    if rt is not None and rt.debian:
        return runtimes.debian_python(rt.suite, "aarch64")
    return root_dir() / "usr" / "bin" / f"python{GUEST_PYTHON_VERSION}"


# --------------------------------------------------------------------------- qemu


@functools.lru_cache(maxsize=None)
def _version_of(binary: str, mtime_ns: int) -> tuple[int, int, int]:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise UserError(f"{binary}: cannot run it to read its version ({exc})") from None
    m = re.search(r"version (\d+)\.(\d+)(?:\.(\d+))?", out)
    if not m:
        raise UserError(f"{binary}: not a qemu binary (asked for its version, it printed none)")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def qemu_version(binary: str | os.PathLike) -> tuple[int, int, int]:
    """(major, minor, micro) of a qemu-user binary, from `--version`."""
    binary = str(binary)
    try:
        mtime = os.stat(binary).st_mtime_ns
    except OSError:
        raise UserError(f"{binary}: qemu binary not found") from None
    return _version_of(binary, mtime)


def qemu_binary(arch: str) -> tuple[Path | None, str]:
    """The qemu-user binary for a guest arch and where it came from (the setup record, else PATH)."""
    record = read_cached_json(tools_record_path()) or {}
    entry = record.get(arch)
    if entry and Path(entry["path"]).exists():
        return Path(entry["path"]), entry.get("source", "")
    found = shutil.which(f"qemu-{arch}")
    if found:
        return Path(found), "PATH"
    return None, ""


def version_text(v: Sequence[int]) -> str:
    return ".".join(str(x) for x in v)


# --------------------------------------------------------------------------- readiness


def ready(preset_name: str, rt: runtimes.Runtime | None = None, name: str | None = None,
          cpu: str | None = None) -> tuple[bool, str]:
    """Whether qemu, the arm64 root and the runtime (wheels or a Debian root) are in place for a preset under
    runtime `rt` (None: the preset's own); if not, what is missing. `name`: the host the fix names; `cpu`: its
    -cpu value (None: the preset's)."""
    p = preset(preset_name)
    fix = f"run `quantbench hosts setup {name or preset_name}`"
    qemu, source = qemu_binary(p.arch)
    if qemu is None:
        return False, f"qemu-{p.arch} not found (no {tools_record_path()} and none on PATH); {fix}"
    try:
        version = qemu_version(qemu)
    except UserError as exc:
        return False, f"{exc}; {fix}"
    if version < p.min_qemu:
        return False, (f"{p.qemu_cpu} needs qemu >= {version_text(p.min_qemu)}, but {qemu} is {version_text(version)}; {fix} "
                       f"(it fetches qemu-user 10 into {home() / 'tools'})")
    rt = rt or runtime_of(preset_name)
    if p.arch == "aarch64":
        missing = _runtime_missing(rt)
        if missing:
            return False, f"{missing}; {fix}"
    prefix = prefix_dir(preset_name, rt)
    stamp = read_cached_json(stamp_path(prefix))
    if stamp is None or not (prefix / "proc" / "cpuinfo").exists():
        return False, f"the CPU prefix for {preset_name} is missing ({prefix}); {fix}"
    if stamp.get("qemu") != str(qemu) or stamp.get("qemu_version") != version_text(version):
        return False, (f"the CPU prefix for {preset_name} was made for another qemu "
                       f"({stamp.get('qemu')} {stamp.get('qemu_version')}); {fix}")
    return True, f"ready: qemu {version_text(version)} -cpu {cpu or p.cpu_option}" + (f" ({p.midr_text})" if p.part is not None else "")


def _runtime_missing(rt: runtimes.Runtime) -> str:
    """What an arm64 guest of runtime `rt` lacks ("" when nothing)."""
    if rt.debian:
        ok, msg = runtimes.debian_ready(rt.suite, "aarch64")
        return "" if ok else msg
    if read_cached_json(root_stamp()) is None or not guest_python().exists():
        return f"the arm64 root is missing ({root_dir()})"
    ort_version = rt.ort_version()
    if read_cached_json(site_stamp(ort_version)) is None:
        return f"aarch64 wheels of onnxruntime {ort_version} are missing ({site_dir(ort_version)})"
    return ""


def require_ready(preset_name: str, rt: runtimes.Runtime | None = None) -> None:
    ok, msg = ready(preset_name, rt)
    if not ok:
        raise UserError(f"emulated host {preset_name}: {msg}")


# --------------------------------------------------------------------------- commands


def python_command(preset_name: str, qemu_args: Sequence[str] = (), rt: runtimes.Runtime | None = None,
                   cpu: str | None = None) -> tuple[list[str], dict[str, str]]:
    """argv starting a Python under qemu-user for the preset (append the script and its args), and its env.

    `qemu_args` are extra qemu options (e.g. `-d in_asm,nochain -D LOG`); they go
    before the guest program; `rt`: the runtime (None: the preset's own); `cpu`: the -cpu value (None: the
    preset's, vector lengths pinned). The env is a full environment for subprocess.
    """
    rt = rt or runtime_of(preset_name)
    require_ready(preset_name, rt)
    p = preset(preset_name)
    qemu, _ = qemu_binary(p.arch)
    env = {k: v for k, v in without_process_mask(dict(os.environ)).items() if not k.startswith("QEMU_")}
    argv = [str(qemu), "-cpu", cpu or p.cpu_option, "-L", str(prefix_dir(preset_name, rt)), *map(str, qemu_args)]
    if p.arch == "aarch64":
        for key in ("PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV", "PYTHONPATH"):
            env.pop(key, None)
        if not rt.debian:  # a Debian runtime's packages are in its root
            env["PYTHONPATH"] = str(site_dir(rt.ort_version()))
        # The host's user site holds x86 extension modules; the guest must never import them.
        env["PYTHONNOUSERSITE"] = "1"
        # The root's standard library comes without bytecode (its packages were unpacked, not installed):
        # it is compiled once into quantbench's own cache beside the root (never into the root, and
        # whatever PYTHONDONTWRITEBYTECODE says), not again at every start under emulation (seconds of
        # each worker's start-up).
        env["PYTHONPYCACHEPREFIX"] = str(pycache_dir(rt))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        argv += [str(guest_python(rt)), "-u"]
    else:
        # This machine's interpreter (a venv's python keeps its pyvenv.cfg: the path is not resolved).
        argv += [sys.executable, "-u"]
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        if rt.version:  # another onnxruntime version first on the path
            env["PYTHONPATH"] = os.pathsep.join(
                [str(runtimes.site_dir(rt.version, "x86_64", runtimes.local_python_version()))]
                + [x for x in [env.get("PYTHONPATH", "")] if x])
    env.update(dict(p.env))
    env["QUANTBENCH_CPU_MECHANISM"] = "qemu"  # the worker's fingerprint says how the CPU was made
    # A guest's threads share this machine's cores (a Pi's 4 on 2 here): onnxruntime's thread pools must not
    # spin-wait on them (worker.make_session). Scheduling only: which thread runs a block changes no byte.
    env["QUANTBENCH_WORKER_SPIN"] = "0"
    return argv, env


def _text_or_empty(path: Path) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def fingerprint_identity(preset_name: str, env: dict, rt: runtimes.Runtime | None = None) -> dict:
    """What `hosts setup` installed for a preset and can change its fingerprint without changing its
    command line: the preset itself, the prefix's cpuinfo and stamp, the arm64 root's stamp, the
    wheel sets on the guest's PYTHONPATH (key material of quantbench.hosts.fingerprintcache)."""
    site = str(env.get("PYTHONPATH", ""))
    return {
        "preset": repr(PRESETS.get(preset_name)),
        "cpuinfo": _text_or_empty(prefix_dir(preset_name, rt) / "proc" / "cpuinfo"),
        "prefix_stamp": _text_or_empty(prefix_stamp(preset_name, rt)),
        "root_stamp": _text_or_empty(stamp_path(guest_root(rt))),
        "site": site,
        "site_stamps": [_text_or_empty(stamp_path(Path(p))) for p in site.split(os.pathsep) if p],
    }


def cpu_name(preset_name: str) -> str:
    """The emulated core as people name it (cortex-a72 -> Cortex-A72, neoverse-n1 -> Neoverse-N1)."""
    return "-".join(w.capitalize() if w.isalpha() else w.upper() for w in preset(preset_name).qemu_cpu.split("-"))


# --------------------------------------------------------------------------- the host


@dataclass
class EmulatedHost(ProcessHost):
    """qemu-user running an arm64 (or x86) Python on a CPU model; its presets, prefixes and qemu above."""

    #: the model travels as bytes: no path lookups through qemu's -L prefix
    model_by_path: bool = False
    #: qemu's translation log shows the instructions the guest ran
    traces_instructions = True
    #: the preset, its prefix and the wheels `hosts setup` installed are all on this machine
    caches_fingerprint = True
    #: qemu emulates the CPU on any x86 machine with `hosts setup` done: `--cluster` runs it there
    runs_on_cluster = True

    @property
    def preset(self) -> str:
        return self.options.get("preset", self.name)

    @property
    def runtime(self) -> runtimes.Runtime:
        """The onnxruntime this host carries (its options, else its preset's)."""
        return runtime_of(self.preset, self.options)

    @property
    def vector_bits(self) -> dict:
        """{"sve_vector_bits", "sme_vector_bits"} the guest must have: the hosts file's, else the preset's."""
        p = preset(self.preset)
        own = {"sve_vector_bits": p.sve_bits, "sme_vector_bits": p.sme_bits} if p.arch == "aarch64" else {}
        return {k: int(self.options.get(k, v)) for k, v in own.items()}

    @property
    def cpu(self) -> str:
        """qemu's -cpu value for this host (its vector lengths pinned)."""
        p = preset(self.preset)
        bits = self.vector_bits
        return cpu_option(p.qemu_cpu, bits["sve_vector_bits"], bits["sme_vector_bits"]) if bits else p.cpu_option

    def fingerprint_problem(self, fingerprint: dict) -> str | None:
        """Why the guest is not the CPU this host stands for: a feature of the preset missing (or one it must
        not have), or vector lengths other than the pinned ones, as the worker read them inside the guest."""
        p = preset(self.preset)
        ident = fingerprint.get("identity", {})
        if p.arch != "aarch64" or ident.get("arch") != "aarch64":
            return None
        seen = set(ident.get("isa_flags") or [])
        missing = [f for f in p.expect_features if f not in seen]
        extra = [f for f in p.absent_features if f in seen]
        got = {k: ident.get(k, 0) for k in VECTOR_KEYS}
        if missing or extra or got != self.vector_bits:
            return (f"the guest on qemu -cpu {self.cpu} is not {p.name}'s CPU: "
                    + "; ".join(x for x in (f"it lacks {', '.join(missing)}" if missing else "",
                                            f"it has {', '.join(extra)}" if extra else "",
                                            "" if got == self.vector_bits else
                                            f"its vector lengths are SVE {got['sve_vector_bits']} and SME "
                                            f"{got['sme_vector_bits']} bits, not {self.vector_bits['sve_vector_bits']} "
                                            f"and {self.vector_bits['sme_vector_bits']}") if x)
                    + f"; run `quantbench hosts setup {self.name}` again")
        return None

    def ready(self):
        if self.preset not in PRESETS:
            return False, f"unknown emulated preset {self.preset!r}; presets: {', '.join(sorted(PRESETS))}"
        ok, msg = ready(self.preset, self.runtime, self.name, self.cpu)
        rt = self.runtime
        device = preset(self.preset).device
        return ok, (msg + (f"; {rt.describe()}" if ok and (rt.debian or rt.version) else "")
                    + (f"; stands for {device}" if device else ""))

    def command(self):
        argv, env = python_command(self.preset, tuple(self.options.get("qemu_args", ())), self.runtime, self.cpu)
        # python_command returns the guest's full environment (no host PYTHONPATH, no QEMU_* leaking in)
        full = dict(env) if env else {k: v for k, v in without_process_mask(dict(os.environ)).items()
                                      if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
        return list(argv) + [str(WORKER_PATH)], full, b""

    def describe(self) -> str:
        return f"emulated ({self.preset}{', ' + self.runtime.describe() if self.options.get('onnxruntime') or self.runtime.debian else ''})"

    def trace_target(self) -> Preset:
        """The CPU model an instruction trace runs on (its arch and qemu cpu name)."""
        return preset(self.preset)

    def trace_run(self, label: str, model_path, fixtures, session: dict, log, timeout: float | None = None) -> dict:
        """Run the model on `fixtures` in this host's guest Python under qemu's translation log (-d in_asm,
        written to `log`): the instructions it ran, and where onnxruntime's code lies in the guest
        (hosts.trace.run_probe; read by quantbench.explain.evidence)."""
        def command(script):
            argv, env = python_command(self.preset, ["-d", "in_asm", "-D", str(log)], self.runtime, self.cpu)
            return argv + list(script), env
        return run_probe(label, command, model_path, fixtures, session, timeout)

    def fingerprint_cache_parts(self, env: dict) -> dict:
        """What `hosts setup` installed for the preset (prefix, root, wheels)."""
        return {"emulated": fingerprint_identity(self.preset, env, self.runtime)}

    def latency_refusal(self) -> str | None:
        return ("emulated; a time measured under qemu is emulation time, not a device latency. "
                "Measure latency on a local or ssh host")

    def version_policy(self, remote: str, local: str) -> str | None:
        """The version is the host's own (a fingerprint field): only a worker that imported another version
        than the one set up for it (a stale setup) is an error."""
        return runtimes.version_check(self.name, self.runtime, remote)

    def can_fork(self) -> bool:
        """Not with a Debian runtime: its worker holds a second thread once onnxruntime is loaded, and a child
        forked from it hung in a futex wait (measured on x86-dnnl): each worker starts anew instead."""
        return not self.runtime.debian and super().can_fork()

    def start_failure(self, exc) -> str | None:
        """A runtime that cannot start on this CPU (an illegal instruction at import) is this host's result."""
        return runtimes.start_failure(self.runtime, cpu_name(self.preset), exc)
