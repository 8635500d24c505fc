"""The worker: runs on every host, needs only the standard library, numpy and onnxruntime.

This file must stay self-contained (Python 3.9+; of quantbench only the canonical tensor encoding,
quantbench/tensorcode.py, which travels with it), because it runs on bare hosts (an emulated arm64
root, a Raspberry Pi over ssh): started by path, it loads tensorcode.py from its package folder; sent
as source, it receives that file's source first (hosts.process.worker_source). onnxruntime is imported
lazily, so the rest of quantbench imports the protocol from here without loading onnxruntime.

Protocol (both directions, over the worker's stdin/stdout):
    frame = b"QBW1" + uint32_be(len(header)) + uint64_be(len(payload)) + header + payload
The header is UTF-8 JSON; tensors travel raw in the payload and the header locates
them with {"offset", "nbytes"}, or in a read-only store file on the worker's own
filesystem named by the run's "store" (or a fixture's "file"). A new session's first run is profiled
(read_placement: the provider of each node), its profile written under the request's "scratch" folder
(the run's own, in its results) and removed once read. Requests:
{"type": "fingerprint", ...}, {"type": "run", ...}, {"type": "fork", ...}, {"type": "end"}. The worker reads
a whole request before it writes anything (so the parent never deadlocks on full
pipes) and answers with frames ending in {"type": "done"}. A run answers a "session"
frame (its "reused" is true when the worker kept the session from an earlier job of the
same model bytes and session options), one "result" frame per fixture (written by a helper thread within about 20 ms
of the result: a killed worker loses at most that much finished work) and a
"verified" frame with the input hashing time; a failure is an "error" frame naming
host, variant and fixture, after which the job stops and the results already sent stand. While a
fingerprint or run job runs, a helper thread (InputWatch, ended with the job) ends the worker if its input's other
end closes: the parent is gone.

A fork ({"type": "fork", "socket": PATH}, same machine only) answers {"type": "forked",
"pid"}: the worker forks, and the child (its own session, every import and, under
qemu-user, every translated block of the parent already in place) connects twice to the
Unix socket PATH, first the protocol stream then its stderr, and serves requests there
until "end" or end of input. The parent ignores SIGCHLD from then on (the kernel reaps
its children). Worker processes run without the helper threads of numpy's BLAS and
onnxruntime's telemetry, so a fork between jobs copies the only thread there is.

Test-only hook (never set in use; costs nothing when unset): with the environment variables
QUANTBENCH_TEST_PAUSE_AFTER=K and QUANTBENCH_TEST_PAUSE_FILE=PATH, a worker process that
has run K fixtures (K result frames) writes and flushes those results, creates
PATH.paused.PID and PATH.paused, each holding its pid, then waits until PATH exists before it goes on. Tests use it
to act on a worker at a known point of a run (kill it after exactly K results), so that
they do not depend on how fast the machine is.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import struct
import sys
import time
import traceback

if __name__ == "__main__":  # a worker process: no helper threads to lose in a fork (see "fork" above)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

import numpy as np

PROTOCOL = 1
MAGIC = b"QBW1"
_HEAD = struct.Struct(">4sIQ")

DEFAULT_SESSION = {
    "intra_op_num_threads": 1,
    "inter_op_num_threads": 1,
    "execution_mode": "sequential",
    "graph_optimization_level": "all",
    "config_entries": {},
    "providers": ["CPUExecutionProvider"],
    "batch": 1,
}

GRAPH_OPT_LEVELS = ("disabled", "basic", "extended", "all")
#: the optional session option naming the config entries a variant requires (its recipe's session_requirements)
#: that the host's own session did not set: they are among "config_entries" too; absent when there are none
REQUIRED = "required_entries"


def _test_pause_from_env():
    """(K, PATH) of the test-only pause hook (see the module docstring), or None."""
    k, path = os.environ.get("QUANTBENCH_TEST_PAUSE_AFTER"), os.environ.get("QUANTBENCH_TEST_PAUSE_FILE")
    if not k or not path:
        return None
    return [int(k), path]


_TEST_PAUSE = _test_pause_from_env()

# The canonical tensor encoding (quantbench/tensorcode.py: standard library and numpy only) travels with this file.
if globals().get("__package__"):  # imported as quantbench.hosts.worker
    from quantbench.tensorcode import canonical, tensor_bytes, tensor_from_bytes, tensor_header, tensor_sha256
elif "_TENSORCODE" in globals():  # sent as source (hosts.process.worker_source): its source came first
    exec(compile(_TENSORCODE, "tensorcode.py", "exec"))  # noqa: F821
else:  # started by path (a local or emulated worker, the trace probe): the file in this worker's package
    _CODE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tensorcode.py")
    with open(_CODE, "rb") as _fh:
        exec(compile(_fh.read(), _CODE, "exec"))


def normalize_session(session: "dict | None") -> dict:
    """Session options with defaults filled in; unknown keys are an error (typos change nothing silently)."""
    out = json.loads(json.dumps(DEFAULT_SESSION))
    for key, value in (session or {}).items():
        if key not in DEFAULT_SESSION and key != REQUIRED:
            raise ValueError("unknown session option %r; known: %s" % (key, ", ".join(sorted(DEFAULT_SESSION))))
        out[key] = value
    out["config_entries"] = {str(k): str(v) for k, v in sorted((out["config_entries"] or {}).items())}
    _normalize_required(out)
    out["providers"] = [str(p) for p in out["providers"]]
    if out["graph_optimization_level"] not in GRAPH_OPT_LEVELS:
        raise ValueError("graph_optimization_level %r: choose from %s" % (out["graph_optimization_level"], ", ".join(GRAPH_OPT_LEVELS)))
    if out["execution_mode"] not in ("sequential", "parallel"):
        raise ValueError("execution_mode %r: choose sequential or parallel" % (out["execution_mode"],))
    for key in ("intra_op_num_threads", "inter_op_num_threads", "batch"):
        out[key] = int(out[key])
    if out["batch"] < 1:
        raise ValueError("batch must be >= 1")
    return out


def _normalize_required(out: dict) -> None:
    """The required entries of a normalised session `out`: sorted str -> str, each one among its config entries
    with the same value; dropped when empty (a session without them keys as it always did)."""
    required = {str(k): str(v) for k, v in sorted((out.pop(REQUIRED, None) or {}).items())}
    for key, value in required.items():
        if out["config_entries"].get(key) != value:
            raise ValueError("required entry %s=%s is not among the config entries" % (key, value))
    if required:
        out[REQUIRED] = required


class SessionOptions:
    """onnxruntime's session options as one value: normalised once (normalize_session: defaults filled, unknown
    keys and bad values a ValueError), then keyed, layered and sent as they are. Standard library only, so this
    worker builds its sessions from the very value the workbench keys its results by.

    - wire(): the normalised options as a request carries them and a result records them (a fresh dict);
    - json() / key(): their canonical JSON and its SHA-256 (the session key in every run key);
    - layered(overrides): another layer on top (a hosts file's keys, the command line's): config entries merge
      key by key, a None value leaves the option as it was;
    - with_entries(entries): config entries added on top (a remedy's or a search candidate's);
    - required(entries) / own(): a variant's required entries added and named (REQUIRED), and taken off again.
    """

    __slots__ = ("_options",)

    def __init__(self, options=None):
        self._options = options.wire() if isinstance(options, SessionOptions) else normalize_session(options)

    def wire(self) -> dict:
        return json.loads(json.dumps(self._options))

    def json(self) -> str:
        return json.dumps(self._options, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)

    def key(self) -> str:
        return hashlib.sha256(self.json().encode()).hexdigest()

    def __getitem__(self, name: str):
        return self._options[name]

    def get(self, name: str, default=None):
        return self._options.get(name, default)

    def __eq__(self, other) -> bool:
        return isinstance(other, SessionOptions) and self.json() == other.json()

    def __hash__(self) -> int:
        return hash(self.json())

    def __repr__(self) -> str:
        return "SessionOptions(%s)" % self.json()

    def layered(self, overrides: "dict | None") -> "SessionOptions":
        out = self.wire()
        for key, value in (overrides or {}).items():
            if key == "config_entries":
                out["config_entries"] = dict(out["config_entries"], **(value or {}))
            elif value is not None:
                out[key] = value
        return SessionOptions(out)

    def with_entries(self, entries: "dict | None") -> "SessionOptions":
        return self.layered({"config_entries": entries or {}})

    def required(self, added: dict) -> "SessionOptions":
        """These options with `added` config entries, named as a variant's required entries (none: unchanged)."""
        if not added:
            return self
        out = self.wire()
        out["config_entries"] = dict(out["config_entries"], **added)
        out[REQUIRED] = added
        return SessionOptions(out)

    def own(self) -> "SessionOptions":
        """The host's own options of options a variant ran under (required's inverse)."""
        out = self.wire()
        added = out.pop(REQUIRED, None)
        if added:
            out["config_entries"] = {k: v for k, v in out["config_entries"].items() if k not in added}
        return SessionOptions(out)


