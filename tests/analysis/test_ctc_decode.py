"""`ctc`: greedy CTC of a text recogniser; the decision is the decoded string, a flip is a string that
changed, accuracy is exact match and character error rate against each image's "text" label."""

import contextlib
import json

import numpy as np
import pytest

from decode_helpers import SEQ, SIZE, input_matmul_head, ocr_model, steps
from quantbench.analysis.decisions import compare, summarize
from quantbench.analysis.decode import check_outputs, decode, spec_from_sidecar
from quantbench.inputs.sidecarfile import load_sidecar
from quantbench.cli import main
from quantbench.errors import UserError
from quantbench.analysis.metrics import edit_distance, text_accuracy





def ctc_spec(**decode_keys):
    block = {"kind": "ctc", "alphabet": ["a", "b"], "space": True, **decode_keys}
    return check_outputs(spec_from_sidecar({"decode": block}), ["output"])


def test_greedy_ctc_collapses_repeats_drops_blanks_and_maps_the_alphabet():
    d = decode(ctc_spec(), {"output": steps(SEQ)})
    assert d.text == ["ab a"]
    assert d.slot.tolist() == [0] and d.kept.tolist() == [True]
    p = np.exp(5.0) / (np.exp(5.0) + 3)          # softmax top-1 of every step
    assert d.score[0] == pytest.approx(p) and d.margin[0] == pytest.approx(p - 1 / (np.exp(5.0) + 3))
    # a blank between two equal characters keeps both
    assert decode(ctc_spec(), {"output": steps([1, 0, 1])}).text == ["aa"]


def test_the_layout_is_read_from_the_actual_output_shape():
    tnc = steps(SEQ)
    ntc = np.transpose(tnc, (1, 0, 2))                      # [1, T, C]
    assert decode(ctc_spec(), {"output": ntc}).text == ["ab a"]
    assert decode(ctc_spec(layout="NTC"), {"output": ntc}).text == ["ab a"]
    with pytest.raises(UserError, match="batch 6"):
        decode(ctc_spec(layout="NTC"), {"output": tnc})
    with pytest.raises(UserError, match="cannot tell time from batch"):
        decode(ctc_spec(), {"output": steps([1])})          # [1, 1, C]: say the layout
    assert decode(ctc_spec(layout="TNC"), {"output": steps([1])}).text == ["a"]


def test_blank_elsewhere_no_alphabet_and_bad_keys():
    # blank last (class 3): classes 0..2 are the alphabet's entries 0..2
    spec = check_outputs(spec_from_sidecar({"decode": {"kind": "ctc", "blank": 3, "alphabet": ["x", "y", "z"]}}),
                         ["o"])
    assert decode(spec, {"o": steps([0, 3, 2, 2])}).text == ["xz"]
    ids = check_outputs(spec_from_sidecar({"decode": {"kind": "ctc"}}), ["o"])
    assert decode(ids, {"o": steps([0, 2, 2, 0, 3])}).text == ["2 3"]
    with pytest.raises(UserError, match=r"4 classes per step.*2 characters \+ 1 blank"):
        decode(check_outputs(spec_from_sidecar({"decode": {"kind": "ctc", "alphabet": ["a", "b"]}}), ["o"]),
               {"o": steps(SEQ)})
    for block, what in (({"blank": -1}, "blank"), ({"space": "ab"}, "space"), ({"layout": "TCN"}, "layout"),
                        ({"alphabet": [""]}, "alphabet")):
        with pytest.raises(UserError, match=what):
            spec_from_sidecar({"decode": {"kind": "ctc", **block}})


