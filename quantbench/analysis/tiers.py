"""CPU tiers as onnxruntime's kernels see them: which ISA flags its dispatch reads, which int8 path a host takes.

One owner of this knowledge for the analysis (classes name the features that separate them), the
explain commands (lint and remedy name the hosts of a fleet that take the saturating U8S8 path) and
the report.

The dispatch order follows MLAS's platform set-up, `MLAS_PLATFORM::MLAS_PLATFORM()` in
onnxruntime/core/mlas/lib/platform.cpp (microsoft/onnxruntime, read at commit 0112bef2):
x86: CPUID.1 FMA + CPUID.7.0 AVX2 select the AVX2 kernels (U8S8 `MlasGemmU8S8KernelAvx2`, fp32 FMA3);
CPUID.7.1 AVX-VNNI selects `MlasGemmU8S8KernelAvxVnni`; AVX512F selects the AVX-512F fp32 kernels and
AVX512BW/DQ/VL the "Avx512Core" U8S8 kernel, replaced by `MlasGemmU8S8KernelAvx512Vnni` under
AVX512_VNNI; AVX-VNNI-INT8 selects the S8S8/U8U8 VNNI dispatch; AMX-TILE + AMX-INT8 (with the tile
state enabled) select `MlasGemmU8S8DispatchAmx`; SSE4.1 is read for the U8S8 dispatch (MSVC builds).
ARM64: HWCAP ASIMDDP selects the UDOT/SDOT dispatch, HWCAP2 I8MM the UMMLA/SMMLA one, HWCAP SVE the
SVE activation kernels (erf, logistic, softmax), HWCAP2 SVEI8MM the SVE MMLA kernels, HWCAP2 BF16
the bf16 paths, HWCAP2 SME the KleidiAI SGEMM, convolution and dynamic-quantization MatMul (KleidiAI's
SME kernels: `ArmKleidiAI::MlasGemmBatch`, `MlasDynamicQGemmBatch`; `mlas.disable_kleidiai=1` turns them
off). The features named first are the ones the issue lists; the rest are also read there.
"""

from __future__ import annotations

from dataclasses import dataclass

#: ISA flags onnxruntime's kernel dispatch reads, in the order a separation names them
DISPATCH_X86 = ("avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8", "avx2", "fma", "sse4_1",
                "avx", "avx512dq", "avx512vl", "avx_vnni_int8", "amx_tile")
DISPATCH_ARM = ("asimddp", "i8mm", "sve", "sme", "bf16", "svei8mm")
DISPATCH = DISPATCH_X86 + DISPATCH_ARM
#: dispatch flags only MLAS's integer kernels read (U8S8/S8S8 GEMM and convolution): a float variant's kernels never
#: look at them, so they cannot be what separates its classes (a float variant's separation names them last)
INT8_ONLY = ("avx512bw", "avx512_vnni", "avx_vnni", "amx_int8", "avx_vnni_int8", "amx_tile", "asimddp", "i8mm",
             "svei8mm")

#: numpy's names for x86 features (what fingerprints reported before they read CPUID themselves)
#: -> the /proc/cpuinfo names, so one feature has one name whichever way a host reported it
ALIASES = {"avx512vnni": "avx512_vnni", "avxvnni": "avx_vnni", "fma3": "fma", "sse41": "sse4_1",
           "sse42": "sse4_2", "avx512bf16": "avx512_bf16", "avx512bitalg": "avx512_bitalg",
           "avx512vbmi2": "avx512_vbmi2", "avx512vpopcntdq": "avx512_vpopcntdq", "avx512fp16": "avx512_fp16",
           "avxvnniint8": "avx_vnni_int8", "amxint8": "amx_int8", "amxtile": "amx_tile", "amxbf16": "amx_bf16"}

