"""A calibrate run of the saturating classifier (tests/explain_helpers.saturating_image_model: static-minmax flips
4 of 4 eval fixtures on x86-avx2, none on x86), copied into each test's working folder, and how the search tests
read what a search wrote."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from explain_helpers import bright_corpus, saturating_image_model
from quantbench.cli import main


def calibrate_small(root: Path, build, methods: str = "minmax") -> Path:
    """`root` after a calibrate run (static-minmax only, or `methods`) of the image classifier `build(path)` writes,
    on 8 bright images: its results/ and calib_sets/ to copy into each test's working folder."""
    model = build(root / "m.onnx")
    (root / "m.json").write_text(json.dumps({"decode": {"kind": "classifier-softmax", "logits": "logits"}}))
    labels = bright_corpus(root / "corpus", count=8)
    here = os.getcwd()
    os.chdir(root)
    try:
        assert main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2", "--methods",
                     methods, "--allow-short", "--no-progress"]) == 0
    finally:
        os.chdir(here)
    return root


def copy_run(source: Path, workdir: Path) -> Path:
    """`workdir` holding a copy of the calibrate run's results/ and calib_sets/ in `source`."""
    for name in ("results", "calib_sets"):
        shutil.copytree(source / name, workdir / name, symlinks=True)
    return workdir


@pytest.fixture(scope="session")
def calibrated(tmp_path_factory):
    """One calibrate run per session (per xdist worker) for every search test file: each test copies it (run_dir)."""
    return calibrate_small(tmp_path_factory.mktemp("calibrated"), saturating_image_model)


@pytest.fixture
def run_dir(calibrated, tmp_path, monkeypatch):
    """The working folder holding the calibrate run's results/ and calib_sets/: a folder of its own inside the test's
    tmp_path, so that "nothing written beside it" is a look at tmp_path (the parent of tmp_path holds every other
    test's folders of this worker, which hashing made the hostile-input probes take 10 s each)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return copy_run(calibrated, work)


def result_of(out: str) -> dict:
    """The result JSON a search printed the path of."""
    path = next(line.split("result: ", 1)[1] for line in out.splitlines() if "; result: " in line)
    return json.loads(Path(path).read_text())


def index_of(run_dir) -> list[str]:
    return [e["name"] for e in json.loads((run_dir / "results/variants/m/index.json").read_text())]