# --------------------------------------------------------------------------- framing


def write_frame(stream, header: dict, payload=b"", flush: bool = True) -> None:
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    if isinstance(payload, (list, tuple)):
        size = sum(len(p) for p in payload)
        stream.write(_HEAD.pack(MAGIC, len(head), size) + head)
        for part in payload:
            stream.write(part)
    else:
        stream.write(_HEAD.pack(MAGIC, len(head), len(payload)) + head)
        if payload:
            stream.write(payload)
    if flush:
        stream.flush()


def _read_exact(stream, n: int) -> bytes:
    chunks = []
    while n > 0:
        block = stream.read(n)
        if not block:
            raise EOFError("stream ended inside a frame")
        chunks.append(block)
        n -= len(block)
    return b"".join(chunks)


def read_frame(stream):
    """(header, payload) or None at a clean end of stream."""
    first = stream.read(_HEAD.size)
    if not first:
        return None
    if len(first) < _HEAD.size:
        first += _read_exact(stream, _HEAD.size - len(first))
    magic, hlen, plen = _HEAD.unpack(first)
    if magic != MAGIC:
        raise ValueError("not a quantbench worker frame (magic %r)" % (magic,))
    header = json.loads(_read_exact(stream, hlen).decode("utf-8"))
    payload = _read_exact(stream, plen) if plen else b""
    return header, payload


