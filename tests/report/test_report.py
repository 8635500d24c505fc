"""The report: verdict lines first, accuracy per variant x host, flip gallery, margins, report.html.

Unit tests build EquivResult-shaped data by hand; the end-to-end tests reuse the fast local
two-session bench of tests/equiv_helpers.py (x86 and x86b differ by one session option) with
labels, and the browser test opens results/report.html in a real headless Chromium.
"""

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from quantbench.report import charts, equivsection, htmlpage, verdict
from quantbench.analysis.accuracy import Plan, plan, score
from quantbench.analysis.decode import DecodeSpec
from quantbench.cli import main
from quantbench.errors import render_params
from report_helpers import _dec, _flip, _truth, hand_result


def test_verdict_lines_one_per_variant_with_classes_flips_and_gate():
    lines = verdict.verdict_lines(hand_result(duplicates=[{"name": "static-minmax-copy", "model": "m", "path": "x.onnx",
                                                     "duplicate_of": "dynamic"}]))
    assert len(lines) == 4
    fp32, dyn, ent, dup = lines
    assert fp32.startswith("- **SHIP** fp32: 0 decision flips vs fp32 (fp32 on x86) on pi, 10 images compared, "
                           "none disagrees")
    assert "one class of bytes" in fp32 and "pass" in fp32
    assert dyn.startswith("- **DO NOT SHIP** dynamic: 3 decision flips vs fp32 (fp32 on x86) on x86, pi, "
                          "2 of 10 images disagree")
    assert "gate decision (budget 0): FAIL (decision: 3 of 4 comparisons over 0 flips)" in dyn
    # duplicates are named, not dropped: byte-identical outputs and an identical model
    assert "Outputs byte-identical to **dynamic** on every host and fixture" in ent
    assert "**static-minmax-copy**: duplicate of **dynamic**" in dup and "identical semantic hash" in dup


def test_verdict_without_decisions_says_so_and_gates_the_tensors_only_at_a_tolerance_the_user_set():
    lines = verdict.verdict_lines(hand_result(decode_none=True))
    assert all("decisions not compared (decode none)" in ln for ln in lines)
    # the default 1e-5 would fail every float model across architectures: no verdict, what can be said instead
    assert all(ln.startswith("- **NO VERDICT** ") for ln in lines), lines
    assert "no gate: no decoder and no tolerance set" in lines[1] and "largest |delta| vs fp32" in lines[1]
    assert "DO NOT SHIP" not in " ".join(lines)
    set_tol = hand_result(decode_none=True)
    set_tol.settings["atol"] = 1e-3
    lines = verdict.verdict_lines(set_tol)
    assert "gate tensor: FAIL (tensor: 3 of 4 comparisons" in lines[1] and lines[1].startswith("- **DO NOT SHIP**")
    named = hand_result(decode_none=True)
    named.settings["gates"] = ["tensor"]
    assert verdict.verdict_lines(named)[1].startswith("- **DO NOT SHIP**")
    md, _ = equivsection.render_equiv(hand_result(decode_none=True), "unused", plots=False, tables_root="unused")
    assert "Decisions not compared (decode none): no gallery." in md
    assert "Decisions not compared (decode none): no margins." in md
    assert "No flips" not in md and "0 decision flips" not in md


def test_no_flips_says_what_was_compared(tmp_path):
    r = hand_result()
    r.flip_rows = []
    for c in r.comparisons:
        c.update(flips=0, images_disagree=0, decision_passed=True)
    md, written = equivsection.render_equiv(r, tmp_path, plots=True, tables_root=tmp_path)
    assert "No flips: 9 comparisons over 10 images each, every decision the same." in md
    assert "No comparison has flips: nothing to show." in md
    assert "0 decision flips vs fp32 (fp32 on x86) on x86, pi, 10 images compared, none disagrees" in md
    assert not any("margins" in p.name for p in written)   # no empty axes


