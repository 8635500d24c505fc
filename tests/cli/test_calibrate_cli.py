"""`quantbench calibrate` end to end: tiny model + stand-in corpus (fast), the bundled demo (slow)."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest

from calib_helpers import make_corpus, tiny_model
from quantbench.cli import main
from quantbench.fsutil import sha256_file
from quantbench.inputs.variantdir import latest_variants, load_variants


@pytest.fixture
def setup(workdir):
    labels, images = make_corpus(workdir / "corpus", n_litter=12, n_negative=12, n_eval=4)
    model = tiny_model(workdir / "models" / "tiny.onnx")
    return workdir, model, labels


def cli(*args):
    return main(["calibrate", *map(str, args)])


def base_args(model, labels, *extra):
    return ["--model", model, "--labels", labels, "--per-cell", 3, *extra]


def error_lines(stderr: str) -> list[str]:
    """stderr without the tqdm progress lines."""
    return [ln for ln in stderr.replace("\r", "\n").splitlines() if ln.startswith("quantbench")]


def tree(root):
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in sorted(root.rglob("*")) if p.is_file()}


def test_full_run_writes_variants_and_is_reproducible(setup, capsys):
    wd, model, labels = setup
    assert cli(*base_args(model, labels, "--chunk-size", 5)) == 0
    out = capsys.readouterr().out
    for word in ("objects/dark", "empty/bright", "strata by objects", "static-percentile", "peak memory", "calib images",
                 "results/variants/tiny", "calib_sets/tiny-n3-seed0"):
        assert word in out
    vs = latest_variants()
    assert [v.name for v in vs] == ["fp32", "dynamic", "static-minmax", "static-percentile"]
    assert [(v.name, v.path.resolve()) for v in vs] == [
        (v.name, v.path.resolve()) for v in load_variants(wd / "results" / "variants" / "tiny")]
    assert (wd / "calib_sets" / "tiny-n3-seed0" / "manifest.parquet").exists()
    import onnxruntime as ort

    x = {"images": np.random.default_rng(0).random((1, 3, 16, 16), dtype=np.float32)}
    for v in vs:
        assert v.recipe["source_model"]["raw_sha256"] == sha256_file(model)
        y = ort.InferenceSession(str(v.path), providers=["CPUExecutionProvider"]).run(None, x)[0]
        assert y.shape[0] == 1 and np.isfinite(y).all()
        if v.name.startswith("static"):
            assert v.recipe["calibration_set"]["images"] == 12
            assert v.recipe["calibration_set"]["manifest_sha256"] == sha256_file(
                wd / "calib_sets" / "tiny-n3-seed0" / "manifest.parquet")
            assert v.recipe["pre_process"] is True
    before = tree(wd / "results") | {"calib/" + k: h for k, h in tree(wd / "calib_sets").items()}
    # same command again, other chunk size: identical manifest, ranges and models, nothing refused
    assert cli(*base_args(model, labels, "--chunk-size", 1)) == 0
    assert "unchanged" in capsys.readouterr().out
    after = tree(wd / "results") | {"calib/" + k: h for k, h in tree(wd / "calib_sets").items()}
    assert after == before
    assert not [p for p in (wd / "results" / "variants").iterdir() if p.name.startswith(".")]


def test_options_types_and_refusal(setup, capsys):
    wd, model, labels = setup
    args = base_args(model, labels, "--no-pre-process", "--methods", "minmax", "--out", "v")
    assert cli(*args) == 0
    capsys.readouterr()
    # different variants into the same folder: refused, old files untouched
    before = tree(wd / "v")
    assert cli(*args, "--types", "u8s8,s8s8", "--reduce-range", "--no-per-channel") == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "v: already holds different variants" in err[0] and "--force" in err[0]
    assert tree(wd / "v") == before
    assert cli(*args, "--types", "u8s8,s8s8", "--reduce-range", "--no-per-channel", "--exclude-op-types", "MatMul",
               "--force") == 0
    names = [v.name for v in load_variants(wd / "v")]
    assert names == ["fp32", "static-minmax", "static-minmax-s8s8"]
    rec = json.loads((wd / "v" / "static-minmax-s8s8.recipe.json").read_text())
    assert (rec["activation_type"], rec["weight_type"], rec["reduce_range"], rec["per_channel"]) == ("s8", "s8", True, False)
    assert rec["exclude_op_types"] == ["MatMul"] and rec["pre_process"] is False
    assert json.loads((wd / "results" / "variants" / "latest.json").read_text())["folder"] == os.path.abspath("v")


def _assert_nothing_written(wd):
    for d in ("results", "calib_sets"):
        p = wd / d
        assert not p.exists(), d   # not even an empty folder


@pytest.mark.parametrize("case", ["checker", "shape", "corrupt", "missing", "exclude", "exclude_pre", "method"])
def test_bad_input_is_one_line_and_leaves_nothing(setup, capsys, case):
    wd, model, labels = setup
    args = base_args(model, labels, "--no-pre-process")
    if case == "checker":
        m = onnx.load(str(model))
        m.graph.node[0].input[1] = "no_such_weight"
        bad = wd / "models" / "broken.onnx"
        onnx.save(m, str(bad))
        args = base_args(bad, labels)
        expect = "broken.onnx: fails onnx.checker"
    elif case == "shape":
        side = json.loads(model.with_suffix(".json").read_text())
        side["input"].update(shape=[1, 1, 16, 16], color="GRAY", mean=[0.5], std=[0.25])  # overrides, cannot run
        model.with_suffix(".json").write_text(json.dumps(side))
        expect = "tiny.onnx: declares input 'images' as [1, 3, 16, 16]; at the sidecar's input 'shape' [1, 1, 16, 16]"
    elif case == "corrupt":
        coco = json.loads(labels.read_text())
        victim = next(im for im in coco["images"] if im["split"] == "train")["file_name"]
        (labels.parent / "images" / victim).write_bytes(b"garbage")
        expect = f"{victim}: not a readable image"
    elif case == "missing":
        coco = json.loads(labels.read_text())
        coco["images"][0]["file_name"] = "gone.png"
        labels.write_text(json.dumps(coco))
        expect = "references missing image"
    elif case == "exclude":
        args += ["--exclude-nodes", "conv1,nope"]
        expect = "--exclude-nodes: "
    elif case == "exclude_pre":  # pre-processing renames nodes: the message names the flag that turns it off
        args = base_args(model, labels, "--exclude-nodes", "nope")
        expect = "after pre-processing (pass --no-pre-process to use the original graph)"
    else:
        args += ["--methods", "minmax,kl"]
        expect = "--methods: unknown ['kl']"
    assert cli(*args) == 2
    raw = capsys.readouterr().err
    err = error_lines(raw)
    assert len(err) == 1 and expect in err[0] and "Traceback" not in raw
    _assert_nothing_written(wd)   # also when it failed while making variants: the calibration set goes too


def test_skip_bad_records_the_image(setup, capsys):
    wd, model, labels = setup
    coco = json.loads(labels.read_text())
    victim = next(im for im in coco["images"] if im["split"] == "train")["file_name"]
    (labels.parent / "images" / victim).write_bytes(b"garbage")
    assert cli(*base_args(model, labels, "--no-pre-process", "--methods", "minmax", "--per-cell", 2,
                          "--skip-bad")) == 0
    assert "skipped 1 unreadable image" in capsys.readouterr().out
    import pyarrow.parquet as pq

    rows = pq.read_table(wd / "calib_sets" / "tiny-n2-seed0" / "manifest.parquet").to_pylist()
    assert [r["path"] for r in rows if r["status"] == "skipped"] == [victim]


@pytest.mark.slow
def test_bundled_demo_no_arguments(workdir, capsys):
    """`quantbench calibrate` with no arguments: the bundled detector and corpus, 48 images."""
    assert main(["calibrate"]) == 0
    out = capsys.readouterr().out
    vs = latest_variants()
    assert [v.name for v in vs] == ["fp32", "dynamic", "static-minmax", "static-percentile"]
    assert all(v.model == "litter-detr-tiny" for v in vs)
    assert "48 images" in out
    recipe = json.loads((workdir / "calib_sets" / "litter-detr-tiny-n12-seed0" / "recipe.json").read_text())
    assert [c["selected"] for c in recipe["cells"]] == [12, 12, 12, 12]


def test_entropy_at_its_default_bins_is_said_to_duplicate_minmax_before_calibrating(setup, capsys):
    wd, model, labels = setup
    assert cli(*base_args(model, labels, "--methods", "minmax,entropy", "--no-progress")) == 0
    out = capsys.readouterr().out
    note = next(ln for ln in out.splitlines() if "static-entropy at 128 histogram bins" in ln)
    assert note.startswith("note: ") and "byte-duplicate of static-minmax" in note
    assert out.index(note) < out.index("calibration set ")    # said before the work it costs
    assert cli(*base_args(model, labels, "--methods", "minmax,entropy", "--entropy-bins", "512", "--no-progress",
                          "--out", "v512", "--name", "s512")) == 0
    assert "static-entropy at 128" not in capsys.readouterr().out


def test_a_set_without_object_boxes_is_one_stratum_not_empty_with_objects_left_out(workdir, capsys):
    labels, _ = make_corpus(workdir / "corpus", n_litter=0, n_negative=24, n_eval=4)
    model = tiny_model(workdir / "models" / "tiny.onnx")
    assert cli(*base_args(model, labels, "--methods", "minmax", "--no-progress")) == 0
    out = capsys.readouterr().out
    assert "strata by objects: none (no image has an object box: one stratum, balanced by lighting)" in out
    assert "none of:" not in out
