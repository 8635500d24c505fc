"""What can change the numbers on this host: the CPU's identity (cpuinfo, the auxiliary vector's HWCAPs, x86 CPUID,
the SVE/SME vector lengths prctl gives), numpy's and onnxruntime's builds and the session, hashed into the
fingerprint id (the numerics-relevant part only, so two identical machines share it)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import struct
import sys

import numpy as np

from quantbench.worker.protocol import JobError, PROTOCOL
from quantbench.worker.session import normalize_session


# Linux arch/arm64/include/uapi/asm/hwcap.h, bit order.
ARM64_HWCAP = (
    "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc "
    "dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg gcs cmpbr "
    "fprcvt f8mm8 f8mm4 sve_f16mm sve_eltperm sve_aes2 sve_bfscale sve2p2 sme2p2 sme_sbitperm sme_aes "
    "sme_sfexpa sme_stmop sme_smop4"
).split()


ARM64_HWCAP2 = (
    "dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm svef32mm svef64mm "
    "svebf16 i8mm bf16 dgh rng bti mte ecv afp rpres mte3 sme sme_i16i64 sme_f64f64 sme_i8i32 "
    "sme_f16f32 sme_b16f32 sme_f32f32 sme_fa64 wfxt ebf16 sve_ebf16 cssc rprfm sve2p1 sme2 sme2p1 "
    "sme_i16i32 sme_bi32i32 sme_b16b16 sme_f16f16 mops hbc sve_b16b16 lrcpc3 lse128 fpmr lut faminmax "
    "f8cvt f8fma f8dp4 f8dp2 f8e4m3 f8e5m2 sme_lutv2 sme_f8f16 sme_f8f32 sme_sf8fma sme_sf8dp4 "
    "sme_sf8dp2 poe"
).split()


AT_HWCAP, AT_HWCAP2 = 16, 26


_X86_KEYS = ("vendor_id", "cpu family", "model", "model name", "stepping")


_ARM_KEYS = ("CPU implementer", "CPU architecture", "CPU variant", "CPU part", "CPU revision")


def _read_text(path: str) -> str:
    try:
        with open(path, "r", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def read_cpuinfo(text: "str | None" = None) -> dict:
    """The CPU identity fields of /proc/cpuinfo (first processor block; ARM: every distinct core)."""
    text = _read_text("/proc/cpuinfo") if text is None else text
    blocks, cur = [], {}
    for line in text.splitlines():
        if not line.strip():
            if cur:
                blocks.append(cur)
                cur = {}
            continue
        key, _, value = line.partition(":")
        cur[key.strip()] = value.strip()
    if cur:
        blocks.append(cur)
    out = {}
    if not blocks:
        return out
    first = blocks[0]
    for key in _X86_KEYS:
        if key in first:
            out[key] = first[key]
    if "flags" in first:
        out["flags"] = sorted(first["flags"].split())
    cores = []
    for b in blocks:
        core = {k: b[k] for k in _ARM_KEYS if k in b}
        if core and core not in cores:
            cores.append(core)
    if cores:
        out["arm_cores"] = cores
    features = next((b["Features"] for b in blocks if "Features" in b), None)
    if features is not None:
        out["features"] = sorted(features.split())
    return out


def read_auxv(path: str = "/proc/self/auxv") -> dict:
    """AT_HWCAP / AT_HWCAP2 from the auxiliary vector (what the kernel, or qemu, tells the process)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return {}
    word = struct.calcsize("P")
    fmt = "<QQ" if word == 8 else "<II"
    step = struct.calcsize(fmt)
    out = {}
    for i in range(0, len(data) - step + 1, step):
        key, value = struct.unpack_from(fmt, data, i)
        if key == 0:
            break
        if key == AT_HWCAP:
            out["hwcap"] = value
        elif key == AT_HWCAP2:
            out["hwcap2"] = value
    return out


def decode_bits(value: int, names) -> list:
    out = []
    bit = 0
    while value >> bit:
        if (value >> bit) & 1:
            out.append(names[bit] if bit < len(names) else "bit%d" % bit)
        bit += 1
    return out


def numpy_cpu_features() -> list:
    """CPU features numpy's runtime dispatch detected (CPUID on x86, HWCAP on ARM): what the process sees."""
    for mod in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):
        try:
            m = __import__(mod, fromlist=["__cpu_features__"])
            feats = getattr(m, "__cpu_features__")
            return sorted(k for k, v in feats.items() if v)
        except Exception:
            continue
    return []