def test_margins_count_each_flip_once_per_comparison_kind():
    r = hand_result()
    flips = charts.distinct_flips(r)
    # own-fp32 on x86 and on pi, and ref-fp32 on pi, show the same 3 flips of dynamic: 3 per kind, not 9
    assert len(flips[("m", "dynamic", "own-fp32")]) == 3
    assert sorted(flips[("m", "dynamic", "own-fp32")][0][1]) == ["pi", "x86"]
    assert len(flips[("m", "dynamic", "ref-fp32")]) == 3
    md = "\n".join(equivsection.margins_lines(r, Path("unused"), False, []))
    assert "| dynamic | vs fp32, same host | x86, pi | 3 | fp32 top-1 minus top-2 probability | 2 | 1 |" in md
    header = next(ln for ln in md.splitlines() if ln.startswith("| variant | comparison"))
    assert all(h.strip() for h in header.strip("|").split(" | "))   # no column without a header
    assert charts.margin_axis({"kind": "detr-sigmoid", "threshold": 0.4}) == "fp32 score minus threshold"


# --------------------------------------------------------------------------- accuracy


def test_classifier_top1_from_the_single_label_of_each_image():
    spec = DecodeSpec(kind="classifier-softmax", outputs={}, classes=["cat", "dog"])
    truth = _truth({"f1": [{"image_id": 1, "category_id": 7}], "f2": [{"image_id": 2, "category_id": 8}],
                    "f3": [{"image_id": 3, "category_id": 8}]}, categories={7: "cat", 8: "dog"})
    p = plan(spec, {}, truth, ["f1", "f2", "f3"])
    assert isinstance(p, Plan) and p.labels == {"f1": 0, "f2": 1, "f3": 1}
    sc = score(p, {"f1": _dec([0]), "f2": _dec([1]), "f3": _dec([0])}, truth)
    assert sc["value"] == pytest.approx(2 / 3) and sc["correct"] == 2
    # the demo classifier's rule: label_mode binary
    p = plan(spec, {"label_mode": "binary"}, _truth({"f1": [], "f2": [{"bbox": [0, 0, 1, 1]}]}), ["f1", "f2"])
    assert p.labels == {"f1": 0, "f2": 1}
    # no labels / boxes are no classifier labels: a reason, never a guess
    assert "no labels" in plan(spec, {}, _truth({"f1": [], "f2": []}), ["f1", "f2"])
    assert "not one class per image" in plan(spec, {}, _truth({"f1": [{"bbox": [0, 0, 1, 1], "category_id": 7}]},
                                                                categories={7: "cat"}), ["f1"])


def test_detector_ap_with_the_coco_evaluator_and_boxes_mapped_to_image_pixels():
    spec = DecodeSpec(kind="detr-sigmoid", outputs={}, threshold=0.5, classes=["cat", "dog"])
    # image 200 x 100 (w x h) stretched into a 100 x 50 input; ground truth in image pixels
    anns = {"f1": [{"image_id": 1, "category_id": 7, "bbox": [20, 10, 40, 20]}],
            "f2": [{"image_id": 2, "category_id": 8, "bbox": [100, 50, 50, 25]}]}
    truth = _truth(anns, categories={7: "cat", 8: "dog"})
    p = plan(spec, {}, truth, ["f1", "f2"])
    assert isinstance(p, Plan) and p.category_of == {0: 7, 1: 8}
    # DETR boxes are normalised xyxy of the input: the exact boxes score AP 1
    exact = {"f1": _dec([0], box=[[0.1, 0.1, 0.3, 0.3]]), "f2": _dec([1], box=[[0.5, 0.5, 0.75, 0.75]])}
    sc = score(p, exact, truth)
    assert sc["value"] == pytest.approx(1.0) and sc["ap50_95"] == pytest.approx(1.0)
    # the dog box shifted by a quarter of its width: IoU 0.6, a match at 0.50-0.60 only
    shifted = dict(exact, f2=_dec([1], box=[[0.5625, 0.5, 0.8125, 0.75]]))
    sc = score(p, shifted, truth)
    assert sc["value"] == pytest.approx(1.0)
    # cat: AP 1 at every IoU; dog: AP 1 at 0.50, 0.55, 0.60, else 0 -> (10 + 3) / 20
    assert sc["ap50_95"] == pytest.approx((1.0 + 0.3) / 2)
    # letterbox: the same boxes land elsewhere in the image; wrong class: AP 0 for the missed class
    wrong = dict(exact, f2=_dec([0], box=[[0.5, 0.5, 0.75, 0.75]]))
    assert score(p, wrong, truth)["value"] == pytest.approx(0.5)
    # without the labels file (no category names, no sizes): a reason
    why = plan(spec, {}, _truth(anns, categories=None), ["f1", "f2"])
    assert isinstance(why, str) and "pass --fixtures" in why
    assert "no ground-truth boxes" in plan(spec, {}, _truth({"f1": []}, categories={7: "cat"}), ["f1"])
    assert "box_frame" in plan(DecodeSpec(kind="nms-boxes", outputs={}, threshold=0.5, classes=["cat"]), {}, truth,
                               ["f1"])