# --------------------------------------------------------------------------- fingerprint

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


# --------------------------------------------------------------------------- sessions


_MODES = None

#: a session's profile folder: `quantbench-profile-<pid>@<8 hex of the host name>-<random>` (its owner named, so a
#: killed worker's folder is told from a live one's and swept by the next worker: sweep_profiles)
PROFILE_PREFIX = "quantbench-profile-"
_SWEPT: set = set()


def _owner() -> str:
    import socket

    return f"{os.getpid()}@{hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]}"


def profile_dir(scratch=None) -> str:
    """A new folder for one session's profile under `scratch` (None: the system's temporary folder), after the
    folders of dead workers there are swept (once per folder and process)."""
    import tempfile

    parent = scratch or tempfile.gettempdir()
    if parent not in _SWEPT:
        _SWEPT.add(parent)
        sweep_profiles(parent)
    return tempfile.mkdtemp(prefix=f"{PROFILE_PREFIX}{_owner()}-", dir=parent)


def sweep_profiles(parent) -> list:
    """Remove the profile folders in `parent` whose owner (a worker on this machine) is gone: a worker killed
    mid-run never ends its profile. A live owner's folder, another machine's or an unnamed one is kept."""
    import re
    import shutil

    me, removed = _owner().split("@")[1], []
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return removed
    for name in names:
        m = re.fullmatch(re.escape(PROFILE_PREFIX) + r"(\d+)@([0-9a-f]{8})-\w+", name)
        if not m or m[2] != me or int(m[1]) == os.getpid() or os.path.islink(os.path.join(parent, name)):
            continue
        try:
            os.kill(int(m[1]), 0)
            continue   # alive (or another user's: kept)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            removed.append(name)
        except OSError:
            continue
    return removed


