"""An already-quantized model is brought as it is.

Was: calibrate quantized it again (onnxruntime's qdq_quantizer raised `KeyError: '140_scale'` on a
ConvInteger + DynamicQuantizeLinear model, after the calibration set was written; --methods dynamic
warned 'weights were probably quantized as activations'), and `equiv --variants FILE` named every bare
file "fp32", so an int8 file became its own fp32 reference. Now calibrate detects it before anything is
written, says so in one line, and publishes it as the variant `as-given` (plus --fp32 FILE as fp32);
equiv names a bare quantized file by its stem, takes --fp32 FILE as the reference, and without one counts
flips against the same file on the reference host, saying no fp32 comparison was possible.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from onnxruntime.quantization import quantize_dynamic

from quantbench.inputs.assets import MODELS_DIR
from quantbench.cli import main
from quantbench.inputs.variantdir import load_variants, resolve_variants

FP32 = MODELS_DIR / "litter-cnn.onnx"


@pytest.fixture
def int8(workdir) -> Path:
    """The bundled classifier as onnxruntime's quantize_dynamic makes it (ConvInteger, DynamicQuantizeLinear),
    with its sidecar beside it, as a user would bring it."""
    # from a copy: quantize_dynamic writes `<input>-inferred.onnx` beside its input and deletes it, so two workers
    # quantizing the bundled file itself race for that one path (and write into the package)
    source = shutil.copyfile(FP32, workdir / "litter-cnn.onnx")
    quantize_dynamic(str(source), str(workdir / "cnn-int8.onnx"))
    shutil.copyfile(MODELS_DIR / "litter-cnn.json", workdir / "cnn-int8.json")
    return workdir / "cnn-int8.onnx"


def test_calibrate_publishes_a_quantized_model_as_given(int8, workdir, capsys):
    assert main(["calibrate", "--model", str(int8), "--no-progress"]) == 0
    out = capsys.readouterr().out
    notes = [ln for ln in out.splitlines() if ln.startswith("note:")]
    assert len(notes) == 1 and "already quantized (ConvInteger x" in notes[0] and "nothing is re-quantized" in notes[0]
    assert "calibration set" not in out and not (workdir / "calib_sets").exists()
    folder = workdir / "results" / "variants" / "cnn-int8"
    (v,) = load_variants(folder)
    assert v.name == "as-given" and v.path.read_bytes() == int8.read_bytes()
    assert v.recipe["made_by"].startswith("not quantbench") and v.recipe["quant_format"] == "integer"
    assert v.recipe["input_model_sha256"] == v.recipe["source_model"]["raw_sha256"]
    assert sorted(p.name for p in folder.iterdir()) == ["as-given.onnx", "as-given.recipe.json", "index.json"]


def test_calibrate_fp32_names_the_float_original(int8, workdir, capsys):
    assert main(["calibrate", "--model", str(int8), "--fp32", str(FP32), "--no-progress"]) == 0
    vs = load_variants(workdir / "results" / "variants" / "cnn-int8")
    assert [v.name for v in vs] == ["fp32", "as-given"] and {v.model for v in vs} == {"cnn-int8"}
    capsys.readouterr()
    # a quantized --fp32 is refused, nothing written
    assert main(["calibrate", "--model", str(int8), "--fp32", str(int8), "--out", "other", "--no-progress"]) == 2
    assert "is itself quantized" in capsys.readouterr().err and not (workdir / "other").exists()
    # a float --model has no float original to name
    assert main(["calibrate", "--model", str(FP32), "--fp32", str(FP32), "--out", "other", "--no-progress"]) == 2
    assert "is a float model" in capsys.readouterr().err and not (workdir / "other").exists()


def test_equiv_without_fp32_counts_flips_against_the_same_file(int8, workdir, capsys):
    assert main(["calibrate", "--model", str(int8), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["equiv", "--hosts", "x86,x86-avx2", "--limit", "2", "--no-progress", "--no-plots"]) == 0
    out = capsys.readouterr().out
    verdict = next(ln for ln in out.splitlines() if "as-given:" in ln)
    assert "no fp32 comparison was possible" in verdict and "against the same file on x86" in verdict
    # the command line names the flag that gives one, in its summary and in the report it wrote
    assert "pass --fp32 FILE" in verdict and "pass --fp32 FILE" in (workdir / "results" / "report.md").read_text()
    comps = json.loads((workdir / "results" / "equiv.json").read_text())["comparisons"]
    assert [(c["comparison"], c["host"], c["ref_variant"]) for c in comps] == [("ref-same", "x86-avx2", "as-given")]
    capsys.readouterr()
    assert main(["release", "--tag", "v1"]) == 0 and main(["verify", "results/releases/v1"]) == 0
    assert "verify results/releases/v1: PASS" in capsys.readouterr().out
    # the float original named afterwards: fed with the as-given recipe's preprocessing, the reference of its flips
    assert main(["equiv", "--fp32", str(FP32), "--hosts", "x86", "--limit", "2", "--no-progress", "--no-plots"]) == 0
    comps = json.loads((workdir / "results" / "equiv.json").read_text())["comparisons"]
    assert [(c["comparison"], c["variant"], c["ref_variant"]) for c in comps] == [("own-fp32", "as-given", "fp32")]


def test_bare_quantized_file_is_named_by_its_stem_and_fp32_names_the_reference(int8, workdir, capsys):
    (v,) = resolve_variants([str(int8)])
    assert v.name == "cnn-int8"      # was "fp32": the int8 file was its own fp32 reference
    ref, q = resolve_variants([str(int8)], fp32=str(FP32))
    assert (ref.name, ref.model, q.name, q.model) == ("fp32", "cnn-int8", "cnn-int8", "cnn-int8")
    assert main(["equiv", "--variants", str(int8), "--fp32", str(FP32), "--sidecar", str(workdir / "cnn-int8.json"),
                 "--fixtures", str(MODELS_DIR.parent / "corpus" / "labels.json"), "--hosts", "x86", "--limit", "2",
                 "--no-progress", "--no-plots"]) == 0
    comps = json.loads((workdir / "results" / "equiv.json").read_text())["comparisons"]
    assert [(c["comparison"], c["variant"], c["ref_variant"]) for c in comps] == [("own-fp32", "cnn-int8", "fp32")]
    capsys.readouterr()
    assert main(["equiv", "--variants", str(int8), "--fp32", str(int8), "--hosts", "x86", "--no-progress"]) == 2
    assert "must be the float model" in capsys.readouterr().err
