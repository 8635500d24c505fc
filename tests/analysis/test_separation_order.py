""""separated by" names the architecture and ISA first, then the runtime and session, and never a CPU name that
is only a masked CPUID's: x86 vs an emulated Pi 5 reads `arch`, a masked tier reads its ISA flags."""

from quantbench.analysis.classes import fingerprint_features, separation, without_mask_cpu
from quantbench.report.termsummary import separation_text

X86_FLAGS = ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni"]
PI_FLAGS = ["fp", "asimd", "asimddp", "atomics"]


def _text(features, class_of):
    sep = separation(features, class_of)
    v = {"separating_features": sep["smallest"], "separation": sep, "classes": [], "feature_values": {}}
    return sep, separation_text(v, "no feature")


def test_x86_against_the_pi_is_separated_by_the_architecture_not_the_thread_count():
    features = {
        "x86": fingerprint_features("x86_64", "AMD EPYC 7B13", X86_FLAGS, "1.32.0", {"intra_op_num_threads": 1},
                                    {"python": "3.11.7", "numpy": "2.4.6"}),
        "pi": fingerprint_features("aarch64", "Cortex-A76", PI_FLAGS, "1.32.0", {"intra_op_num_threads": 4},
                                   {"python": "3.11.2", "numpy": "2.4.6"}),
    }
    sep, text = _text(features, {"x86": "A", "pi": "B"})
    assert sep["smallest"] == ["arch"]
    assert text.startswith("arch") and not text.startswith("session")


def test_a_masked_tier_is_separated_by_its_isa_flags_never_by_the_masks_vendor_string():
    features = {
        "x86": fingerprint_features("x86_64", "AuthenticAMD AMD EPYC 7B13", X86_FLAGS, "1.32.0", {}),
        "x86-avx2": fingerprint_features("x86_64", "GenuineIntel Intel Core i7-4770 (Haswell)",
                                         ["sse4_2", "avx", "avx2", "fma"], "1.32.0", {}),
    }
    mech = {"x86": "real", "x86-avx2": "native-masked"}
    features = without_mask_cpu(features, mech)
    sep, text = _text(features, {"x86": "A", "x86-avx2": "B"})
    assert "cpu" not in sep["smallest"] and "cpu" not in sep["features"]
    assert sep["smallest"][0].startswith("isa:avx512")
    assert text.startswith("isa:") and "GenuineIntel" not in text and "AuthenticAMD" not in text
    # without a masked host the CPU name stays a feature (two real machines differ in it)
    real = {"a": {"cpu": "x"}, "b": {"cpu": "y"}}
    assert without_mask_cpu(real, {"a": "real", "b": "qemu"}) == real


def test_a_float_variant_is_never_separated_by_a_flag_only_int8_kernels_read():
    """graviton3's fp32 class was "separated by isa:i8mm": the float kernels read SVE, never I8MM (nor ASIMDDP)."""
    base = ["fp", "asimd", "atomics", "asimddp"]
    features = {"pi": fingerprint_features("aarch64", "Neoverse", base, "1.32.0", {}),
                "graviton2": fingerprint_features("aarch64", "Neoverse", base, "1.32.0", {}),
                "graviton3": fingerprint_features("aarch64", "Neoverse", base + ["i8mm", "sve", "bf16"], "1.32.0", {})}
    cls = {"pi": "A", "graviton2": "A", "graviton3": "B"}
    assert separation(features, cls)["smallest"] == ["isa:i8mm"]          # an int8 variant: its kernels read i8mm
    fp32 = separation(features, cls, float_only=True)
    assert fp32["smallest"] == ["isa:sve"] and fp32["features"][-1] == "isa:i8mm"
    # only an int8-only flag tells them apart: named, as the last resort, rather than nothing
    only = {h: fingerprint_features("aarch64", "Neoverse", base + (["i8mm"] if h == "graviton3" else []), "1.32.0", {})
            for h in cls}
    assert separation(only, cls, float_only=True)["smallest"] == ["isa:i8mm"]
