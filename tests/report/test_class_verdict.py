"""The verdict says per variant whether the whole fleet computes one class of bytes (a device is then commissioned by
a hash check), or how many classes, which hosts, and the fingerprint features that separate them."""

from quantbench.analysis.classes import fingerprint_features, separation
from quantbench.report import verdict
from report_helpers import _cls, hand_result


def _split(v: dict, feats: dict) -> dict:
    class_of = {c["hosts"][0]: c["label"] for c in v["classes"]}
    s = separation(feats, class_of, None)
    return {**v, "separating_features": s.pop("smallest"), "separation": s}


def test_one_class_reads_as_the_whole_fleet_and_a_split_names_its_hosts_and_features():
    r = hand_result()
    feats = {"x86": fingerprint_features("x86_64", "AMD EPYC", ["sse4_2", "avx", "avx2", "fma"], "1.32.0", {}),
             "pi": fingerprint_features("aarch64", "0x41 0xd0b", ["fp", "asimd", "asimddp"], "1.32.0", {})}
    r.variants[0] = _split({**r.variants[0], "classes": [_cls("A", ["x86"], "d0"), _cls("B", ["pi"], "d9")]}, feats)
    fp32, dyn = verdict.verdict_lines(r)[:2]
    assert "; one class of bytes on the whole fleet; " in dyn
    assert "; 2 classes of bytes (A: x86 | B: pi), separated by arch" in fp32, fp32
    assert verdict.class_verdict(r.variants[0]).startswith("2 classes of bytes (A: x86 | B: pi), separated by arch")


def test_classes_no_feature_tells_apart_say_so_and_a_result_without_features_names_the_hosts_only():
    v = {"classes": [_cls("A", ["x86"], "d0"), _cls("B", ["x86b"], "d1")], "separating_features": None}
    assert verdict.class_verdict(v) == ("2 classes of bytes (A: x86 | B: x86b), no fingerprint feature tells them "
                                        "apart")
    v = {"classes": [_cls("A", ["x86"], "d0"), _cls("B", ["x86b"], "d1")], "separating_features": ["isa:avx2"],
         "separation": {"features": ["isa:avx2", "isa:fma", "isa:avx", "isa:f16c"], "others": 12}}
    assert verdict.class_verdict(v).endswith("separated by isa:avx2, isa:fma, isa:avx and 13 other feature(s)")
    del v["separating_features"]
    assert verdict.class_verdict(v) == "2 classes of bytes (A: x86 | B: x86b)"


def test_one_class_is_not_the_whole_fleet_when_a_host_could_not_run_the_variant():
    r = hand_result()
    r.cannot_run = {"pi": {"dynamic": "session requirement session.x64quantprecision=1 not applied"}}
    dyn = verdict.verdict_lines(r)[1]
    assert "one class of bytes on the hosts that ran it (pi could not)" in dyn and "whole fleet" not in dyn
    assert "; one class of bytes on the whole fleet; " in verdict.verdict_lines(r)[0]