# Linux /proc/cpuinfo flag names for CPUID bits: (leaf.sub, register index eax=0 ebx=1 ecx=2 edx=3, bit, name).
X86_FLAGS = [
    ("1.0", 3, 0, "fpu"), ("1.0", 3, 4, "tsc"), ("1.0", 3, 8, "cx8"), ("1.0", 3, 15, "cmov"), ("1.0", 3, 23, "mmx"),
    ("1.0", 3, 24, "fxsr"), ("1.0", 3, 25, "sse"), ("1.0", 3, 26, "sse2"), ("1.0", 2, 0, "pni"),
    ("1.0", 2, 1, "pclmulqdq"), ("1.0", 2, 9, "ssse3"), ("1.0", 2, 12, "fma"), ("1.0", 2, 13, "cx16"),
    ("1.0", 2, 19, "sse4_1"), ("1.0", 2, 20, "sse4_2"), ("1.0", 2, 22, "movbe"), ("1.0", 2, 23, "popcnt"),
    ("1.0", 2, 25, "aes"), ("1.0", 2, 26, "xsave"), ("1.0", 2, 27, "osxsave"), ("1.0", 2, 28, "avx"),
    ("1.0", 2, 29, "f16c"), ("1.0", 2, 30, "rdrand"), ("80000001.0", 3, 11, "syscall"),
    ("80000001.0", 3, 20, "nx"), ("80000001.0", 3, 29, "lm"), ("80000001.0", 2, 0, "lahf_lm"),
    ("80000001.0", 2, 5, "abm"), ("80000001.0", 2, 6, "sse4a"), ("80000001.0", 2, 11, "xop"),
    ("80000001.0", 2, 16, "fma4"), ("7.0", 1, 3, "bmi1"), ("7.0", 1, 5, "avx2"), ("7.0", 1, 8, "bmi2"),
    ("7.0", 1, 9, "erms"), ("7.0", 1, 16, "avx512f"), ("7.0", 1, 17, "avx512dq"), ("7.0", 1, 18, "rdseed"),
    ("7.0", 1, 19, "adx"), ("7.0", 1, 21, "avx512ifma"), ("7.0", 1, 28, "avx512cd"), ("7.0", 1, 29, "sha_ni"),
    ("7.0", 1, 30, "avx512bw"), ("7.0", 1, 31, "avx512vl"), ("7.0", 2, 1, "avx512vbmi"),
    ("7.0", 2, 6, "avx512_vbmi2"), ("7.0", 2, 8, "gfni"), ("7.0", 2, 9, "vaes"), ("7.0", 2, 10, "vpclmulqdq"),
    ("7.0", 2, 11, "avx512_vnni"), ("7.0", 2, 12, "avx512_bitalg"), ("7.0", 2, 14, "avx512_vpopcntdq"),
    ("7.0", 3, 8, "avx512_vp2intersect"), ("7.0", 3, 22, "amx_bf16"), ("7.0", 3, 23, "avx512_fp16"),
    ("7.0", 3, 24, "amx_tile"), ("7.0", 3, 25, "amx_int8"), ("7.1", 0, 4, "avx_vnni"), ("7.1", 0, 5, "avx512_bf16"),
    ("d.1", 0, 0, "xsaveopt"),
]


# push rbx; mov r8, rdx; mov eax, edi; mov ecx, esi; cpuid; mov [r8], eax/ebx/ecx/edx; pop rbx; ret
_CPUID_CODE = bytes([0x53, 0x49, 0x89, 0xd0, 0x89, 0xf8, 0x89, 0xf1, 0x0f, 0xa2, 0x41, 0x89, 0x00, 0x41, 0x89,
                     0x58, 0x04, 0x41, 0x89, 0x48, 0x08, 0x41, 0x89, 0x50, 0x0c, 0x5b, 0xc3])


_CPUID_KEEP = []


def cpuid_function():
    """(cpuid(leaf, sub) -> [eax, ebx, ecx, edx], source) as this process sees it: the masking shim's
    qb_cpuid (through its trap path) when a masked worker loaded it, else the instruction itself in a small
    executable page (the real CPU, or qemu's model). None on a machine that is not x86-64."""
    import ctypes

    fn, source = None, "cpuid"
    try:
        lib = ctypes.CDLL(None)
        if lib.qb_active():
            fn, source = lib.qb_cpuid, "masked"
    except (AttributeError, OSError):
        pass
    if fn is None:
        import mmap

        buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        buf.write(_CPUID_CODE)
        _CPUID_KEEP.append(buf)
        fn = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p)(
            ctypes.addressof(ctypes.c_char.from_buffer(buf)))

    def cpuid(leaf, sub=0):
        regs = (ctypes.c_uint32 * 4)()
        fn(leaf, sub, ctypes.addressof(regs) if source == "cpuid" else regs)
        return list(regs)
    return cpuid, source


