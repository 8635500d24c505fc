"""The decode block of calibrated variants changes without re-quantizing (their bytes do not depend on it): checks
come first (this model's variants, the same input block, a block that fits the outputs), calibrate refuses before
any work when only the decode block differs, and equiv then decodes with the recorded block."""

from __future__ import annotations

import json

import pytest

from calib_helpers import make_corpus, tiny_model
from quantbench.cli import main
from quantbench.fsutil import sha256_file
from quantbench.inputs.variantdir import load_variants

PLUGIN = '''import numpy as np

def decode(outputs, spec):
    logits = next(iter(outputs.values()))[0]          # [tokens, 4]
    cls = logits.argmax(axis=1)
    score = 1 / (1 + np.exp(-logits.max(axis=1)))
    return {"cls": cls, "score": score, "kept": score > spec.params.get("cut", 0.5)}
'''


@pytest.fixture
def calibrated(workdir, capsys):
    labels, _ = make_corpus(workdir / "corpus", n_litter=12, n_negative=12, n_eval=4)
    model = tiny_model(workdir / "models" / "tiny.onnx")
    (workdir / "dec.py").write_text(PLUGIN)
    args = ["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "3", "--methods",
            "dynamic,minmax", "--no-progress"]
    assert main(args) == 0
    capsys.readouterr()
    return workdir, model, labels, args


def _files(folder):
    return {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file()}


def _with_decode(model, block):
    side = json.loads(model.with_suffix(".json").read_text())
    side["decode"] = block
    model.with_suffix(".json").write_text(json.dumps(side))


def test_calibrate_refuses_before_any_work_when_only_the_decode_block_differs(calibrated, capsys):
    wd, model, labels, args = calibrated
    vdir = wd / "results" / "variants" / "tiny"
    before = _files(vdir)
    _with_decode(model, {"kind": "dec.py:decode", "cut": 0.6})
    assert main([*args, "--decode", "dec.py:decode", "--name", "another-set"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("quantbench")]
    assert len(err) == 1 and "decode none -> dec.py:decode" in err[0] and "--decode-only" in err[0], err
    assert "--force" in err[0]
    assert not (wd / "calib_sets" / "another-set").exists()    # refused before the calibration set was built
    assert _files(vdir) == before


def test_decode_only_records_the_block_and_leaves_every_model_byte_alone(calibrated, capsys):
    wd, model, labels, args = calibrated
    vdir = wd / "results" / "variants" / "tiny"
    before = _files(vdir)
    _with_decode(model, {"kind": "dec.py:decode", "cut": 0.6})
    assert main(["calibrate", "--model", str(model), "--decode", "dec.py:decode", "--decode-only"]) == 0
    out = capsys.readouterr().out
    assert "decode none -> dec.py:decode in 3 variant(s)" in out and "nothing calibrated or quantized" in out
    after = _files(vdir)
    changed = sorted(k for k in after if after[k] != before.get(k))
    assert changed == ["dynamic.recipe.json", "fp32.recipe.json", "static-minmax.recipe.json"]
    for v in load_variants(vdir):
        assert v.recipe["sidecar"]["decode"] == {"kind": "dec.py:decode", "cut": 0.6}
        assert v.recipe["decode_plugin"]["sha256"] == sha256_file(wd / "dec.py")
    assert not [p for p in vdir.parent.iterdir() if p.name.startswith(".")]   # no staging folder left
    # the same again: nothing to rewrite
    assert main(["calibrate", "--model", str(model), "--decode", "dec.py:decode", "--decode-only"]) == 0
    assert "unchanged" in capsys.readouterr().out and _files(vdir) == after
    # equiv decodes with the recorded block (the plug-in runs unasked: the recipe records it)
    assert main(["run", "--hosts", "x86", "--fixtures", str(labels), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["equiv", "--no-run", "--no-plots", "--hosts", "x86", "--fixtures", str(labels), "--no-progress",
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    own = [c for c in summary["comparisons"] if c["comparison"] == "own-fp32"]
    assert own and all(c["flips"] is not None for c in own)


def test_decode_only_refuses_another_input_block_or_model_or_a_block_that_does_not_fit(calibrated, capsys):
    wd, model, labels, args = calibrated
    vdir = wd / "results" / "variants" / "tiny"
    before = _files(vdir)
    side = json.loads(model.with_suffix(".json").read_text())
    side["input"]["mean"] = [0.5, 0.5, 0.5]
    (wd / "other.json").write_text(json.dumps(side))
    assert main(["calibrate", "--model", str(model), "--sidecar", str(wd / "other.json"), "--decode-only"]) == 2
    err = capsys.readouterr().err
    assert "mean differ" in err and "only the decode block can change" in err
    _with_decode(model, {"kind": "detr-sigmoid"})
    assert main(["calibrate", "--model", str(model), "--decode-only"]) == 2
    assert "pred_logits" in capsys.readouterr().err
    other = tiny_model(wd / "elsewhere" / "tiny.onnx", seed=5)
    assert main(["calibrate", "--model", str(other), "--out", str(vdir), "--decode-only"]) == 2
    assert "were not made from" in capsys.readouterr().err
    assert main(["calibrate", "--model", str(model), "--out", str(wd / "none"), "--decode-only"]) == 2
    assert "holds no variants" in capsys.readouterr().err
    assert _files(vdir) == before
