"""A full disk during calibrate or equiv: one line naming the file, exit 2, a consistent results folder.

The disk is a real one: a small tmpfs mounted for the test (root only; skipped elsewhere),
filled to a known number of free bytes before the command runs, so the write that fails
is the same on every machine.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from calib_helpers import make_corpus, tiny_model
from hosts_helpers import make_corpus as eval_corpus
from run_helpers import variants_folder
from setup_required import missing_setup
from quantbench.store import partread
from quantbench.cli import main

PAGE = 4096


@pytest.fixture
def small_disk(tmp_path):
    """An empty 4 MiB tmpfs; yields (mount point, fill) where fill(free) leaves `free` bytes writable."""
    yield from _tmpfs(tmp_path, "4m")


@pytest.fixture
def demo_disk(tmp_path):
    """small_disk's 16 MiB kind: room for the demo detector's variants and its equiv."""
    yield from _tmpfs(tmp_path, "16m")


def _tmpfs(tmp_path, size: str):
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        missing_setup("needs root to mount a small tmpfs (CI runs as root)")

    def fill(free: int) -> Path:
        st = os.statvfs(disk)
        filler = disk / "filler"
        with open(filler, "wb") as fh:
            fh.write(b"\0" * (st.f_bavail * st.f_frsize - free))
        return filler

    try:
        yield disk, fill
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("hosts file", "note:"))]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _tmp_files(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.rglob("*.tmp")) if folder.exists() else []


def test_calibrate_on_a_full_disk_is_one_line_and_publishes_nothing(small_disk, tmp_path, monkeypatch, capsys):
    disk, fill = small_disk
    labels, _ = make_corpus(tmp_path / "corpus", n_litter=8, n_negative=8, n_eval=4)
    model = tiny_model(tmp_path / "m.onnx")
    monkeypatch.chdir(disk)
    filler = fill(6 * PAGE)  # the calibration set fits, the variants do not
    argv = ["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2", "--methods", "dynamic",
            "--no-progress"]
    rc = main(argv)
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and "results/variants/m: no space left on device while writing" in line
    assert "free some space and rerun" in line
    assert not (disk / "results" / "variants" / "m").exists() and not (disk / "results" / "variants" / "latest.json").exists()
    assert not (disk / "results").exists()  # no staging leftover, nor the folders made to hold the variants
    assert not (disk / "calib_sets").exists()   # the calibration set written before the variants failed: gone too
    filler.unlink()
    assert main(argv) == 0 and (disk / "results" / "variants" / "m" / "index.json").exists()


def test_equiv_on_a_full_disk_writes_no_outputs_without_their_fixtures(small_disk, tmp_path, monkeypatch, capsys):
    """Was: OSError [Errno 28] traceback, and outputs parts written while the fixtures table stayed empty."""
    disk, fill = small_disk
    vdir = variants_folder(tmp_path / "v", size=64)         # 3 fixtures of 48 KiB each: the fixtures part is the big one
    labels = eval_corpus(tmp_path / "corpus", count=3, size=64)
    monkeypatch.chdir(disk)
    filler = fill(24 * PAGE)  # room for the lock, hosts, models and outputs parts, not for the fixtures
    argv = ["equiv", "--hosts", "x86", "--variants", str(vdir), "--fixtures", str(labels), "--no-progress",
            "--decode", "none"]
    rc = main(argv)
    line = _one_line(capsys.readouterr().err)
    tdir = disk / "results" / "tables"
    assert rc == 2 and f"{tdir.relative_to(disk)}/fixtures/part-" in line and "No space left on device" in line
    fixtures = set(partread.read("fixtures", tdir, columns=["fixture_id"]).column("fixture_id").to_pylist())
    outputs = set(partread.read("outputs", tdir, columns=["fixture_id"]).column("fixture_id").to_pylist())
    assert outputs <= fixtures  # no output without its fixture
    assert _tmp_files(disk / "results") == []
    filler.unlink()
    assert main(argv) == 0
    assert partread.read("outputs", tdir).num_rows == 3


def test_equiv_on_a_disk_without_a_free_page_is_one_line(small_disk, tmp_path, monkeypatch, capsys):
    disk, fill = small_disk
    vdir = variants_folder(tmp_path / "v")
    labels = eval_corpus(tmp_path / "corpus")
    monkeypatch.chdir(disk)
    fill(0)
    rc = main(["equiv", "--hosts", "x86", "--variants", str(vdir), "--fixtures", str(labels), "--no-progress",
               "--decode", "none"])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and "results/tables/.lock: No space left on device" in line and "free some space" in line


# onnx and onnxruntime write models from C++ without reporting a short write (onnx.shape_inference.infer_shapes_path,
# the graph optimizer's optimized_model_filepath): with these many KiB free, calibrating the demo detector read a
# truncated model back (google.protobuf.message.DecodeError traceback, or a "symbolic shape inference failed" note
# about a model that has no such problem)
DEMO_FREE_KIB = (2000, 2200, 2400, 2600, 2800, 3000)


@pytest.mark.parametrize("free_kib", DEMO_FREE_KIB)
def test_calibrate_with_onnx_short_of_space_is_one_line(small_disk, monkeypatch, capsys, free_kib):
    disk, fill = small_disk
    monkeypatch.chdir(disk)
    filler = fill(free_kib * 1024)
    argv = ["calibrate", "--no-progress"]
    rc = main(argv)
    err = capsys.readouterr().err
    line = _one_line(err)
    assert rc == 2, err
    assert line.startswith("quantbench calibrate: error: results/variants/litter-detr-tiny: no space left on device"), line
    assert "free some space and rerun" in line and "symbolic shape inference failed" not in err
    variants = disk / "results" / "variants"
    # nothing half-written: a failed calibrate removes the folders it made
    assert not variants.exists() or [p.name for p in variants.iterdir()] == []
    assert not (disk / "results").exists() or _tmp_files(disk / "results") == []
    if free_kib == DEMO_FREE_KIB[0]:
        filler.unlink()
        assert main(argv) == 0 and (variants / "litter-detr-tiny" / "index.json").exists()


# onnxruntime writes a session's profile from C++ without reporting a short write: with these many KiB free after
# calibrating the demo detector, equiv's worker read a truncated profile ("worker error: Expecting value: ...");
# one worker, so the writes come in one order
EQUIV_FREE_KIB = (1600, 1700, 1800)


def test_equiv_with_onnxruntime_profile_short_of_space_is_one_line(demo_disk, monkeypatch, capsys):
    disk, fill = demo_disk
    monkeypatch.chdir(disk)
    assert main(["calibrate", "--no-progress"]) == 0
    calibrated = set(disk.rglob("*"))
    argv = ["equiv", "--hosts", "x86", "--limit", "6", "--no-progress", "--jobs", "1"]
    for free_kib in EQUIV_FREE_KIB:
        for p in sorted(set(disk.rglob("*")) - calibrated, reverse=True):   # back to the calibrated folder
            p.rmdir() if p.is_dir() else p.unlink()
        filler = fill(free_kib * 1024)
        capsys.readouterr()
        rc = main(argv)
        err = capsys.readouterr().err
        line = _one_line(err)
        assert rc == 2, err
        assert line.startswith("quantbench equiv: error: results/tables: no space left on device"), line
        assert "onnxruntime's profile" in line and "free some space and rerun" in line, line
        assert _tmp_files(disk / "results") == [] and not list((disk / "results").rglob(".inputs.*")), free_kib
        filler.unlink()