def test_accuracy_scored_once_per_content_and_found_again_under_the_results_folder(tmp_path, monkeypatch):
    from quantbench.analysis import accuracy as A

    truth = _truth({"f1": [{"image_id": 1, "category_id": 7}], "f2": [{"image_id": 2, "category_id": 8}]},
                   categories={7: "cat", 8: "dog"})
    result = hand_result()
    result.variants = result.variants[:2]
    for v in result.variants:
        v["decode"]["classes"] = ["cat", "dog"]
    same = {"f1": _dec([0]), "f2": _dec([0])}   # x86 and pi decide alike: one score serves both
    result.decoded = {(h, vid, f): d for h in ("x86", "pi") for vid in ("v0", "v1") for f, d in same.items()}
    result.decoded[("pi", "v1", "f2")] = _dec([1])
    scored = []
    monkeypatch.setattr(A, "score", lambda p, dec, t: scored.append(1) or score(p, dec, t))
    path = tmp_path / A.CACHE_FILE

    def table():
        cache = A.ScoreCache(path)
        out = A.accuracy_table(result, {}, truth, cache)
        cache.save()
        return cache.computed, {k: v["value"] for k, v in out["m"]["scores"].items()}

    computed, first = table()
    assert computed == len(scored) == 2   # {fp32, dynamic on x86} decide alike, dynamic on pi differs
    assert first == {("fp32", "x86"): 0.5, ("fp32", "pi"): 0.5, ("dynamic", "x86"): 0.5, ("dynamic", "pi"): 1.0}
    assert table() == (0, first) and len(scored) == 2   # the rerun scores nothing
    # a changed decision is another content: scored again, the rest found
    result.decoded[("pi", "v1", "f1")] = _dec([1])
    computed, changed = table()
    assert computed == 1 and changed == {**first, ("dynamic", "pi"): 0.5}
    assert set(json.loads(path.read_text())["scores"]) == {A.score_key(A.plan_key(plan(
        DecodeSpec(kind="classifier-softmax", outputs={}, classes=["cat", "dog"]), {}, truth, ["f1", "f2"]), truth),
        {f: result.decoded[(h, "v1", f)] for f in ("f1", "f2")}) for h in ("x86", "pi")}   # only what is used
    path.write_text("not json")   # a damaged cache is recomputed, never trusted
    assert table() == (2, changed)
    data = json.loads(path.read_text())
    k = sorted(data["scores"])[0]
    data["scores"][k]["score"]["value"] = "high"   # an entry of the wrong shape: recomputed, not shown
    path.write_text(json.dumps(data))
    assert table() == (1, changed)


def test_boxes_to_image_inverts_letterbox_and_center_crop():
    from quantbench.inputs.preprocess import boxes_to_image

    # 200 x 100 image letterboxed into 64 x 64: scale 0.32, 64 x 32 placed at top 16
    lb = {"shape": [1, 3, 64, 64], "layout": "NCHW", "resize": "letterbox"}
    assert boxes_to_image([[0, 16, 64, 48]], lb, (100, 200)).tolist() == [[0, 0, 200, 100]]
    assert boxes_to_image([[16, 24, 32, 32]], lb, (100, 200)) == pytest.approx(np.array([[50, 25, 100, 50]]))
    # 100 x 200 (h x w) center-cropped to 100 x 100: the crop starts at x = 50
    cc = {"shape": [1, 3, 100, 100], "layout": "NCHW", "resize": "center-crop"}
    assert boxes_to_image([[0, 0, 100, 100]], cc, (100, 200)).tolist() == [[50, 0, 150, 100]]
    with pytest.raises(ValueError):
        boxes_to_image([[0, 0, 1, 1]], {**cc, "plugin": "m:f"}, (100, 200))


# --------------------------------------------------------------------------- gallery


