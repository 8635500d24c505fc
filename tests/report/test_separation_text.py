"""The report's "separated by": the dispatch-read ISA flags first, "and N others differ", the flags the kernels
used (qemu evidence), in the Markdown table and the text summary alike (report.separation_text)."""

from quantbench.analysis.classes import fingerprint_features, separation
from quantbench.analysis.tiers import used_features
from quantbench.report.equivsection import classes_lines
from quantbench.report.termsummary import equiv_summary_text, separation_text
from report_helpers import hand_result

NEON = ["fp", "asimd", "asimddp"]
V1 = NEON + ["sve", "i8mm", "bf16", "svei8mm", "asimdfhm", "dit"]


def _split_variant(used=None) -> dict:
    feats = {"pi": fingerprint_features("aarch64", "0x41 0xd0b", NEON, "1.32.0", {}),
             "graviton3": fingerprint_features("aarch64", "0x41 0xd40", V1, "1.32.0", {})}
    class_of = {"pi": "A", "graviton3": "B"}
    s = separation(feats, class_of, used)
    smallest = s.pop("smallest")
    return {"separating_features": smallest, "separation": s,
            "classes": [{"label": "A", "hosts": ["pi"], "digest": "d1"},
                        {"label": "B", "hosts": ["graviton3"], "digest": "d2"}],
            "feature_values": {h: {k: feats[h].get(k, False) for k in s["features"]} for h in feats}}


def test_dispatch_flags_first_then_the_count_of_others():
    v = _split_variant()
    # cpu differs too (one host per class): one of the others, with asimdfhm and dit
    assert separation_text(v, "none") == "isa:i8mm, isa:sve, isa:bf16, isa:svei8mm and 3 others differ"
    assert separation_text(v, "none", values=True).startswith("isa:i8mm (False / True), isa:sve, isa:bf16")


def test_kernels_used_are_named_and_told_apart_from_flags_that_do_not_separate():
    used = {"graviton3": used_features(["SVE", "UDOT (by element)", "FMLA (vector)"], V1)}
    text = separation_text(_split_variant(used), "none")
    assert text.endswith("; kernels used (qemu evidence): isa:sve (SVE on graviton3); isa:asimddp (UDOT (by "
                         "element) on graviton3: not what tells the classes apart)")
    # the kernels' flag is the smallest set when it separates alone
    assert _split_variant(used)["separating_features"] == ["isa:sve"]


def test_one_class_and_unseparable_classes_keep_their_words():
    assert separation_text({"separating_features": []}, "none") == "-"
    assert separation_text({"separating_features": None}, "not by fingerprint") == "not by fingerprint"
    # a summary made before separation was recorded: the smallest set alone
    assert separation_text({"separating_features": ["arch"]}, "none") == "arch"


def test_markdown_and_text_summary_show_the_same_separation():
    r = hand_result()
    r.variants[1] = {**r.variants[1], **_split_variant()}
    md = "\n".join(classes_lines(r))
    assert "isa:i8mm, isa:sve, isa:bf16, isa:svei8mm and 3 others differ" in md
    assert "isa:i8mm (False / True), isa:sve, isa:bf16, isa:svei8mm and 3 others differ" in equiv_summary_text(r)
    assert "\n".join(classes_lines(r)) == md   # same result, same bytes
