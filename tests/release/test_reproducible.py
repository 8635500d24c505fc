"""Same results, same archive bytes: `release --archive` takes every timestamp it writes from
SOURCE_DATE_EPOCH when it is set (the reproducible-builds convention)."""

import hashlib
import json
import shutil

import pytest

from quantbench.cli import main



def _release_copy(base_results, where, monkeypatch, capsys, *extra):
    """Release v1 --archive from a fresh copy of the results at `where`/results; (exit code, folder)."""
    shutil.copytree(base_results, where / "results")
    monkeypatch.chdir(where)
    rc = main(["release", "--tag", "v1", "--results", "results", "--archive", *extra])
    capsys.readouterr()
    return rc, where / "results" / "releases"


def test_three_copies_give_one_archive_with_source_date_epoch(base_results, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    shas = set()
    for i in range(3):
        (tmp_path / f"c{i}").mkdir()
        rc, rdir = _release_copy(base_results, tmp_path / f"c{i}", monkeypatch, capsys)
        assert rc == 0
        shas.add(hashlib.sha256((rdir / "v1.tar.gz").read_bytes()).hexdigest())
        assert json.loads((rdir / "v1" / "release.json").read_text())["created_at"] == "2023-11-14T22:13:20+00:00"
    assert len(shas) == 1


@pytest.mark.parametrize("value", ["yesterday", "-5", "1e9", ""])
def test_a_bad_source_date_epoch_is_one_line_and_writes_nothing(base_results, tmp_path, monkeypatch, capsys, value):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    shutil.copytree(base_results, tmp_path / "results")
    monkeypatch.chdir(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    capsys.readouterr()
    if value == "":   # set but empty: unset, as the convention says
        assert main(["release", "--tag", "v1", "--results", "results"]) == 0
        return
    assert main(["release", "--tag", "v1", "--results", "results", "--archive"]) == 2
    err = capsys.readouterr().err
    assert err == (f"quantbench release: error: SOURCE_DATE_EPOCH={value!r}: not a whole number of seconds since "
                   "1970-01-01 UTC (the reproducible-builds convention); unset it or fix it\n")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