def test_gallery_thumbnails_are_the_same_bytes_for_the_same_inputs():
    from quantbench.report import gallery as GL

    rgb = (np.arange(32 * 48 * 3) % 251).astype(np.uint8).reshape(32, 48, 3)
    ref = _dec([0, 1], box=[[0.1, 0.1, 0.5, 0.5], [0.6, 0.6, 0.9, 0.9]])
    cand = _dec([0, 1], score=[0.9, 0.4], box=[[0.1, 0.1, 0.5, 0.5], [0.6, 0.6, 0.9, 0.9]])
    flips = [_flip("own-fp32", "x86", "dynamic", "v1", "f1", 0.02)]
    a = GL.draw(rgb, ref, cand, flips, "normalized", "legend")
    b = GL.draw(rgb.copy(), ref, cand, list(flips), "normalized", "legend")
    import io

    def png(img):
        buf = io.BytesIO()
        img.save(buf, format="PNG", optimize=False, compress_level=6)
        return buf.getvalue()

    assert png(a) == png(b)
    assert a.size[1] > 5 * 32 and 5 * 48 <= a.size[0]   # enlarged by a whole factor, with a caption below
    assert png(GL.draw(rgb, ref, cand, flips, None, "legend")) != png(a)   # boxes drawn only with a frame
    # the input tensor back to pixels: the inverse of the recipe's normalisation
    spec = {"layout": "NCHW", "scale": 1 / 255, "mean": [0.5] * 3, "std": [0.25] * 3, "color": "BGR"}
    x = ((rgb[..., ::-1].astype(np.float32) / 255 - 0.5) / 0.25).transpose(2, 0, 1)[None]
    assert np.array_equal(GL.tensor_rgb(x, spec), rgb)


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def labelled_bench(tmp_path_factory):
    """The two-session bench of cli/test_equiv_cli.py with one label per image, then `equiv --hosts x86,x86b`."""

    from bench_helpers import make_bench

    d = tmp_path_factory.mktemp("report")
    with contextlib.chdir(d):  # module fixtures cannot use monkeypatch
        vdir, labels = make_bench(d / "bench")
        coco = json.loads(labels.read_text())
        coco["categories"] = [{"id": i + 1, "name": n} for i, n in enumerate(["bottle", "can", "bag", "cup", "lid"])]
        coco["annotations"] = [{"id": i + 1, "image_id": im["id"], "category_id": 1 + i % 2}
                               for i, im in enumerate(coco["images"])]
        labels.write_text(json.dumps(coco))
        (d / "quantbench.toml").write_text('x86b = { kind = "local" }\n')
        common = ["--variants", str(vdir), "--fixtures", str(labels), "--no-progress"]
        assert main(["run", "--hosts", "x86", *common]) == 0
        assert main(["run", "--hosts", "x86b", "--graph-opt", "disabled", *common]) == 0
        assert main(["equiv", "--no-run", "--hosts", "x86,x86b", *common]) == 0
    return d


def test_equiv_report_opens_with_the_verdict_and_shows_accuracy_and_gallery(labelled_bench):
    res = labelled_bench / "results"
    text = (res / "report.md").read_text()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert lines[:3] == ["# quantbench report", "## Equivalence and decisions (`quantbench equiv`)", "### Verdict"]
    assert lines[3].startswith("- **SHIP** fp32: ") and "2 classes of bytes (A: x86 | B: x86b)" in lines[3]
    assert lines[4].startswith("- **DO NOT SHIP** dynamic: 8 decision flips vs fp32 (fp32 on x86) on x86, x86b, "
                               "8 of 8 images disagree")
    assert "gate decision (budget 0): FAIL" in lines[4]
    # accuracy per variant x host, from the same decisions
    assert "Top-1 accuracy on 8 labelled images" in text
    assert "| fp32 | 0.500 (4/8) | 0.500 (4/8) |" in text
    # a gallery for every comparison with flips, thumbnails linked and present
    for title in ("dynamic on x86 vs fp32 on x86 (own-fp32)", "dynamic on x86b vs fp32 on x86b (own-fp32)",
                  "dynamic on x86b vs fp32 on x86 (ref-fp32)"):
        assert f"#### {title}: 8 flips on 8 images" in text
    links = [ln[ln.rindex("](") + 2:-1] for ln in text.splitlines() if ln.startswith("![") and "gallery/" in ln]
    assert len(links) == 24 and all((res / p).is_file() for p in links)
    # the terminal summary opens with the same verdict
    # re-rendering from the tables gives the same bytes (report.md, report.html and the thumbnails)
    before = {p: p.read_bytes() for p in [res / "report.md", res / "report.html", *(res / p for p in links)]}
    cwd = Path.cwd()
    import os

    os.chdir(labelled_bench)
    try:
        assert main(["report"]) == 0
    finally:
        os.chdir(cwd)
    assert {p: p.read_bytes() for p in before} == before


