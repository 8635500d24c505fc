"""A cache never decides a reported figure alone: an accuracy score or an equiv analysis forged in the results
folder's cache, its checksum recomputed as anyone can, is a miss; the report (and the release that copies it)
shows what the scoring gives, byte for byte the unforged report."""

from __future__ import annotations

import json
import shutil

import pytest

from quantbench.cli import main
from quantbench.fsutil import content_key, sha256_bytes

from release_helpers import make_release_results, release


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    return make_release_results(tmp_path_factory.mktemp("forged"), "doc", labelled=True)


@pytest.fixture
def results(labelled, tmp_path, monkeypatch):
    dest = tmp_path / "results"
    shutil.copytree(labelled, dest, symlinks=True)
    for name in ("labels.json", "images"):
        src = labelled.parent / name
        (shutil.copytree if src.is_dir() else shutil.copyfile)(src, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return dest


def _equiv(results):
    assert main(["equiv", "--no-run", "--no-plots", "--hosts", "x86", "--fixtures", "labels.json", "--no-progress",
                 "--results", str(results)]) == 0


def _forge_accuracy(results):
    """Every score top-1 1.000 (5/5), each entry's checksum recomputed (in the field of either format)."""
    path = results / ".cache" / "accuracy.json"
    data = json.loads(path.read_text())
    for e in data["scores"].values():
        e["score"].update(value=1.0, correct=5)
        e["sha256"] = e["seal"] = content_key(e["score"])
    path.write_text(json.dumps(data))


def _forge_equiv(results):
    """Every equiv entry with no flip rows, its first line's checksum recomputed."""
    for path in (results / ".cache" / "equiv").glob("*.json"):
        head, _, body = path.read_bytes().partition(b"\n")
        meta, payload = json.loads(head), json.loads(body)
        payload["flip_rows"] = []
        body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
        meta["sha256"] = meta["seal"] = sha256_bytes(body)
        path.write_bytes(json.dumps(meta).encode() + b"\n" + body)


def test_the_first_report_shows_the_scored_figures(results):
    report = (results / "report.md").read_text()
    assert "| fp32 | 0.400 (2/5) |" in report and "| dynamic | 0.600 (3/5) (+0.200) |" in report


@pytest.mark.parametrize("forge", [_forge_accuracy, _forge_equiv])
def test_a_forged_cache_entry_is_scored_again(results, capsys, forge):
    before = (results / "report.md").read_bytes()
    _equiv(results)   # the cache written by this machine
    assert (results / "report.md").read_bytes() == before
    forge(results)
    _equiv(results)
    report = (results / "report.md").read_bytes()
    assert b"1.000 (5/5)" not in report
    assert report == before
    assert release(results, "t1") == 0
    released = (results / "releases" / "t1" / "report.md").read_text()
    assert "| fp32 | 0.400 (2/5) |" in released and "1.000 (5/5)" not in released
    if forge is _forge_equiv:
        assert "**concealed**" in released


def test_a_cache_from_another_machine_is_not_trusted(results, monkeypatch, tmp_path):
    """The seal's secret lives in QUANTBENCH_HOME, not in the results folder: entries sealed elsewhere are
    misses (and are sealed again here)."""
    _equiv(results)
    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path / "elsewhere"))
    from quantbench.analysis import accuracy

    path = results / ".cache" / "accuracy.json"
    cache = accuracy.ScoreCache(path)
    assert cache.known == {}
    monkeypatch.undo()
    assert accuracy.ScoreCache(path).known != {}
