"""Equivalence classes, pairwise fixture agreement, smallest separating feature set."""

from quantbench.analysis.classes import (equivalence_classes, fingerprint_features, fixture_agreement,
                                         separating_features)


def hashes(*shas):
    return {(f"fx{i}", "y"): s for i, s in enumerate(shas)}


def test_classes_and_agreement():
    hh = {"x86": hashes("a", "b", "c"), "pi": hashes("a", "B", "c"), "pi4": hashes("a", "B", "c"),
          "avx2": hashes("z", "z", "z")}
    classes = equivalence_classes(hh)
    assert [(c.label, c.hosts) for c in classes] == [("A", ["x86"]), ("B", ["pi", "pi4"]), ("C", ["avx2"])]
    assert len({c.digest for c in classes}) == 3
    agree = fixture_agreement(hh)
    assert agree[("x86", "pi")] == 2 and agree[("pi", "pi4")] == 3 and agree[("x86", "avx2")] == 0


def test_single_class_needs_no_feature():
    assert separating_features({"a": {"arch": "x"}, "b": {"arch": "y"}}, {"a": "A", "b": "A"}) == []


def test_smallest_separating_set_prefers_one_isa_flag():
    f = {
        "x86": fingerprint_features("x86_64", "GenuineIntel 85", ["avx2", "avx512_vnni", "fma"], "1.32.0", {}),
        "avx2": fingerprint_features("x86_64", "qemu Haswell", ["avx2", "fma"], "1.32.0", {}),
        "pi": fingerprint_features("aarch64", "0x41 0xd0b", ["asimddp"], "1.32.0", {}),
        "pi4": fingerprint_features("aarch64", "0x41 0xd08", [], "1.32.0", {}),
    }
    # int8 static: only avx2 (vpmaddubsw) differs; x86/vnni, pi, pi4 agree
    cls = {"x86": "A", "pi": "A", "pi4": "A", "avx2": "B"}
    # no ISA flag tells avx2 apart from every other host (x86 also has avx2); the CPU identity does
    assert separating_features(f, cls) == ["cpu"]
    # dynamic: one class on x86, another on ARM -> the architecture (preferred over an ISA flag)
    cls2 = {"x86": "A", "avx2": "A", "pi": "B", "pi4": "B"}
    assert separating_features(f, cls2) == ["arch"]
    # only the dot-product core differs: an ISA flag beats the CPU identity
    cls3 = {"x86": "A", "avx2": "A", "pi": "B", "pi4": "A"}
    assert separating_features(f, cls3) == ["isa:asimddp"]


def test_session_option_separates_and_identical_fingerprints_do_not():
    f = {"x86": fingerprint_features("x86_64", "c", ["avx2"], "1.32.0", {"graph_optimization_level": 99}),
         "x86-noopt": fingerprint_features("x86_64", "c", ["avx2"], "1.32.0", {"graph_optimization_level": 0})}
    assert separating_features(f, {"x86": "A", "x86-noopt": "B"}) == ["session.graph_optimization_level"]
    same = {"a": f["x86"], "b": dict(f["x86"])}
    assert separating_features(same, {"a": "A", "b": "B"}) is None


def test_needs_two_features():
    f = {"h1": {"p": 0, "q": 0}, "h2": {"p": 1, "q": 0}, "h3": {"p": 0, "q": 1}, "h4": {"p": 1, "q": 1}}
    # classes by XOR-like pattern: h1 alone, h2+h3 together? separate h1|h4 from h2|h3 needs both
    cls = {"h1": "A", "h2": "B", "h3": "B", "h4": "A"}
    assert separating_features(f, cls) == ["p", "q"]


def test_fingerprint_noise_is_ignored():
    feats = fingerprint_features("x86_64", "c", [], "1.32.0", {"intra_op_num_threads": 1},
                                 {"hostname": "box1", "numpy_version": "2.4.0", "os": {"release": "6.1"}})
    assert "fp.hostname" not in feats and feats["fp.numpy_version"] == "2.4.0"
    assert feats["session.intra_op_num_threads"] == 1 and feats["fp.os.release"] == "6.1"