def test_equiv_rerun_scores_no_accuracy_and_draws_no_thumbnail(labelled_bench, monkeypatch):
    from quantbench.report import gallery as GL
    from quantbench.analysis import accuracy as A

    res = labelled_bench / "results"
    files = sorted(p for p in res.rglob("*") if p.is_file() and ".cache" not in p.parts and not p.name.endswith(".key"))
    before = {p: p.read_bytes() for p in files}
    drawn, scored = [], []
    real_draw, real_score = GL.draw, A.score
    monkeypatch.setattr(GL, "draw", lambda *a: drawn.append(a[-1]) or real_draw(*a))
    monkeypatch.setattr(A, "score", lambda *a: scored.append(1) or real_score(*a))
    monkeypatch.setattr(htmlpage, "render_html", lambda text: pytest.fail("report.html rendered again from the same text"))
    monkeypatch.chdir(labelled_bench)
    args = ["equiv", "--no-run", "--hosts", "x86,x86b", "--variants", str(labelled_bench / "bench" / "variants"),
            "--fixtures", str(labelled_bench / "bench" / "labels.json"), "--no-progress"]
    assert main(args) == 0
    assert (drawn, scored) == ([], [])
    assert {p: p.read_bytes() for p in files} == before   # the same bytes as drawn and scored
    # a thumbnail whose inputs changed (its key no longer matches) is drawn again, alone
    thumb = sorted((res / GL.GALLERY).glob("*.png"))[0]
    GL.key_path(thumb).write_text("0" * 64 + "\n")
    assert main(args) == 0
    assert len(drawn) == 1 and scored == [] and thumb.read_bytes() == before[thumb]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_report_html_renders_in_a_headless_browser_with_every_image_loaded(labelled_bench, tmp_path):
    browser = _chromium()
    if browser is None:
        from setup_required import missing_setup

        missing_setup("chromium (scripts/setup.sh --for-tests installs it)")
    res = labelled_bench / "results"
    html = res / "report.html"
    text = html.read_text()
    assert text.count("<img") >= 25 and "<th></th>" not in text

    def dom(page: Path) -> str:
        proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                               "--disable-component-update", "--disable-sync", "--no-first-run",
                               f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--dump-dom",
                               page.resolve().as_uri()], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout

    out = dom(html)
    body = out[out.index("<body"):out.index(">", out.index("<body"))]
    assert 'data-checked="yes"' in body, body
    n = int(body.split('data-images="')[1].split('"')[0])
    assert n == text.count("<img") and f'data-images-loaded="{n}"' in body, body
    assert 'data-images-broken=""' in body and 'data-errors=""' in body, body
    # the check is real: a copy with one missing image reports it
    broken = res / "report-broken.html"
    broken.write_text(text.replace("plots/equiv-classes.png", "plots/missing.png"))
    out = dom(broken)
    assert "plots/missing.png" in out[out.index("<body"):out.index(">", out.index("<body"))]
    broken.unlink()


def _fresh_report(bench: Path, dest: Path, monkeypatch) -> dict:
    """`equiv --no-run` into a copy of the bench's results without any report file: {relative path: bytes}."""
    shutil.copytree(bench / "results" / "tables", dest / "tables")
    monkeypatch.chdir(bench)
    assert main(["equiv", "--no-run", "--hosts", "x86,x86b", "--variants", str(bench / "bench" / "variants"),
                 "--fixtures", str(bench / "bench" / "labels.json"), "--results", str(dest), "--no-progress"]) == 0
    return {str(p.relative_to(dest)): p.read_bytes() for p in sorted(dest.rglob("*"))
            if p.is_file() and "tables" not in p.relative_to(dest).parts}


