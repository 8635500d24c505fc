"""What separates classes of CPU tiers: the ISA flags onnxruntime's kernel dispatch reads come first, in
MLAS's order, then how many other features differ, and the flags the kernels used (qemu evidence).

Synthetic fingerprints, modelled on the tiers' real feature sets (x86: Haswell, Skylake-SP, Cascade Lake,
Alder Lake, Sapphire Rapids, Nehalem; ARM: Cortex-A53, A76, Neoverse N1, V1) and on the classes measured
on the demo detector (issue table: fp32 splits by vector width, static U8S8 on VNNI)."""

import random

from quantbench.analysis.classes import differing_features, fingerprint_features, separating_features, separation
from quantbench.analysis.tiers import canonical_flags, used_features

SSE = ["sse", "sse2", "sse3", "ssse3", "sse4_1", "sse4_2", "popcnt", "cx16"]
AVX2 = SSE + ["avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe"]
AVX512 = AVX2 + ["avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"]
X86 = {
    "x86-sse4": SSE,
    "x86-avx2": AVX2,
    "x86-avx512": AVX512,
    "x86-vnni": AVX512 + ["avx512_vnni"],
    "x86-avxvnni": AVX2 + ["avx_vnni", "gfni"],
    "x86-amx": AVX512 + ["avx512_vnni", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "avx512_bf16"],
}
ARM8 = ["fp", "asimd", "aes", "pmull", "sha1", "sha2", "crc32", "cpuid"]
ARM82 = ARM8 + ["atomics", "fphp", "asimdhp", "asimdrdm", "lrcpc", "dcpop", "asimddp"]
ARM = {
    "pi3": ARM8,
    "pi": ARM82,
    "graviton2": ARM82 + ["ssbs"],
    "graviton3": ARM82 + ["ssbs", "sve", "i8mm", "bf16", "svei8mm", "asimdfhm", "svebf16", "dit", "uscat",
                          "ilrcpc", "flagm", "rng", "sha3", "sm3", "sm4", "sha512", "jscvt", "fcma", "paca", "pacg"],
}


def feats(table: dict, arch: str) -> dict:
    return {h: fingerprint_features(arch, f"cpu of {h}", flags, "1.32.0", {}) for h, flags in table.items()}


def classes(*groups) -> dict:
    return {h: chr(65 + i) for i, g in enumerate(groups) for h in g}


def test_x86_fp32_split_by_vector_width_names_avx512_first():
    cls = classes(["x86-avx512", "x86-vnni", "x86-amx"], ["x86-avx2", "x86-avxvnni"], ["x86-sse4"])
    f = feats(X86, "x86_64")
    s = separation(f, cls)
    # every tier has its own CPU identity, and that one feature tells them apart (the smallest set) ...
    assert s["smallest"] == ["cpu"]
    # ... but the flags the dispatch reads come first; avx512_vnni/avx_vnni vary inside a class: not named
    assert s["features"] == ["isa:avx512f", "isa:avx512bw", "isa:avx2", "isa:fma", "isa:avx", "isa:avx512dq",
                             "isa:avx512vl", "cpu"]
    same_cpu = {h: dict(v, cpu="one model") for h, v in f.items()}
    assert separation(same_cpu, cls)["smallest"] == ["isa:avx512f", "isa:avx2"]
    # the others: f16c, bmi1, bmi2, movbe (avx2 tier and up), avx512cd (avx512 and up)
    assert s["others"] == 5 and s["kernels"] == []


def test_x86_static_u8s8_split_on_vnni_names_the_vnni_flags():
    cls = classes(["x86-avx2", "x86-avx512"], ["x86-vnni", "x86-avxvnni", "x86-amx"], ["x86-sse4"])
    f = {h: dict(v, cpu="one model") for h, v in feats(X86, "x86_64").items()}
    s = separation(f, cls)
    assert s["smallest"] == ["isa:avx512_vnni", "isa:avx_vnni", "isa:avx2"]
    assert s["features"] == ["isa:avx512_vnni", "isa:avx_vnni", "isa:avx2", "isa:fma", "isa:avx"]
    assert s["others"] == 4   # f16c, bmi1, bmi2, movbe