#: qemu evidence family (quantbench.explain.evidence) -> the dispatch features that select a kernel using
#: it, first the most specific; the feature a host used is the first of these the host has
FAMILY_FEATURES = {
    "UDOT (vector)": ("asimddp",), "SDOT (vector)": ("asimddp",), "UDOT (by element)": ("asimddp",),
    "SDOT (by element)": ("asimddp",), "USDOT (vector)": ("i8mm",), "USDOT (by element)": ("i8mm",),
    "SUDOT (by element)": ("i8mm",), "SMMLA": ("i8mm",), "UMMLA": ("i8mm",), "USMMLA": ("i8mm",), "SVE": ("sve",),
    "SME": ("sme",), "SMSTART/SMSTOP": ("sme",),
    "VPMADDUBSW": ("avx512bw", "avx2"), "VPDPBUSD": ("avx512_vnni", "avx_vnni"),
    "VPDPB (AVX-VNNI-INT8)": ("avx_vnni_int8",), "TDPBUSD (AMX)": ("amx_int8",), "VFMADD": ("fma",),
}

_X86_EXACT = ("amx_int8", "avx512_vnni", "avx_vnni")


def canonical_flag(flag: str) -> str:
    """An ISA flag under its /proc/cpuinfo name (lowercase; numpy's x86 names mapped)."""
    f = str(flag).strip().lower()
    return ALIASES.get(f, f)


def canonical_flags(flags) -> list[str]:
    return sorted({canonical_flag(f) for f in flags or ()})


def dispatch_rank(flag: str) -> int | None:
    """Position of a (canonical) ISA flag in the dispatch order; None when MLAS's dispatch does not read it."""
    try:
        return DISPATCH.index(flag)
    except ValueError:
        return None


def used_features(families, flags) -> dict[str, list[str]]:
    """{dispatch feature: [families]} the kernels of a host with `flags` used, from its evidence `families`
    (the names of instruction families with sites > 0)."""
    have = set(canonical_flags(flags))
    out: dict[str, list[str]] = {}
    for fam in sorted(families):
        cands = FAMILY_FEATURES.get(fam)
        if not cands:
            continue
        feat = next((c for c in cands if c in have), cands[-1])
        out.setdefault(feat, []).append(fam)
    return out


@dataclass(frozen=True)
class Int8Path:
    """How a host's U8S8 GEMM sums its products: `exact`, or it can `saturate` (x86 VPMADDUBSW) / `wrap`
    (NEON-only SMULL/SMLAL int16 pair sums); `why` names the features that decide it."""

    host: str
    kind: str          # "saturates", "wraps" or "exact"
    why: str
    predicted: bool = False  # from a tier's profile features, for a tier no machine in reach shows: not measured

    def describe(self) -> str:
        return f"{self.host} ({self.why}{'; PREDICTED from its features, not measured' if self.predicted else ''})"


def int8_path(host: str, arch: str, flags) -> Int8Path:
    """The U8S8 int8 path of a host from its fingerprint's architecture and ISA flags (see lint)."""
    have = set(canonical_flags(flags))
    if str(arch).lower() in ("aarch64", "arm64"):
        fast = [f for f in ("i8mm", "asimddp") if f in have]
        if fast:
            return Int8Path(host, "exact", f"{fast[0]}: {'UMMLA/SMMLA' if fast[0] == 'i8mm' else 'UDOT/SDOT'}, exact")
        return Int8Path(host, "wraps", "NEON only, no asimddp/i8mm: SMULL/SMLAL int16 pair sums")
    exact = [f for f in _X86_EXACT if f in have]
    if exact:
        return Int8Path(host, "exact", f"{exact[0]}: {'AMX tiles' if exact[0] == 'amx_int8' else 'VPDPBUSD'}, exact")
    wide = [f for f in ("avx512bw", "avx2") if f in have]
    if wide:
        return Int8Path(host, "saturates", f"{wide[0]} without avx512_vnni/avx_vnni/amx_int8: VPMADDUBSW int16 "
                                           f"pair sums saturate")
    return Int8Path(host, "exact", "no avx2: SSE PMADDWD kernel, exact")