def make_session(model, session: dict, profile: bool = False, scratch=None):
    """An InferenceSession built exactly from `session`; returns (sess, resolved providers, readback).
    `profile`: onnxruntime profiles its first run, which read_placement reads back (and ends), in a folder
    under `scratch` (the run's own temporary folder, in its results; None: the system's)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(profile_dir(scratch), "run")
    so.intra_op_num_threads = session["intra_op_num_threads"]
    so.inter_op_num_threads = session["inter_op_num_threads"]
    so.execution_mode = (ort.ExecutionMode.ORT_SEQUENTIAL if session["execution_mode"] == "sequential"
                         else ort.ExecutionMode.ORT_PARALLEL)
    so.graph_optimization_level = {
        "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[session["graph_optimization_level"]]
    so.log_severity_level = 3
    for key, value in session["config_entries"].items():
        so.add_session_config_entry(key, value)
    if os.environ.get("QUANTBENCH_WORKER_SPIN") == "0":  # an emulated guest: its threads share the host's cores
        for key in ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning"):
            if key not in session["config_entries"]:
                so.add_session_config_entry(key, "0")
    readback = {
        "intra_op_num_threads": so.intra_op_num_threads,
        "inter_op_num_threads": so.inter_op_num_threads,
        "execution_mode": str(so.execution_mode),
        "graph_optimization_level": str(so.graph_optimization_level),
        "config_entries": {k: so.get_session_config_entry(k) for k in session["config_entries"]},
    }
    providers = list(session["providers"])  # the host's deployed session's (hosts.deploy), overrides applied
    unknown = [p for p in providers if p not in ort.get_all_providers()]
    if unknown:
        raise ValueError("unknown execution provider %s; this onnxruntime %s has %s" % (
            ", ".join(unknown), ort.__version__, ", ".join(ort.get_available_providers())))
    _check_required(ort, session.get(REQUIRED) or {})
    sess = ort.InferenceSession(model, sess_options=so, providers=providers)
    return sess, list(sess.get_providers()), readback


_LIBRARY_KEYS = {}


def _check_required(ort, required: dict) -> None:
    """Refuse a required config entry this onnxruntime does not know (onnxruntime ignores an unknown key, so the
    session would run without it): its keys are strings in its shared library (inputs/configkeys.py alike)."""
    if not required:
        return
    capi = os.path.join(os.path.dirname(ort.__file__), "capi")
    libs = sorted(f for f in os.listdir(capi) if f.startswith("libonnxruntime.so") or f == "onnxruntime.dll") \
        if os.path.isdir(capi) else []
    if not libs:
        return  # no library to read the keys from: onnxruntime's own behaviour decides
    import mmap

    path = os.path.join(capi, libs[0])
    for key in required:
        if (path, key) not in _LIBRARY_KEYS:
            with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as lib:
                _LIBRARY_KEYS[(path, key)] = lib.find(b"\x00" + key.encode() + b"\x00") >= 0
    unknown = [k for k in required if not _LIBRARY_KEYS[(path, k)]]
    if unknown:
        raise ValueError("this onnxruntime %s does not know session config key %s" % (ort.__version__, ", ".join(unknown)))


def read_placement(sess) -> dict:
    """{provider: {op type: nodes}}: which execution provider ran each node of the session's profiled run
    (its profile's kernel events, the run itself; never the session object's provider list). Ends the
    profiling and removes the profile."""
    path = sess.end_profiling()
    if not path:
        return {}
    try:
        with open(path, "r") as fh:
            text = fh.read()
        try:
            events = json.loads(text)
        except ValueError as exc:
            raise _cut_short(path, exc)
    finally:
        try:
            os.remove(path)
            os.rmdir(os.path.dirname(path))
        except OSError:
            pass
    events = events.get("traceEvents", []) if isinstance(events, dict) else events
    nodes = {}
    for e in events:
        name = str(e.get("name", ""))
        if e.get("cat") == "Node" and name.endswith("_kernel_time"):
            args = e.get("args") or {}
            nodes[name[:-len("_kernel_time")]] = (str(args.get("provider", "")), str(args.get("op_name", "")))
    out = {}
    for provider, op in nodes.values():
        ops = out.setdefault(provider, {})
        ops[op] = ops.get(op, 0) + 1
    return {p: dict(sorted(o.items())) for p, o in sorted(out.items())}


#: free bytes below which a profile that does not parse was cut short by a full disk: onnxruntime writes it from
#: C++ and reports no short write, and the event that did not fit is far smaller than this
PROFILE_ROOM = 1 << 16


def _cut_short(path, exc) -> Exception:
    """What a profile at `path` that is not JSON (`exc`) means: a full disk (a JobError of stage "disk" naming the
    profile's folder) when its file system has less than PROFILE_ROOM free, else `exc` itself."""
    folder = os.path.dirname(path)
    try:
        st = os.statvfs(folder)
        full = st.f_bavail * st.f_frsize < PROFILE_ROOM
    except (OSError, AttributeError):
        full = False
    if not full:
        return exc
    return JobError("disk", "onnxruntime's profile of the run was cut short (%s)" % (exc,), folder=folder)


def provider_problems(requested, available, placement=None) -> list:
    """What a run did not do of its provider request: a requested provider this onnxruntime does not have, or
    (with `placement`, read_placement's) one that took no node. The CPU provider as the last, fallback choice
    need not take any."""
    out = []
    for i, p in enumerate(requested):
        if p not in available:
            out.append("%s is not available in this onnxruntime (available: %s)" % (p, ", ".join(available)))
        elif placement is not None and p not in placement and not (p == "CPUExecutionProvider" and i == len(requested) - 1):
            ran = ", ".join("%s %d" % (q, sum(o.values())) for q, o in placement.items()) or "none"
            out.append("%s took no nodes (nodes per provider: %s)" % (p, ran))
    return out


def _available_providers() -> list:
    import onnxruntime as ort

    return list(ort.get_available_providers())


def check_providers(requested, require_providers: bool, placement=None) -> "str | None":
    """The refusal of a run whose providers are required (require_providers) and not all ran; None otherwise."""
    problems = provider_problems(requested, _available_providers(), placement)
    if problems and require_providers:
        return "requested execution providers are required: %s" % "; ".join(problems)
    return None


def _unsupported(exc, running: bool) -> bool:
    """Whether onnxruntime's error says this runtime cannot run the model (the host's result, stage
    "unsupported"): no kernel for an op or a provider failing as the session is made; while running, a
    provider's own fused node failing (an error in the model or its inputs fails on every host instead)."""
    text = str(exc)
    if running:
        return "RUNTIME_EXCEPTION" in text and "ExecutionProvider_" in text
    return "NOT_IMPLEMENTED" in text or "RUNTIME_EXCEPTION" in text


class JobError(Exception):
    """A job's failure, by stage; `folder`: for stage "disk", the folder whose file system is full."""

    def __init__(self, stage, message, fixture_id=None, folder=None):
        Exception.__init__(self, message)
        self.stage = stage
        self.fixture_id = fixture_id
        self.folder = folder


def _model_source(job, payload):
    model = job["model"]
    if "path" in model:
        with open(model["path"], "rb") as fh:
            data = fh.read()
    else:
        data = payload[model["offset"]:model["offset"] + model["nbytes"]]
    want = model.get("sha256")
    if want and hashlib.sha256(data).hexdigest() != want:
        raise JobError("model", "model bytes SHA-256 mismatch (expected %s...)" % want[:12])
    return bytes(data)


_STORES = {}
_VERIFIED = set()


def _store(path: str):
    """A read-only map of an input store file (local hosts: the parent writes every input once per run)."""
    m = _STORES.get(path)
    if m is None:
        import mmap

        with open(path, "rb") as fh:
            m = _STORES[path] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    return m


def _input_item(fx, view, store):
    """(fixture header, array, cache key or None, expected SHA-256) of one input, not yet verified."""
    want = fx.get("sha256") or fx["fixture_id"]
    path = fx.get("file") or store
    try:
        if path:
            src = memoryview(_store(path))
            key = (path, fx["offset"], fx["nbytes"], fx["dtype"], tuple(fx["shape"]), want)
        else:
            src, key = view, None
        if fx["offset"] + fx["nbytes"] > len(src):
            raise ValueError("bytes %d-%d are past the end of the %s (%d bytes)"
                             % (fx["offset"], fx["offset"] + fx["nbytes"], "input store" if path else "request",
                                len(src)))
        arr = tensor_from_bytes(src[fx["offset"]:fx["offset"] + fx["nbytes"]], fx["dtype"], fx["shape"])
    except (OSError, ValueError, TypeError) as exc:
        raise JobError("input", "cannot read the input tensor: %s" % (exc,), fx.get("fixture_id"))
    return fx, arr, key, want


def _verify(fx, arr, key, want) -> None:
    if key is not None and key in _VERIFIED:  # the store is immutable: verified once per worker
        return
    got = tensor_sha256(arr)
    if got != want:
        raise JobError("input", "input tensor SHA-256 mismatch: expected %s, got %s; inputs must be "
                       "byte-identical on every host" % (want, got), fx["fixture_id"])
    if key is not None:
        _VERIFIED.add(key)


def _inputs(job, payload):
    """The job's (fixture header, array) pairs, every input verified first (the fingerprint probe)."""
    view = memoryview(payload)  # zero-copy slices
    items = [_input_item(fx, view, job.get("store")) for fx in job["fixtures"]]
    for item in items:
        _verify(*item)
    return [(fx, arr) for fx, arr, _, _ in items]


class _Verifier:
    """Maps and hashes a job's inputs in order on a helper thread, ahead of the runs.

    hashlib releases the GIL on large buffers and onnxruntime releases it in session
    creation and run, so with the worker's one compute thread the hashing happens on
    another core while the session is built and the first fixtures run (SHA-256 of a
    128x128 input costs about as much as a third of the demo classifier's inference
    on this project's slowest machine). run_job calls wait(i + 1) before running
    fixture i and then reads items[i]: no input runs unverified, and a mismatch stops
    the job at that fixture, every earlier result already sent.
    """

    def __init__(self, job, payload):
        import threading

        self.job, self.payload = job, payload
        self.items, self.done, self.error, self.seconds, self.cancelled = [], 0, None, 0.0, False
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="verify-inputs", daemon=True)
        self.thread.start()

    def _run(self):
        t0 = time.perf_counter()
        view, store = memoryview(self.payload), self.job.get("store")
        for i, fx in enumerate(self.job["fixtures"]):
            if self.cancelled:
                return
            try:
                item = _input_item(fx, view, store)
                _verify(*item)
            except Exception as exc:  # re-raised in the job's thread by wait()
                with self.cond:
                    self.error = exc
                    self.cond.notify_all()
                return
            self.items.append(item)
            with self.cond:
                self.done = i + 1
                self.seconds = time.perf_counter() - t0
                self.cond.notify_all()

    def wait(self, n: int) -> None:
        """Return once the first n inputs are verified; raise the mismatch that prevents it."""
        if self.done >= n:  # read without the lock: it only grows
            return
        with self.cond:
            while self.done < n and self.error is None:
                self.cond.wait()
            if self.done < n:
                raise self.error

    def cancel(self) -> None:
        """Stop hashing (the job failed): a dead job's verifier must not slow the next one."""
        self.cancelled = True