def cpuid_leaves(cpuid) -> dict:
    """The leaves that identify an x86 CPU and its features, keyed "leaf.sub" in hex."""
    regs = {"0.0": cpuid(0)}
    top = regs["0.0"][0]
    for leaf, sub in ((1, 0), (7, 0), (0xd, 1)):
        if leaf <= top:
            regs["%x.%x" % (leaf, sub)] = cpuid(leaf, sub)
    if top >= 7 and regs["7.0"][0] >= 1:
        regs["7.1"] = cpuid(7, 1)
    ext = cpuid(0x80000000)[0]
    for leaf in (0x80000001, 0x80000002, 0x80000003, 0x80000004):
        if leaf <= ext:
            regs["%x.0" % leaf] = cpuid(leaf)
    return regs


def _cpuid_string(regs_list, order) -> str:
    raw = b"".join(int(r[i]).to_bytes(4, "little") for r in regs_list for i in order)
    return raw.split(b"\0", 1)[0].decode("ascii", "replace").strip()


def x86_identity(regs: dict) -> dict:
    """vendor_id, cpu_family, model, model_name, stepping and /proc/cpuinfo-style flags of CPUID leaves."""
    eax = regs["1.0"][0] if "1.0" in regs else 0
    base_family, base_model = (eax >> 8) & 0xF, (eax >> 4) & 0xF
    brand = [regs[k] for k in ("80000002.0", "80000003.0", "80000004.0") if k in regs]
    flags = [name for leaf, reg, bit, name in X86_FLAGS if leaf in regs and (regs[leaf][reg] >> bit) & 1]
    return {"vendor_id": _cpuid_string([regs["0.0"]], (1, 3, 2)),
            "cpu_family": str(base_family + ((eax >> 20) & 0xFF if base_family == 0xF else 0)),
            "model": str(base_model + (((eax >> 16) & 0xF) << 4 if base_family in (6, 0xF) else 0)),
            "model_name": _cpuid_string(brand, (0, 1, 2, 3)) if len(brand) == 3 else "unknown",
            "stepping": str(eax & 0xF), "flags": sorted(flags)}


# numpy's names of the features a masked worker checks (numpy's __cpu_features__ must agree with the mask)
NUMPY_X86_NAMES = {"AVX": "avx", "F16C": "f16c", "FMA3": "fma", "AVX2": "avx2", "AVX512F": "avx512f",
                   "AVX512CD": "avx512cd", "AVX512BW": "avx512bw", "AVX512DQ": "avx512dq", "AVX512VL": "avx512vl",
                   "AVX512VNNI": "avx512_vnni", "AVX512IFMA": "avx512ifma", "AVX512VBMI": "avx512vbmi",
                   "SSE41": "sse4_1", "SSE42": "sse4_2", "SSSE3": "ssse3", "POPCNT": "popcnt"}


def masked_problem(flags, numpy_features, ort_traps: int) -> "str | None":
    """Why a masked worker's mask did not take (a masked feature numpy still sees; onnxruntime never trapped)."""
    leaked = sorted(n for n in numpy_features if n in NUMPY_X86_NAMES and NUMPY_X86_NAMES[n] not in flags)
    if leaked:
        return "numpy still sees %s, which the CPUID profile masks" % ", ".join(leaked)
    if ort_traps <= 0:
        return "onnxruntime's library never executed a masked CPUID (is the masked copy first on sys.path?)"
    return None


PR_SVE_GET_VL, PR_SME_GET_VL = 51, 64  # linux/prctl.h (arm64 only)


def vector_bits(option: int) -> int:
    """The SVE (PR_SVE_GET_VL) or SME streaming (PR_SME_GET_VL) vector length this process has, in bits, read
    from the kernel (or qemu-user) by prctl: MLAS's SVE kernels and KleidiAI's SME ones follow it, and a CPU
    model's name does not fix it (qemu's `max` defaults to 512-bit SVE). 0 when the CPU or kernel has none."""
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        got = prctl(option, 0, 0, 0, 0)
    except (AttributeError, OSError):
        return 0
    return (got & 0xffff) * 8 if got > 0 else 0


def arm_vector_lengths(arch: str) -> dict:
    """{"sve_vector_bits", "sme_vector_bits"} of an aarch64 process (0 when absent); {} on other architectures,
    so their fingerprints stay as they were."""
    if arch.lower() not in ("aarch64", "arm64"):
        return {}
    return {"sve_vector_bits": vector_bits(PR_SVE_GET_VL), "sme_vector_bits": vector_bits(PR_SME_GET_VL)}


def _libc() -> str:
    try:
        lib, ver = platform.libc_ver()
        return ("%s %s" % (lib, ver)).strip()
    except Exception:
        return ""