def test_thumbnails_and_plots_drawn_by_a_forked_child_are_the_bytes_drawn_here(labelled_bench, tmp_path, monkeypatch):
    from quantbench.report import gallery as GL

    forked = _fresh_report(labelled_bench, tmp_path / "forked", monkeypatch)
    assert len([p for p in forked if p.startswith(GL.GALLERY) and p.endswith(".png")]) == 24
    assert any(p.startswith("plots/") for p in forked) == charts.have_matplotlib()
    # a child that dies on its first drawing: the parent draws what it took, and every other job
    parent, real_draw, real_savefig = os.getpid(), GL.draw, charts._savefig

    def only_here(real):
        def f(*a, **k):
            if os.getpid() != parent:
                raise RuntimeError("the child fails")
            return real(*a, **k)
        return f

    monkeypatch.setattr(GL, "draw", only_here(real_draw))
    monkeypatch.setattr(charts, "_savefig", only_here(real_savefig))
    assert _fresh_report(labelled_bench, tmp_path / "child-fails", monkeypatch) == forked
    monkeypatch.undo()
    monkeypatch.delattr(os, "fork")   # no child at all: everything drawn in this process
    assert _fresh_report(labelled_bench, tmp_path / "no-fork", monkeypatch) == forked


def test_a_flipped_image_without_its_input_tensor_is_named_not_drawn(labelled_bench, tmp_path, monkeypatch):
    """The gallery names a flipped image whose input tensor the fixtures table does not hold (as for rows
    written without tensors) instead of drawing it; the others are drawn as always."""
    from quantbench.report import gallery as GL

    real = GL.fixture_pixels
    gone = []

    def without_one(ids, root):
        px = real(ids, root)
        if px and not gone:
            gone.append(min(px))   # the first image read loses its tensor, in every later read too
        for f in gone:
            px.pop(f, None)
        return px

    monkeypatch.setattr(GL, "fixture_pixels", without_one)
    out = _fresh_report(labelled_bench, tmp_path / "one-gone", monkeypatch)
    text = out["report.md"].decode()
    named = [ln for ln in text.splitlines() if "(no input tensor in the fixtures table to draw)" in ln]
    links = [ln for ln in text.splitlines() if ln.startswith("![") and "gallery/" in ln]
    assert len(named) == 3 and len(links) == 21   # that image in each of the 3 comparisons; 21 of 24 drawn
    assert len([p for p in out if p.startswith(GL.GALLERY) and p.endswith(".png")]) == 21


def test_no_fp32_verdict_points_at_the_fp32_parameter_and_the_command_line_at_its_flag(tmp_path):
    """Without an fp32 model the verdict says how to give one: the library names the parameter (fp32), the
    command line's renderer its flag (--fp32); no flag is written in the library."""
    r = hand_result()
    r.variants = [v for v in r.variants if v["variant"] != "fp32"]
    r.comparisons = [c for c in r.comparisons if c["comparison"] == "ref-same"]
    r.flip_rows = []
    md, _ = equivsection.render_equiv(r, tmp_path, plots=False, tables_root=tmp_path)
    assert "no fp32 model given: pass fp32 FILE" in md and "--fp32" not in md
    cli = lambda text: render_params(text, lambda p: "--" + p.replace("_", "-"))
    md, _ = equivsection.render_equiv(r, tmp_path, plots=False, tables_root=tmp_path, render=cli)
    assert "no fp32 model given: pass --fp32 FILE" in md


def test_the_flips_table_says_box_matched_counts_are_not_transitive():
    from types import SimpleNamespace

    from quantbench.report.equivsection import decisions_lines
    from quantbench.report.termsummary import _summary_flips

    comps = [{"comparison": c, "model": "m", "variant": "static-minmax", "variant_id": "v1", "host": h, "flips": n,
              "images_disagree": 1, "ref_total": 4, "total": 4, "concealed": True,
              "by_kind": {"threshold": 0, "class": 0, "box-shift": n}}
             for c, h, n in (("ref-fp32", "x86-avx2", 2), ("ref-same", "x86-avx2", 5))]
    result = SimpleNamespace(settings={"reference": "x86"}, comparisons=comps, hosts=["x86", "x86-avx2"],
                             variants=[{"model": "m", "variant": "static-minmax", "variant_id": "v1",
                                        "decode": {"kind": "yolo"}}])
    text = "\n".join(_summary_flips(result, comps))
    assert "not transitive" in text
    for c in comps:
        c.update(ref_variant="static-minmax", ref_host="x86", fixtures=2, margins={})
    assert "not transitive" in "\n".join(decisions_lines(result))     # the report's table says it too
    result.variants[0]["decode"]["kind"] = "classifier-softmax"   # one decision per image: nothing matched
    assert "not transitive" not in "\n".join(_summary_flips(result, comps))
    assert "not transitive" not in "\n".join(decisions_lines(result))