def _output_frame(job, fx_ids, outputs, names, want_tensors, seconds, rep):
    entries, payload, offset = [], [], 0
    for name, arr in zip(names, outputs):
        arr = canonical(arr)
        entry = {"name": name, "dtype": arr.dtype.str, "shape": [int(d) for d in arr.shape],
                 "sha256": tensor_sha256(arr)}
        if want_tensors is True or (isinstance(want_tensors, list) and name in want_tensors):
            raw = arr.tobytes()
            entry["offset"], entry["nbytes"] = offset, len(raw)
            payload.append(raw)
            offset += len(raw)
        entries.append(entry)
    return {"type": "result", "fixture_id": fx_ids, "outputs": entries, "seconds": seconds, "repeat": rep,
            "variant": job.get("variant", "")}, payload


class _Sender:
    """Hashes, encodes and writes result frames on a helper thread, so the compute thread only runs.

    On this project's slowest machines the per-result Python work (canonical bytes, SHA-256,
    JSON, the pipe write) costs about a third of a small model's inference. Here the compute
    thread only appends the outputs to a deque (no lock, no wake-up); every PERIOD the sender
    wakes, writes whatever has accumulated while the next session.run (which releases the GIL)
    goes on, and flushes. Frames leave in order; the parent sees every result within about
    PERIOD of it being ready, and a killed worker loses at most that much work (the resumed run
    redoes it). At most BACKLOG results wait, so a slow reader holds back the runs, not memory.
    """

    PERIOD = 0.02
    BACKLOG = 256

    def __init__(self, out, job, names, want_tensors):
        import collections
        import threading

        self.out, self.job, self.names, self.want_tensors = out, job, names, want_tensors
        self.pending = collections.deque()
        self.error = None
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._run, name="send-results", daemon=True)
        self.thread.start()

    def put(self, fx_id, outputs, seconds, rep, extra=None) -> None:
        """Queue one result; `extra`: fields for its header (the placement, with a session's first result)."""
        while len(self.pending) >= self.BACKLOG and self.error is None:
            time.sleep(self.PERIOD / 4)
        if self.error is not None:
            raise self.error
        self.pending.append((fx_id, outputs, seconds, rep, extra))

    def _drain(self) -> None:
        wrote = False
        while self.pending:
            fx_id, outputs, seconds, rep, extra = self.pending.popleft()
            header, parts = _output_frame(self.job, fx_id, outputs, self.names, self.want_tensors, seconds, rep)
            header.update(extra or {})
            write_frame(self.out, header, parts, flush=False)
            wrote = True
        if wrote:
            self.out.flush()

    def _run(self):
        try:
            while not self.closing.wait(self.PERIOD):
                self._drain()
            self._drain()
        except Exception as exc:  # the parent went away: the compute thread raises it at its next put
            self.error = exc

    def close(self) -> None:
        """Write and flush everything pending (results before any error frame), then stop."""
        self.closing.set()
        self.thread.join()
        if self.error is not None:
            raise self.error

    def sync(self) -> None:
        """Write and flush everything pending, then go on sending (the test pause hook only)."""
        import threading

        self.close()
        self.closing.clear()
        self.thread = threading.Thread(target=self._run, name="send-results", daemon=True)
        self.thread.start()


