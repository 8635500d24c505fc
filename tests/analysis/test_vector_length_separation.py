""""separated by" names the SVE and SME vector lengths when they tell ARM classes apart: qemu's max with other
lengths has the very same ISA flags, and the bytes follow the lengths (docs/hosts.md, ARM generations)."""

from quantbench.analysis.classes import fingerprint_features, separation
from quantbench.report.termsummary import separation_text

MAX_FLAGS = ["asimd", "asimddp", "sve", "sve2", "i8mm", "bf16", "sme"]
N2_FLAGS = ["asimd", "asimddp", "sve", "sve2", "i8mm", "bf16"]


def _arm(flags, sve, sme, cpu):
    return fingerprint_features("aarch64", cpu, flags, "1.32.0", {"intra_op_num_threads": 1}, {"python": "3.11.2"},
                                {"sve_vector_bits": sve, "sme_vector_bits": sme})


def _text(features, class_of):
    sep = separation(features, class_of)
    v = {"separating_features": sep["smallest"], "separation": sep, "classes": [{"hosts": [h]} for h in class_of],
         "feature_values": features}
    return sep, separation_text(v, "no feature", values=True)


def test_same_flags_other_lengths_are_separated_by_the_lengths():
    features = {"phone-sme2": _arm(MAX_FLAGS, 128, 512, "max"), "docker-arm64": _arm(MAX_FLAGS, 512, 256, "max")}
    sep, text = _text(features, {"phone-sme2": "A", "docker-arm64": "B"})
    assert sep["smallest"] == ["sve_vector_bits"]
    assert sep["features"] == ["sve_vector_bits", "sme_vector_bits"]
    assert text.startswith("sve_vector_bits (128 / 512), sme_vector_bits")


def test_the_lengths_are_named_beside_the_isa_flags_that_also_differ():
    features = {"graviton4": _arm(N2_FLAGS, 128, 0, "neoverse-n2"), "phone-sme2": _arm(MAX_FLAGS, 128, 512, "max"),
                "pi": _arm(["asimd", "asimddp"], 0, 0, "cortex-a76")}
    sep, _ = _text(features, {"graviton4": "A", "phone-sme2": "B", "pi": "C"})
    assert "sme_vector_bits" in sep["features"] and "sve_vector_bits" in sep["features"]
    # one class: nothing separates, the lengths included
    assert separation(features, {h: "A" for h in features})["features"] == []


def test_fingerprints_without_lengths_give_no_length_feature():
    """x86 fingerprints (and ARM ones taken before the lengths were read) carry none: no feature, no guess."""
    f = fingerprint_features("x86_64", "AMD EPYC", ["avx2"], "1.32.0", {}, {})
    assert "sve_vector_bits" not in f and "sme_vector_bits" not in f