def test_an_alphabet_file_beside_the_sidecar_is_inlined_with_its_hash(tmp_path):
    (tmp_path / "rec.json").write_text(json.dumps({"decode": {"kind": "ctc", "alphabet": "keys.txt", "space": True}}))
    (tmp_path / "keys.txt").write_bytes("a\r\nb\n".encode())
    side = load_sidecar(tmp_path / "rec.onnx")
    assert side["decode"]["alphabet"] == ["a", "b"]
    assert side["decode"]["alphabet_file"]["file"] == "keys.txt" and len(side["decode"]["alphabet_file"]["sha256"]) == 64
    assert decode(check_outputs(spec_from_sidecar(side), ["o"]), {"o": steps(SEQ)}).text == ["ab a"]
    (tmp_path / "rec.json").write_text(json.dumps({"decode": {"kind": "ctc", "alphabet": "../keys.txt"}}))
    with pytest.raises(UserError, match="in the sidecar's folder"):
        load_sidecar(tmp_path / "rec.onnx")
    (tmp_path / "rec.json").write_text(json.dumps({"decode": {"kind": "ctc", "alphabet": "missing.txt"}}))
    with pytest.raises(UserError, match="missing.txt: alphabet file not readable"):
        load_sidecar(tmp_path / "rec.onnx")
    (tmp_path / "keys.txt").write_text("a\n\nb\n")
    (tmp_path / "rec.json").write_text(json.dumps({"decode": {"kind": "ctc", "alphabet": "keys.txt"}}))
    with pytest.raises(UserError, match="line 2 is empty"):
        load_sidecar(tmp_path / "rec.onnx")


def test_a_changed_string_is_one_text_flip():
    spec = ctc_spec()
    ref = decode(spec, {"output": steps(SEQ)})
    same = decode(spec, {"output": steps([1, 0, 2, 2, 3, 1])})     # other frames, the same string
    other = decode(spec, {"output": steps([1, 0, 2, 2, 3, 2])})    # "ab b"
    assert compare(spec, ref, same).flips == []
    fc = compare(spec, ref, other)
    assert [(f.kind, f.ref_text, f.text) for f in fc.flips] == [("text", "ab a", "ab b")]
    s = summarize("own-fp32", "x86", "dynamic", "x86", "fp32", [fc, compare(spec, ref, same)], None, ("text",))
    assert s.flips == 1 and s.by_kind == {"text": 1} and s.images_disagree == 1


def test_exact_match_and_character_error_rate():
    assert edit_distance("kitten", "sitting") == 3 and edit_distance("", "ab") == 2
    got = text_accuracy({"f1": "ab a", "f2": "ab b", "f3": "x"}, {"f1": "ab a", "f2": "ab a", "f3": "xyz"})
    assert got["value"] == pytest.approx(1 / 3) and got["correct"] == 1 and got["images"] == 3
    assert got["cer"] == pytest.approx((0 + 1 + 2) / (4 + 4 + 3))






@pytest.fixture(scope="module")
def ocr_bench(tmp_path_factory):
    from calib_helpers import make_corpus

    d = tmp_path_factory.mktemp("ctc")
    labels, _ = make_corpus(d / "corpus", n_litter=6, n_negative=6, n_eval=2, size=SIZE)
    coco = json.loads(labels.read_text())
    evals = [im for im in coco["images"] if im["split"] == "eval"]
    evals[0]["text"], evals[1]["text"] = "ab a", "ab b"        # the second label is one character off
    labels.write_text(json.dumps(coco))
    (d / "models").mkdir()
    ocr_model(d / "models")
    with contextlib.chdir(d):
        assert main(["calibrate", "--model", "models/ocr.onnx", "--labels", str(labels), "--per-cell", "2",
                     "--methods", "dynamic", "--no-progress", "-q"]) == 0
    return d, labels


def test_equiv_decodes_a_text_recogniser_through_onnxruntime(ocr_bench, capsys):
    d, labels = ocr_bench
    with contextlib.chdir(d):
        capsys.readouterr()
        code = main(["equiv", "--hosts", "x86", "--fixtures", str(labels), "--no-progress", "--no-plots", "--json"])
        out = json.loads(capsys.readouterr().out)
        assert code == 0
        own = next(c for c in out["comparisons"] if c["comparison"] == "own-fp32")
        assert own["decisions_compared"] and own["fixtures"] == 2 and own["by_kind"] == {"text": 0}
        from quantbench.store import partread

        rows = partread.read("decisions").to_pylist()
        assert {r["class_name"] for r in rows} == {"ab a"} and len(rows) == 4   # 2 variants x 2 images
        report = (d / "results" / "report.md").read_text()
        assert "Text accuracy on 2 labelled images" in report
        assert "| fp32 | 0.500 (1/2), CER 0.125 |" in report
        assert "| dynamic | x86 | fp32 on x86 | own-fp32 | 2 -> 2 | 0 | 0 text |" in report
        # again: the result is reused from the cache, strings and all
        assert main(["equiv", "--hosts", "x86", "--fixtures", str(labels), "--no-progress", "--no-plots"]) == 0
        assert "| fp32 | 0.500 (1/2), CER 0.125 |" in (d / "results" / "report.md").read_text()
        # the recipe carries the alphabet: the variants folder needs no keys.txt
        recipe = json.loads(next((d / "results" / "variants").rglob("fp32.recipe.json")).read_text())
        assert recipe["sidecar"]["decode"]["alphabet"] == ["a", "b"]