def _test_pause(sender) -> None:
    """The test-only pause hook, called after each result while it is armed (see the module docstring)."""
    _TEST_PAUSE[0] -= 1
    if _TEST_PAUSE[0] != 0:
        return
    path = _TEST_PAUSE[1]
    sender.sync()  # the K results are with the parent before anything else happens
    pid = str(os.getpid())
    for done in (path + ".paused." + pid, path + ".paused"):
        with open(done + ".tmp" + pid, "w") as fh:
            fh.write(pid)
        os.replace(done + ".tmp" + pid, done)
    while not os.path.exists(path):
        time.sleep(0.01)


#: the session kept for later jobs: (model SHA-256, session options JSON) -> [session, providers, readback,
#: placement (read_placement's, once its first run was profiled; None before)]
_SESSIONS = {}


def _cached_session(data, session, sha256=None, scratch=None):
    """([session, resolved providers, readback, placement], reused): the last job's session when this job has
    the same model bytes and options (the runner splits a variant's fixtures into several jobs), else a new one
    (its first run profiled: placement None until then). One session at most is kept, and it is dropped
    before another is built: a worker never holds two. `sha256`: the model bytes' hash, already checked by
    _model_source."""
    key = (sha256 or hashlib.sha256(data).hexdigest(), json.dumps(session, sort_keys=True))
    hit = _SESSIONS.get(key)
    if hit is not None:
        return hit, True
    _drop_sessions()
    made = list(make_session(data, session, profile=True, scratch=scratch)) + [None]
    _SESSIONS[key] = made
    return made, False


def _drop_sessions() -> None:
    """Drop the kept session; one whose profiled run never happened ends its profiling first, so onnxruntime
    leaves no profile file behind (read_placement removes it)."""
    for old in _SESSIONS.values():
        if old[3] is None:
            try:
                read_placement(old[0])
            except Exception:
                pass
    _SESSIONS.clear()


def _check_tensor_outputs(sess) -> None:
    """Refuse outputs that are not numeric tensors: a ZipMap's list of dicts (or a string tensor) has no
    tensor bytes, only object pointers, which must never be hashed. Same wording as quantize/intake.py."""
    for o in sess.get_outputs():
        if not o.type.startswith("tensor(") or o.type == "tensor(string)":
            raise JobError("session", "output %r is %s, not a numeric tensor; quantbench hashes tensors only: export "
                           "the classifier without ZipMap (skl2onnx: options={'zipmap': False}) and with integer "
                           "class labels" % (o.name, o.type))


def run_job(job, payload, out) -> None:
    """Run every fixture of `job`, streaming one result frame per fixture (per repeat)."""
    host, variant = job.get("host", ""), job.get("variant", "")
    session = normalize_session(job.get("session"))
    data = _model_source(job, payload)
    verifier = _Verifier(job, payload)
    try:
        t1 = time.perf_counter()
        try:
            made, reused = _cached_session(data, session, job["model"].get("sha256"), job.get("scratch"))
        except Exception as exc:  # with the variant's required entries: the host cannot apply them (a result)
            if session.get(REQUIRED):
                raise JobError("requirement", "could not create the session with its required entries %s: %s: %s" % (
                    ", ".join("%s=%s" % kv for kv in sorted(session[REQUIRED].items())), type(exc).__name__, exc))
            raise JobError("unsupported" if _unsupported(exc, False) else "session",
                           "could not create the session: %s: %s" % (type(exc).__name__, exc))
        sess, resolved, readback, placement = made
        require = bool(job.get("require_providers"))
        problem = check_providers(session["providers"], require, placement)
        if problem:
            raise JobError("providers", problem)
        names = [o.name for o in sess.get_outputs()]
        _check_tensor_outputs(sess)
        if job.get("output_names"):
            unknown = [n for n in job["output_names"] if n not in names]
            if unknown:
                raise JobError("session", "model has no output(s) %s (outputs: %s)" % (unknown, names))
            names = list(job["output_names"])
        t2 = time.perf_counter()
        write_frame(out, {"type": "session", "providers": resolved, "session_readback": readback,
                          "outputs": names, "host": host, "variant": variant, "session_seconds": t2 - t1,
                          "reused": reused, "placement": placement,
                          "provider_problems": provider_problems(session["providers"], _available_providers(),
                                                                 placement)})
        sender = _Sender(out, job, names, job.get("return_tensors", True))
        placed = None if placement is not None else (made, session["providers"], require)
        try:
            _run_fixtures(sess, names, len(job["fixtures"]), verifier, sender, session["batch"],
                          int(job.get("repeat", 1)), placed)
        finally:
            sender.close()  # every finished result goes out before an error frame
        write_frame(out, {"type": "verified", "fixtures": verifier.done, "verify_seconds": verifier.seconds})
    finally:
        verifier.cancel()


