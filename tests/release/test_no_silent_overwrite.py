"""`quantbench release --archive` never replaces a file that is already there (a user's file given as FILE, a stale
results/releases/TAG.tar.gz) unless --force says so; a folder where the archive goes is refused too. Each refusal is
one line, exit 2, before anything is written: no release folder, no registry entry, the file untouched."""

from __future__ import annotations

import pytest

from cli_helpers import digest
from quantbench.cli import main

from release_helpers import release


def _refused(capsys, root, argv, words):
    before = digest(root)
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and words in lines[0] and "Traceback" not in err, err
    assert digest(root) == before, "something was written"
    return lines[0]


def test_a_users_file_given_as_the_archive_is_kept(results, tmp_path, capsys):
    (tmp_path / "notes.tar.gz").write_bytes(b"my notes\n")
    line = _refused(capsys, tmp_path, ["release", "--tag", "t1", "--results", str(results), "--archive",
                                       "notes.tar.gz"], "--archive notes.tar.gz: exists; --force replaces it")
    assert "nothing was written" in line
    assert (tmp_path / "notes.tar.gz").read_bytes() == b"my notes\n"
    assert not (results / "releases" / "t1").exists()
    assert release(results, "t1", "--archive", "notes.tar.gz", "--force") == 0
    assert main(["verify", "notes.tar.gz", "--results", str(results)]) == 0


def test_a_stale_default_archive_is_kept(results, tmp_path, capsys):
    stale = results / "releases" / "t1.tar.gz"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(b"an older t1\n")
    _refused(capsys, tmp_path, ["release", "--tag", "t1", "--results", str(results), "--archive"],
             f"--archive {stale}: exists; --force replaces it")
    assert stale.read_bytes() == b"an older t1\n" and not (results / "releases" / "t1").exists()


def test_the_archive_of_a_published_release_is_replaced_only_with_force(results, tmp_path, capsys):
    assert release(results, "t1", "--archive") == 0
    archive = results / "releases" / "t1.tar.gz"
    first = archive.read_bytes()
    capsys.readouterr()
    _refused(capsys, tmp_path, ["release", "--tag", "t1", "--results", str(results), "--archive"],
             "exists; --force replaces it")
    assert release(results, "t1", "--archive", "--force") == 0
    assert archive.read_bytes() == first   # written again from the finished folder: the same bytes


@pytest.mark.parametrize("published", [False, True])
def test_a_folder_as_the_archive_is_refused(results, tmp_path, capsys, published):
    if published:
        assert release(results, "t1") == 0
        capsys.readouterr()
    (tmp_path / "d.tar.gz").mkdir()
    for force in ([], ["--force"]):
        _refused(capsys, tmp_path, ["release", "--tag", "t1", "--results", str(results), "--archive", "d.tar.gz",
                                    *force], "--archive d.tar.gz: is a folder, not a file")


def test_an_archive_in_a_missing_folder_is_refused(results, tmp_path, capsys):
    assert release(results, "t1") == 0
    capsys.readouterr()
    _refused(capsys, tmp_path, ["release", "--tag", "t1", "--results", str(results), "--archive", "no/t1.tar.gz"],
             "--archive no/t1.tar.gz: its folder no does not exist")
