"""x86 tier profiles: the CPUID of real CPUs (vendor, family/model/stepping, feature leaves) a masked worker sees.

A profile names its features with /proc/cpuinfo's flag names (quantbench.worker.X86_FLAGS, which
also says where each bit lives). `encode` turns it into the shim's QUANTBENCH_CPUID_PROFILE: the vendor,
the leaf 1 EAX signature, and AND-masks that keep, of the named bits, only the profile's (leaves 7.0 and
7.1 keep nothing else; leaf 1 and 0x80000001 keep their unnamed system bits), plus the XSAVE components
(0xD.0 EAX) the profile's vector registers need. `glibc_hwcaps` is the GLIBC_TUNABLES value that masks
glibc's own start-up dispatch the same way (glibc 2.33+ names, checked on 2.36).
"""

from __future__ import annotations

from dataclasses import dataclass

from quantbench.worker import X86_FLAGS

_BASE = ("fpu tsc cx8 cmov mmx fxsr sse sse2 syscall nx lm lahf_lm pni ssse3 cx16 sse4_1 sse4_2 popcnt").split()
_SNB = _BASE + "pclmulqdq aes xsave osxsave avx xsaveopt".split()
_HSW = _SNB + "fma movbe f16c rdrand abm bmi1 avx2 bmi2 erms".split()
_SKX = _HSW + "rdseed adx avx512f avx512dq avx512cd avx512bw avx512vl".split()
_CLX = _SKX + ["avx512_vnni"]
_ADL = _HSW + "rdseed adx sha_ni gfni vaes vpclmulqdq avx_vnni".split()
_SPR = _CLX + ("avx512ifma avx512vbmi avx512_vbmi2 gfni vaes vpclmulqdq avx512_bitalg avx512_vpopcntdq "
               "avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8 avx_vnni sha_ni").split()
_ZEN2 = _HSW + "sse4a rdseed adx sha_ni".split()
_ZEN4 = _ZEN2 + ("avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512vbmi avx512_vbmi2 gfni vaes "
                 "vpclmulqdq avx512_vnni avx512_bitalg avx512_vpopcntdq avx512_bf16").split()

#: XSAVE state components (0xD.0 EAX bits) that belong to a feature: AVX's YMM, AVX-512's opmask and ZMM, AMX's tiles
_XSAVE_OF = {2: "avx", 5: "avx512f", 6: "avx512f", 7: "avx512f", 17: "amx_tile", 18: "amx_tile"}
#: glibc.cpu.hwcaps names of features glibc's own dispatch (memcpy, libm's FMA variants) reads
_GLIBC_NAMES = {"avx": "AVX", "avx2": "AVX2", "fma": "FMA", "fma4": "FMA4", "avx512f": "AVX512F",
                "avx512bw": "AVX512BW", "avx512cd": "AVX512CD", "avx512dq": "AVX512DQ", "avx512vl": "AVX512VL",
                "bmi1": "BMI1", "bmi2": "BMI2", "abm": "LZCNT", "movbe": "MOVBE", "f16c": "F16C",
                "erms": "ERMS", "xsave": "XSAVE"}
#: registers holding only named bits we model (anything else there is cleared)
_STRICT = {("7.0", 1), ("7.0", 2), ("7.0", 3), ("7.1", 0)}
_REGISTERS = (("1.0", 2), ("1.0", 3), ("7.0", 1), ("7.0", 2), ("7.0", 3), ("7.1", 0), ("80000001.0", 2),
              ("80000001.0", 3))


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    vendor: str
    signature: int  # leaf 1 EAX: stepping | model << 4 | family << 8 | ext model << 16 | ext family << 20
    brand: str
    features: tuple[str, ...]
    qemu_preset: str = ""  # the emulated preset of the same CPU, where qemu has the model


def _p(name, desc, vendor, sig, brand, feats, qemu=""):
    return Profile(name, desc, vendor, sig, brand, tuple(sorted(set(feats))), qemu)


