"""Hostile inputs (issue 14, items 1-6): each case asserts the exit code, the one-line message and
that nothing was written, nothing was lost and nothing landed outside the folder it belongs to."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from quantbench.cli import main
from quantbench.fsutil import sha256_file

#: the one file a run/equiv may create before it fails: the advisory lock of the tables folder (item 6)
LOCK_NAME = ".lock"


def digest(root, skip_lock: bool = True) -> dict:
    """{relative path: sha256 (or symlink target)} of every file under root: what "nothing changed" compares."""
    root = Path(root)
    if not root.exists():
        return {}
    out = {}
    for p in sorted(root.rglob("*")):
        if skip_lock and p.name == LOCK_NAME:
            continue
        if p.is_symlink():
            out[p.relative_to(root).as_posix()] = "-> " + os.readlink(p)
        elif p.is_file():
            out[p.relative_to(root).as_posix()] = sha256_file(p)
    return out


def one_line(err: str, command: str) -> str:
    """The single `quantbench <command>: error: ...` line of stderr (progress bars aside)."""
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.startswith("quantbench")]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"quantbench {command}: error: "), lines[0]
    assert "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------- 1. calibrate --force never replaces results/


@pytest.fixture
def calib_setup(workdir):
    from calib_helpers import make_corpus, tiny_model

    labels, _ = make_corpus(workdir / "corpus", n_litter=4, n_negative=4, n_eval=2)
    model = tiny_model(workdir / "models" / "tiny.onnx")
    results = workdir / "results"
    for rel, text in (("tables/outputs/part-x.parquet", "rows"), ("report.md", "# report"),
                      ("releases/index.json", '{"keys": {}}'), ("releases/v1/release.json", "{}")):
        (results / rel).parent.mkdir(parents=True, exist_ok=True)
        (results / rel).write_text(text)
    return workdir, model, labels


def calibrate(model, labels, *extra):
    return main(["calibrate", "--model", str(model), "--labels", str(labels), "--methods", "dynamic",
                 "--per-cell", "2", *map(str, extra)])


def test_calibrate_force_refuses_to_replace_a_results_folder(calib_setup, capsys):
    wd, model, labels = calib_setup
    before = digest(wd)
    assert calibrate(model, labels, "--out", "results", "--force") == 2
    line = one_line(capsys.readouterr().err, "calibrate")
    assert "results: is not a variants folder (no index.json or recipe.json)" in line and "even with --force" in line
    assert digest(wd) == before                                   # nothing lost, nothing written (no calib set either)
    assert not (wd / "calib_sets").exists()


@pytest.mark.parametrize("how", ["model-dotdot", "name-dotdot", "name-slash"])
def test_calibrate_names_cannot_make_the_output_folder_results(calib_setup, capsys, how):
    wd, model, labels = calib_setup
    if how == "model-dotdot":                                     # Path('...onnx').stem == '..'
        shutil.copyfile(model, wd / "...onnx")
        shutil.copyfile(model.with_suffix(".json"), wd / "...json")
        args = (wd / "...onnx", labels, "--force")
        words = "model name '..' is not a plain name"
    else:
        args = (model, labels, "--name", ".." if how == "name-dotdot" else "../results", "--force")
        words = "--name: '..' is not a plain name" if how == "name-dotdot" else "is not a plain name"
    before = digest(wd)
    assert calibrate(*args) == 2
    assert words in one_line(capsys.readouterr().err, "calibrate")
    assert digest(wd) == before


def test_calibrate_force_still_replaces_its_own_variants_folder(calib_setup, capsys):
    wd, model, labels = calib_setup
    assert calibrate(model, labels, "--out", "v") == 0
    assert calibrate(model, labels, "--out", "v", "--seed", "1", "--force") == 0
    assert "replaced (--force)" in capsys.readouterr().out
    assert (wd / "v" / "index.json").exists() and (wd / "results" / "report.md").read_text() == "# report"
