"""`calibrate --force` replaces a variants folder, and only what calibrate made there: a results folder someone
kept inside it (`equiv --results results/variants/m/res`) is refused in one line and left as it was, never
deleted with the old variants."""

from __future__ import annotations

import pytest

from calib_helpers import make_corpus, tiny_model
from cli_helpers import digest, one_line
from quantbench.cli import main


@pytest.fixture
def calibrated(workdir):
    labels, _ = make_corpus(workdir / "corpus", n_litter=12, n_negative=12, n_eval=4)
    model = tiny_model(workdir / "models" / "tiny.onnx")
    argv = ["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "3", "--no-pre-process",
            "--methods", "minmax", "--out", "v"]
    assert main(argv) == 0
    return workdir, argv, labels


@pytest.mark.parametrize("results", ["v/res", "v"])
def test_force_refuses_to_delete_a_results_folder_inside_the_variants_folder(calibrated, capsys, results):
    wd, argv, labels = calibrated
    assert main(["equiv", "--hosts", "x86", "--variants", "v", "--fixtures", str(labels), "--decode", "none",
                 "--results", results, "--no-progress", "-q"]) == 0
    assert (wd / results / "tables" / "outputs").is_dir()
    before = digest(wd)
    capsys.readouterr()
    assert main([*argv, "--reduce-range", "--force"]) == 2
    line = one_line(capsys.readouterr().err, "calibrate")
    assert "v: holds folder(s) calibrate did not make (" in line and "--force" in line and "nothing was changed" in line
    assert digest(wd) == before   # the results and the old variants as they were
    assert not [p for p in (wd / "v").parent.rglob("*.tmp")]   # no staging folder left


def test_force_still_replaces_a_plain_variants_folder(calibrated, capsys):
    wd, argv, _ = calibrated
    assert main([*argv, "--reduce-range", "--force"]) == 0
    assert "replaced" in capsys.readouterr().out


@pytest.mark.parametrize("out", ["results/releases/x", "results/tables", "results/tables/x"])
def test_calibrate_refuses_an_out_inside_the_releases_or_tables(workdir, capsys, out):
    labels, _ = make_corpus(workdir / "corpus", n_litter=4, n_negative=4, n_eval=2)
    model = tiny_model(workdir / "models" / "tiny.onnx")
    before = digest(workdir)
    assert main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2", "--no-pre-process",
                 "--methods", "minmax", "--out", out]) == 2
    line = one_line(capsys.readouterr().err, "calibrate")
    assert f"--out {out}: is inside results/{out.split('/')[1]}, which holds" in line, line
    assert digest(workdir) == before and not (workdir / "results").exists() and not (workdir / "calib_sets").exists()