def test_arm_graviton3_split_names_i8mm_sve_bf16_not_an_arbitrary_flag():
    cls = classes(["pi3", "pi", "graviton2"], ["graviton3"])
    f = feats(ARM, "aarch64")
    # before: the alphabetically first separating flag (isa:asimdfhm) stood for the split
    assert separating_features(f, cls) == ["isa:i8mm"]
    s = separation(f, cls)
    assert s["features"] == ["isa:i8mm", "isa:sve", "isa:bf16", "isa:svei8mm"]
    assert s["others"] == 15   # asimdfhm, svebf16, dit, ... pacg: graviton3's flags outside the dispatch
    # asimddp is read by the dispatch but differs inside the NEON/dot class (pi3 lacks it): not named
    assert "isa:asimddp" not in s["features"]


def test_arm_dot_product_split_names_asimddp():
    cls = classes(["pi3"], ["pi", "graviton2"], ["graviton3"])
    s = separation(feats(ARM, "aarch64"), cls)
    assert s["smallest"] == ["cpu"]
    assert s["features"] == ["isa:asimddp", "isa:i8mm", "isa:sve", "isa:bf16", "isa:svei8mm", "cpu"]


def test_kernel_evidence_names_the_flag_the_kernels_used():
    cls = classes(["pi3", "pi", "graviton2"], ["graviton3"])
    f = feats(ARM, "aarch64")
    used = {"graviton3": used_features(["SMMLA", "UMMLA", "FMLA (vector)"], ARM["graviton3"]),
            "pi": used_features(["UDOT (by element)"], ARM["pi"])}
    assert used == {"graviton3": {"i8mm": ["SMMLA", "UMMLA"]}, "pi": {"asimddp": ["UDOT (by element)"]}}
    s = separation(f, cls, used)
    # i8mm separates these classes; the dot product pi used does not (pi3, without it, is in pi's class)
    assert s["kernels"] == [
        {"feature": "isa:i8mm", "families": ["SMMLA", "UMMLA"], "hosts": ["graviton3"], "separates": True},
        {"feature": "isa:asimddp", "families": ["UDOT (by element)"], "hosts": ["pi"], "separates": False}]


def test_evidence_decides_between_flags_that_separate_alike():
    f = feats({"a": AVX512, "b": AVX2}, "x86_64")
    cls = classes(["a"], ["b"])
    assert separation(f, cls)["smallest"] == ["isa:avx512f"]
    # VPMADDUBSW on a host with avx512bw: the AVX-512 core U8S8 kernel (MLAS selects it under avx512bw)
    s = separation(f, cls, {"a": used_features(["VPMADDUBSW"], AVX512)})
    assert s["smallest"] == ["isa:avx512bw"]
    assert s["kernels"] == [{"feature": "isa:avx512bw", "families": ["VPMADDUBSW"], "hosts": ["a"], "separates": True}]


def test_numpy_and_cpuinfo_names_are_one_feature():
    # fingerprints taken before the worker read CPUID itself report numpy's names (avx512vnni, fma3, sse41)
    numpy_style = ["avx2", "avx512f", "avx512bw", "avx512vnni", "fma3", "sse41"]
    assert canonical_flags(numpy_style) == ["avx2", "avx512_vnni", "avx512bw", "avx512f", "fma", "sse4_1"]
    f = {"old": fingerprint_features("x86_64", "c", numpy_style, "1.32.0", {}),
         "new": fingerprint_features("x86_64", "c", ["avx2", "avx512f", "avx512bw", "avx512_vnni", "fma", "sse4_1"],
                                     "1.32.0", {})}
    assert f["old"] == f["new"]


def test_across_architectures_no_isa_flag_is_named():
    f = {**feats({"x86": X86["x86-vnni"]}, "x86_64"), **feats({"pi": ARM["pi"]}, "aarch64")}
    s = separation(f, classes(["x86"], ["pi"]))
    assert s["smallest"] == ["arch"] and s["features"] == ["arch"]
    assert not [k for k in differing_features(f, classes(["x86"], ["pi"])) if k.startswith("isa:")]


def test_same_inputs_same_separation_in_any_host_order():
    f = feats(X86, "x86_64")
    cls = classes(["x86-avx2", "x86-avx512"], ["x86-vnni", "x86-avxvnni", "x86-amx"], ["x86-sse4"])
    want = separation(f, cls)
    hosts = list(cls)
    for seed in range(5):
        random.Random(seed).shuffle(hosts)
        shuffled = {h: dict(sorted(f[h].items(), key=lambda kv: random.Random(seed).random())) for h in hosts}
        assert separation(shuffled, {h: cls[h] for h in hosts}) == want