def test_equiv_counts_a_changed_string_as_a_text_flip_in_the_tables(tmp_path, monkeypatch, capsys):
    from decode_helpers import make_variants, sidecar
    from quantbench.store import partread

    monkeypatch.chdir(tmp_path)
    side = sidecar(SIZE, [], {"kind": "ctc", "alphabet": ["a", "b"], "space": True})
    vdir, labels = make_variants(tmp_path, lambda p: input_matmul_head(p, steps(SEQ), SIZE), side,
                                 [{"text": "ab a"}, {"text": "ab b"}], SIZE)
    # the candidate says "ab b" on every image (a stand-in for an int8 file that reads the last letter wrong)
    input_matmul_head(vdir / "dynamic.onnx", steps([1, 1, 0, 2, 3, 2]), SIZE)
    assert main(["equiv", "--hosts", "x86", "--variants", str(vdir), "--fixtures", str(labels), "--no-progress",
                 "--json"]) == 0
    own = next(c for c in json.loads(capsys.readouterr().out)["comparisons"] if c["comparison"] == "own-fp32")
    assert own["flips"] == 2 and own["by_kind"] == {"text": 2} and own["images_disagree"] == 2
    flips = partread.read("flips").to_pylist()
    assert {(r["kind"], r["ref_class"], r["class_name"]) for r in flips} == {("text", "ab a", "ab b")}
    dyn = [r for r in partread.read("decisions").to_pylist() if r["variant"] == "dynamic"]
    assert {(r["class_name"], r["flip_own_fp32"]) for r in dyn} == {("ab b", "text")}
    report = (tmp_path / "results" / "report.md").read_text()
    assert "- **DO NOT SHIP** dynamic: 2 decision flips vs fp32" in report
    assert "| dynamic | 0.500 (1/2), CER 0.125 (+0.000) |" in report      # right on the other image
    # the gallery shows the two strings of each flipped image
    assert "#### dynamic on x86 vs fp32 on x86 (own-fp32): 2 flips on 2 images" in report
    from quantbench.report.gallery import flip_line

    assert flip_line(flips[0]).startswith("text: ab a 0.980 -> ab b 0.980 (greedy, fp32 margin 0.97")


def test_the_spec_names_the_alphabet_by_content():
    a, b = ctc_spec().as_dict(), ctc_spec(alphabet=["a", "c"]).as_dict()
    assert a["alphabet"]["characters"] == 3 and len(a["alphabet"]["sha256"]) == 64   # a, b and the space
    assert a["alphabet"]["sha256"] != b["alphabet"]["sha256"]
    assert a["blank"] == 0 and a["kind"] == "ctc"


def test_equal_totals_of_one_string_per_image_conceal_nothing():
    from quantbench.analysis.decode import kind_of

    spec = ctc_spec()
    ref = decode(spec, {"output": steps(SEQ)})
    fc = compare(spec, ref, decode(spec, {"output": steps([1, 0, 2, 2, 3, 2])}))
    assert fc.ref_total == fc.total == 1 and fc.flips     # equal totals by construction, a flip all the same
    fixed = spec.decoder_kind.totals_fixed(spec.threshold)
    assert fixed and kind_of("classifier-softmax").totals_fixed(None)
    assert not kind_of("classifier-softmax").totals_fixed(0.5) and not kind_of("yolo").totals_fixed(0.25)
    assert not summarize("own-fp32", "x86", "dynamic", "x86", "fp32", [fc], None, ("text",), totals_fixed=fixed).concealed
    assert summarize("own-fp32", "x86", "dynamic", "x86", "fp32", [fc], None, ("text",)).concealed   # a count check
