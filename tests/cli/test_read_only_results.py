"""A results folder that takes no new file (a read-only mount) stops calibrate, ci and tables compact with one
line naming the folder, exit 2, and nothing written anywhere (they gave an OSError traceback).

The folder is really read-only: a read-only bind mount of results/ (root only; skipped elsewhere), since root
writes through any permission bits.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from calib_helpers import make_corpus, tiny_model
from cli_helpers import digest, one_line
from hosts_helpers import make_corpus as eval_corpus
from run_helpers import variants_folder
from setup_required import missing_setup
from quantbench.store import partread
from quantbench.cli import main


@pytest.fixture
def read_only_results(workdir):
    """workdir with results/tables holding two parts per table (two runs), then results/ mounted read-only."""
    vdir = variants_folder(workdir / "v")
    labels = eval_corpus(workdir / "corpus")
    for limit in ("1", "2"):
        assert main(["run", "--hosts", "x86", "--variants", str(vdir), "--fixtures", str(labels), "--limit", limit,
                     "--no-progress"]) == 0
    assert len(partread.parts("outputs", workdir / "results" / "tables")) >= 2
    results = workdir / "results"
    if os.geteuid() != 0 or subprocess.run(["mount", "--bind", "-o", "ro", str(results), str(results)],
                                           capture_output=True).returncode != 0:
        missing_setup("needs root to bind-mount a read-only results folder (CI runs as root)")
    try:
        if os.access(results, os.W_OK) and _writes(results):
            pytest.fail("the read-only bind mount still takes files")
        yield workdir
    finally:
        subprocess.run(["umount", str(results)], check=True)


def _writes(folder) -> bool:
    try:
        (folder / ".probe").write_text("x")
    except OSError:
        return False
    (folder / ".probe").unlink()
    return True


def _refused(wd, capsys, argv, command) -> str:
    capsys.readouterr()
    before = digest(wd)
    assert main(argv) == 2
    line = one_line(capsys.readouterr().err, command)
    assert digest(wd) == before, "something was written"
    return line


def test_calibrate_into_a_read_only_results_folder_is_one_line(read_only_results, capsys):
    wd = read_only_results
    labels, images = make_corpus(wd / "data", n_litter=4, n_negative=4, n_eval=2)
    model = tiny_model(wd / "models" / "mine.onnx")
    line = _refused(wd, capsys, ["calibrate", "--model", str(model), "--labels", str(labels), "--images", str(images),
                                 "--per-cell", "2", "--methods", "dynamic", "--no-progress"], "calibrate")
    assert "error: results: cannot write there (Read-only file system); nothing was written" in line, line
    assert not (wd / "calib_sets").exists()   # not the calibration set either


def test_ci_into_a_read_only_results_folder_is_one_line(read_only_results, capsys):
    line = _refused(read_only_results, capsys, ["ci"], "ci")
    assert "error: results: cannot write there (Read-only file system); nothing was written" in line, line


def test_tables_compact_of_a_read_only_results_folder_is_one_line(read_only_results, capsys):
    line = _refused(read_only_results, capsys, ["tables", "compact"], "tables")
    assert "error: results/tables/" in line and ": cannot write there (Read-only file system);" in line, line
    assert "was not written" in line, line


def test_remedy_into_a_read_only_results_folder_is_one_line(read_only_results, capsys):
    """remedy writes its variants under results/remedies: refused before any is built or any host runs (it was an
    OSError traceback from the mkdir)."""
    wd = read_only_results
    line = _refused(wd, capsys, ["remedy", "--variant", str(wd / "v" / "fp32.onnx"), "--fp32",
                                 str(wd / "v" / "fp32.onnx"), "--hosts", "x86,x86+session.set_denormal_as_zero=1",
                                 "--remedies", "baseline", "--decode", "classifier-softmax", "--fixtures",
                                 str(wd / "corpus" / "labels.json"), "--limit", "1", "--no-progress"], "remedy")
    assert "error: results: cannot write there (Read-only file system); nothing was written" in line, line