def _cpu_identity(arch: str, cpuinfo: dict, auxv: dict) -> "tuple[dict, list]":
    """The CPU as the kernel describes it (cores and HWCAP bits on ARM, cpuinfo fields and flags on x86) and its
    ISA flags (the HWCAP names on ARM; empty on x86, where numpy's view is used)."""
    cpu = {}
    isa = []
    if arch.lower() in ("aarch64", "arm64", "armv8l", "armv7l"):
        for core in cpuinfo.get("arm_cores", []):
            cpu.setdefault("cores", []).append(core)
        hw = decode_bits(auxv.get("hwcap", 0), ARM64_HWCAP) if "hwcap" in auxv else []
        hw2 = decode_bits(auxv.get("hwcap2", 0), ARM64_HWCAP2) if "hwcap2" in auxv else []
        cpu["hwcap"] = hw
        cpu["hwcap2"] = hw2
        cpu["cpuinfo_features"] = cpuinfo.get("features", [])
        isa = sorted(set(hw) | set(hw2))
    else:
        for key in _X86_KEYS:
            if key in cpuinfo:
                cpu[key.replace(" ", "_")] = cpuinfo[key]
        cpu["cpuinfo_flags"] = cpuinfo.get("flags", [])
        cpu["hwcap"] = "0x%x" % auxv["hwcap"] if "hwcap" in auxv else ""
        cpu["hwcap2"] = "0x%x" % auxv["hwcap2"] if "hwcap2" in auxv else ""
    return cpu, isa


def _x86_cpuid_view(cpu: dict, np_feats) -> "tuple[list, bool]":
    """The ISA flags CPUID gives this process (/proc/cpuinfo names) and whether a masking shim gave them; a
    masked worker's CPU identity is the profile's (the kernel's view kept under proc_cpuinfo), and a mask that
    did not take (numpy sees a masked feature, onnxruntime never trapped) is an error."""
    import ctypes

    try:
        cpuid, source = cpuid_function()
        ident = x86_identity(cpuid_leaves(cpuid))
    except Exception:
        return [], False
    if source != "masked":
        return ident["flags"], False
    cpu["proc_cpuinfo"] = {k: cpu.pop(k) for k in ("vendor_id", "cpu_family", "model", "model_name", "stepping")
                           if k in cpu}
    cpu.update({k: v for k, v in ident.items() if k != "flags"})
    cpu["profile"] = os.environ.get("QUANTBENCH_CPUID_PROFILE_NAME", "")
    count = ctypes.CDLL(None).qb_trap_count
    count.restype = ctypes.c_ulong
    problem = masked_problem(ident["flags"], np_feats, count(b"onnxruntime"))
    if problem:
        raise JobError("cpuid", "the CPUID mask did not take: " + problem)
    return ident["flags"], True


def collect_fingerprint(session: "dict | None" = None, resolved_providers=None, session_readback=None) -> dict:
    """What can change the numbers on this host: {"identity": ..., "info": ...}.

    `identity` holds only numerics-relevant fields (fingerprint_id hashes it, so two
    identical machines share a fingerprint); `info` holds what identifies the machine
    but not the arithmetic (hostname, kernel release, interpreter path).
    """
    import onnxruntime as ort

    arch = platform.machine()
    cpuinfo = read_cpuinfo()
    cpu, isa = _cpu_identity(arch, cpuinfo, read_auxv())
    np_feats = numpy_cpu_features()
    mechanism = os.environ.get("QUANTBENCH_CPU_MECHANISM", "real")
    if not isa and arch.lower() in ("x86_64", "amd64"):
        isa, masked = _x86_cpuid_view(cpu, np_feats)
        mechanism = "native-masked" if masked else mechanism
    if not isa:
        isa = sorted(f.lower() for f in np_feats) or cpuinfo.get("flags", [])
    build_info = ""
    if hasattr(ort, "get_build_info"):
        try:
            build_info = str(ort.get_build_info())
        except Exception:
            build_info = ""
    identity = {
        "os": platform.system(),
        "arch": arch,
        "libc": _libc(),
        "cpu": cpu,
        "isa_flags": isa,
        "cpu_mechanism": mechanism,
        "numpy_cpu_features": np_feats,
        "onnxruntime": {
            "version": ort.__version__,
            "build_info": build_info,
            "available_providers": list(ort.get_available_providers()),
            "device": str(ort.get_device()) if hasattr(ort, "get_device") else "",
        },
        "numpy": np.__version__,
        "python": "%s %s" % (platform.python_implementation(), platform.python_version()),
        "session": session if session is not None else normalize_session(None),
        "session_readback": session_readback or {},
        "resolved_providers": list(resolved_providers or []),
    }
    identity.update(arm_vector_lengths(arch))
    info = {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "python_executable": sys.executable,
        "cpu_count": os.cpu_count(),
        "protocol": PROTOCOL,
    }
    return {"identity": identity, "info": info}


def fingerprint_id(fingerprint: dict) -> str:
    """SHA-256 of the canonical JSON of the fingerprint's numerics-relevant part."""
    ident = fingerprint.get("identity", fingerprint)
    return hashlib.sha256(json.dumps(ident, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()