PROFILES: dict[str, Profile] = {p.name: p for p in (
    _p("x86-sse4", "SSE4.2, no AVX (Intel Nehalem)", "GenuineIntel", 0x106A5,
       "Intel(R) Core(TM) i7 CPU         920  @ 2.67GHz", _BASE, "x86-sse4"),
    _p("x86-avx", "AVX, no AVX2/FMA (Intel Sandy Bridge)", "GenuineIntel", 0x206A7,
       "Intel(R) Core(TM) i7-2600 CPU @ 3.40GHz", _SNB, "x86-avx"),
    _p("x86-avx2", "AVX2 + FMA3, no AVX-512 (Intel Haswell)", "GenuineIntel", 0x306C3,
       "Intel(R) Core(TM) i7-4770 CPU @ 3.40GHz", _HSW, "x86-avx2"),
    _p("x86-avx512", "AVX-512 F/CD/BW/DQ/VL, no VNNI (Intel Skylake-SP)", "GenuineIntel", 0x50654,
       "Intel(R) Xeon(R) Platinum 8175M CPU @ 2.50GHz", _SKX),
    _p("x86-vnni", "AVX-512 VNNI, no AMX (Intel Cascade Lake)", "GenuineIntel", 0x50657,
       "Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz", _CLX),
    _p("x86-avxvnni", "AVX-VNNI, no AVX-512 (Intel Alder Lake)", "GenuineIntel", 0x90672,
       "12th Gen Intel(R) Core(TM) i7-12700K", _ADL),
    _p("x86-amx", "AMX-INT8/BF16 + AVX-512 VNNI/BF16/FP16 (Intel Sapphire Rapids)", "GenuineIntel", 0x806F8,
       "Intel(R) Xeon(R) Platinum 8488C", _SPR),
    _p("x86-zen2", "AVX2 + FMA3, no AVX-512 (AMD Zen 2)", "AuthenticAMD", 0x830F10, "AMD EPYC 7R32", _ZEN2),
    _p("x86-zen4", "AVX-512 VNNI + BF16, no AVX-VNNI (AMD Zen 4)", "AuthenticAMD", 0xA10F11,
       "AMD EPYC 9R14 96-Core Processor", _ZEN4),
)}


def profile(name: str) -> Profile | None:
    return PROFILES.get(name)


def _bit_masks(features) -> dict:
    """(leaf, register) -> AND-mask keeping the profile's named bits (and, outside _STRICT, unnamed ones)."""
    masks = {key: (0 if key in _STRICT else 0xFFFFFFFF) for key in _REGISTERS}
    for leaf, reg, bit, name in X86_FLAGS:
        key = (leaf, reg)
        if key not in masks:
            continue
        if name in features:
            masks[key] |= 1 << bit
        else:
            masks[key] &= ~(1 << bit) & 0xFFFFFFFF
    return masks


def xsave_mask(features) -> int:
    """0xD.0 EAX mask: every component but those of vector state the profile lacks."""
    mask = 0xFFFFFFFF
    for bit, feature in _XSAVE_OF.items():
        if feature not in features:
            mask &= ~(1 << bit)
    return mask


def encode(p: Profile) -> str:
    """The shim's QUANTBENCH_CPUID_PROFILE for a profile (see cpuid_shim.c)."""
    m = _bit_masks(p.features)
    words = [p.signature, *(m[k] for k in _REGISTERS[:6]), xsave_mask(p.features), *(m[k] for k in _REGISTERS[6:])]
    return p.vendor + "," + ",".join(f"{w:08x}" for w in words)


def glibc_hwcaps(p: Profile) -> str:
    """GLIBC_TUNABLES value masking glibc's own dispatch to the profile (empty when nothing to mask)."""
    off = [f"-{glibc}" for feature, glibc in _GLIBC_NAMES.items() if feature not in p.features]
    return "glibc.cpu.hwcaps=" + ",".join(off) if off else ""


def missing_here(p: Profile, here) -> list[str]:
    """The profile's features this CPU lacks (a mask can only take features away)."""
    have = set(here)
    return [f for f in p.features if f not in have]