def _placed(placed) -> dict:
    """After a new session's first (profiled) run: its placement, kept with the session and sent with the first
    result; the job's refusal when its providers are required and did not all run."""
    made, requested, require = placed
    made[3] = read_placement(made[0])
    problem = check_providers(requested, require, made[3])
    if problem:
        raise JobError("providers", problem)
    return {"placement": made[3], "provider_problems": provider_problems(requested, _available_providers(), made[3])}


def _run_fixtures(sess, names, n, verifier, sender, batch, repeat, placed=None) -> None:
    """The compute loop: only session.run and handing the outputs over (see _Sender). `placed`: (the cached
    session entry, requested providers, required) when this session's first run is profiled (_placed)."""
    for start in range(0, n, batch):
        verifier.wait(min(n, start + batch))
        group = verifier.items[start:start + batch]
        ids = [fx["fixture_id"] for fx, _, _, _ in group]
        if len(group) == 1:
            feed = {group[0][0]["input_name"]: group[0][1]}
        else:
            by_input = {}
            for fx, arr, _, _ in group:
                by_input.setdefault(fx["input_name"], []).append(arr)
            feed = {k: (v[0] if len(v) == 1 else np.concatenate(v, axis=0)) for k, v in by_input.items()}
        for rep in range(repeat):
            t0 = time.perf_counter()
            try:
                outputs = sess.run(names, feed)
            except Exception as exc:
                raise JobError("unsupported" if _unsupported(exc, True) else "run", "%s: %s" % (type(exc).__name__, exc),
                               ids[0] if len(ids) == 1 else ids)
            seconds = time.perf_counter() - t0
            extra, placed = (_placed(placed) if placed is not None else None), None
            if len(group) == 1:
                sender.put(ids[0], outputs, seconds, rep, extra)
                if _TEST_PAUSE is not None:
                    _test_pause(sender)
                continue
            for i, fid in enumerate(ids):
                split = []
                for name, arr in zip(names, outputs):
                    if arr.ndim == 0 or arr.shape[0] != len(group):
                        raise JobError("run", "batch %d: output %r has leading dimension %s, cannot split per "
                                       "fixture" % (len(group), name, arr.shape[:1]), fid)
                    split.append(arr[i:i + 1])
                sender.put(fid, split, seconds / len(group), rep, extra if i == 0 else None)
                if _TEST_PAUSE is not None:
                    _test_pause(sender)


def fingerprint_job(job, payload, out) -> None:
    """Fingerprint under the job's session options, resolved with a probe model if one is sent."""
    session = normalize_session(job.get("session"))
    resolved, readback, probe = [], {}, None
    if job.get("model"):
        data = _model_source(job, payload)
        sess, resolved, readback = make_session(data, session)
        problem = check_providers(session["providers"], bool(job.get("require_providers")))
        if problem:
            raise JobError("providers", problem)
        if job.get("fixtures"):
            _check_tensor_outputs(sess)
            fx, arr = _inputs(job, payload)[0]
            outs = sess.run(None, {fx["input_name"]: arr})
            probe = [tensor_sha256(o) for o in outs]
    fp = collect_fingerprint(session, resolved, readback)
    write_frame(out, {"type": "fingerprint", "fingerprint": fp, "fingerprint_id": fingerprint_id(fp),
                      "probe_sha256": probe, "host": job.get("host", "")})


def fork_job(job, out) -> None:
    """Fork this worker (see the module docstring): the child serves the socket job["socket"] and never returns."""
    import signal
    import threading

    for th in threading.enumerate():  # a job's helper threads end with it; a fork copies only this thread
        if th is not threading.current_thread():
            th.join(5)
    if threading.active_count() > 1:
        raise JobError("fork", "helper threads still running: %s" % [t.name for t in threading.enumerate()])
    path = job["socket"]
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # forked workers are reaped by the kernel, never zombies
    out.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os._exit(_serve_forked(path, out))
    write_frame(out, {"type": "forked", "pid": pid, "host": job.get("host", "")})


def _serve_forked(path, out) -> int:
    """The forked child: drop every descriptor of the parent's pipes, serve the socket's two connections."""
    import signal
    import socket

    code = 1
    try:
        os.setsid()  # its own session, like a started worker (one CPU share each under autogroup scheduling)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        err = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        err.connect(path)
        # The parent's stdin, stdout (protocol) and stderr pipes must not stay open here: the runner would
        # never see them end. The same descriptor numbers now name this child's connections.
        os.dup2(err.fileno(), 2)
        os.dup2(err.fileno(), 1)
        os.dup2(conn.fileno(), 0)
        os.dup2(conn.fileno(), out.fileno())
        err.close()
        conn.close()
        code = serve(os.fdopen(os.dup(0), "rb"), out)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            out.flush()
            sys.stderr.flush()
        except Exception:
            pass
    return code


class InputWatch:
    """While a job runs nothing arrives on the worker's input (the parent waits for "done"), so the input's other
    end closing then, with no request left unread, means the parent is gone: killed, or its connection dropped.
    This helper thread ends the worker at once when that happens: a forked worker (its parent-death signal watches
    the worker it was forked from, which may end first) and a remote one (an ssh host's, a child of the remote's
    sshd) die with the command as a started worker does (die_with_parent), also while busy or paused. A client
    that wrote its later requests and closed its end (they are still to be read) is served as before. It ends
    with the job. `inp`: the worker's buffered input (its peek sees what was read ahead)."""

    def __init__(self, inp):
        import select
        import threading

        self.inp, self.fd, (self.stop_r, self.stop_w) = inp, inp.fileno(), os.pipe()
        self.poll = select.poll()
        # hang-up only (POLLHUP and POLLERR always count): a pipe's writer closing, a socket's peer shutting down
        self.poll.register(self.fd, getattr(select, "POLLRDHUP", 0x2000))
        self.poll.register(self.stop_r, select.POLLIN)  # closed by close()
        self.thread = threading.Thread(target=self._run, name="watch-input", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        events = dict(self.poll.poll())
        if self.stop_r in events:
            return
        try:
            if self.inp.peek(1):  # (hung up: never blocks) requests still to read, the client's last words
                return
        except (OSError, ValueError):
            pass
        try:  # (stderr may be the same dead connection)
            sys.stderr.write("quantbench worker: the input ended in the middle of a job; ending\n")
            sys.stderr.flush()
        finally:
            os._exit(1)

    def close(self) -> None:
        os.close(self.stop_w)
        self.thread.join()
        os.close(self.stop_r)


def _watched(fn, inp, *args) -> None:
    """fn(*args) with its input watched (InputWatch); unwatched when `inp` has no descriptor or no peek."""
    try:
        inp.fileno()
    except (AttributeError, OSError, ValueError):
        return fn(*args)
    if not hasattr(inp, "peek"):
        return fn(*args)
    watch = InputWatch(inp)
    try:
        fn(*args)
    finally:
        watch.close()


def serve(inp, out) -> int:
    """The worker loop: answer requests until "end" or end of input."""
    while True:
        frame = read_frame(inp)
        if frame is None or frame[0].get("type") == "end":
            _drop_sessions()
            return 0
        job, payload = frame
        kind = job.get("type")
        try:
            if kind == "fingerprint":
                _watched(fingerprint_job, inp, job, payload, out)
            elif kind == "run":
                _watched(run_job, inp, job, payload, out)
            elif kind == "fork":  # unwatched: a fork copies only this thread
                fork_job(job, out)
            else:
                raise JobError("protocol", "unknown request type %r" % (kind,))
        except Exception as exc:
            _drop_sessions()  # a failed job's session is built anew (its first run profiled) by the next one
            stage = exc.stage if isinstance(exc, JobError) else "worker"
            fixture = exc.fixture_id if isinstance(exc, JobError) else None
            write_frame(out, {"type": "error", "stage": stage, "message": str(exc) or type(exc).__name__,
                              "host": job.get("host", ""), "variant": job.get("variant", ""),
                              "fixture_id": fixture, "folder": getattr(exc, "folder", None),
                              "traceback": "" if isinstance(exc, JobError) else traceback.format_exc()})
        write_frame(out, {"type": "done"})
        del payload


def die_with_parent(parent: "int | None" = None) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux prctl PR_SET_PDEATHSIG; under qemu-user
    the call reaches the kernel for the qemu process, which is the parent's child), so a parent killed by SIGTERM
    or SIGKILL leaves no worker running (one asked for 100000 threads grew 40 MB/s as an orphan). The kernel
    counts the parent's thread that started this process: the threads that start workers close them before they
    end. `parent`: the pid expected; gone already (this process was adopted) ends it now. Elsewhere: nothing."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        PR_SET_PDEATHSIG = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if (os.getppid() != parent) if parent is not None else os.getppid() == 1:
        os._exit(1)


def main() -> int:
    die_with_parent()
    # The protocol owns the original stdout; anything a library prints goes to stderr.
    proto = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return serve(sys.stdin.buffer, proto)


if __name__ == "__main__":
    sys.exit(main())
