"""A `quantbench release` killed at any step is finished by running it again, and a finished release is
never overwritten. The kill is exact: the test hook QUANTBENCH_TEST_KILL_AT=<step> makes the release
process SIGKILL itself at that step (quantbench.fsutil.kill_point)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quantbench.cli import main
from quantbench.release.archive import write_archive

from release_helpers import release

REPO = Path(__file__).resolve().parents[2]


def _killed_release(results, step, *extra):
    env = dict(os.environ, PYTHONPATH=str(REPO), QUANTBENCH_TEST_KILL_AT=step)
    p = subprocess.run([sys.executable, "-m", "quantbench", "release", "--tag", "v1", "--results", str(results),
                        *extra], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == -9, (step, p.stdout, p.stderr)


def _registered(results) -> bool:
    idx = results / "releases" / "index.json"
    return idx.exists() and "v1" in json.loads(idx.read_text()).get("releases", {})


def _hidden(results) -> list[str]:
    """Hidden leftovers in the releases folder (staging folders, temporary archive files), locks aside."""
    return sorted(p.name for p in (results / "releases").iterdir() if p.name.startswith(".") and p.name != ".index.lock")


@pytest.mark.parametrize("step", ["release-staged", "release-published"])
def test_a_release_killed_before_it_was_registered_is_made_by_the_rerun(results, capsys, step):
    _killed_release(results, step)
    folder = results / "releases" / "v1"
    assert not _registered(results)
    if step == "release-published":
        assert folder.is_dir()
        assert main(["verify", str(folder)]) == 1
        out = capsys.readouterr().out
        (line,) = [ln for ln in out.splitlines() if ln.startswith("registry")]
        assert " FAIL " in line and "'v1' is unfinished" in line and "run the same `quantbench release` again" in line
    else:
        assert not folder.exists() and _hidden(results)   # its staging folder, of a dead process
    assert release(results, "v1") == 0
    out = capsys.readouterr().out
    if step == "release-published":
        assert "note: release v1 was interrupted before it was registered; made it again" in out
    assert _registered(results) and not (folder / ".unfinished").exists() and _hidden(results) == []
    assert main(["verify", str(folder)]) == 0
    # and now it is finished: never overwritten
    before = (folder / "release.json").read_bytes()
    capsys.readouterr()
    assert release(results, "v1") == 2
    assert "already exists; releases are never overwritten" in capsys.readouterr().err
    assert (folder / "release.json").read_bytes() == before


def test_a_release_killed_after_registering_is_finished(results, capsys):
    _killed_release(results, "release-registered")
    folder = results / "releases" / "v1"
    assert _registered(results)
    assert main(["verify", str(folder)]) == 0
    capsys.readouterr()
    assert release(results, "v1") == 2
    assert "already exists" in capsys.readouterr().err


@pytest.mark.parametrize("step", ["archive-written", "release-registered"])
def test_an_archive_the_kill_prevented_is_written_by_the_rerun(results, capsys, step):
    """Killed while the .tar.gz was written (or before it was begun): the rerun writes only the archive,
    the same bytes as an uninterrupted run, and leaves no temporary file."""
    _killed_release(results, step, "--archive")
    rdir = results / "releases"
    archive = rdir / "v1.tar.gz"
    assert _registered(results) and not archive.exists()
    if step == "archive-written":
        assert [n for n in _hidden(results) if n.startswith(".v1.tar.gz.")]
    record = (rdir / "v1" / "release.json").read_bytes()
    assert release(results, "v1", "--archive") == 0
    out = capsys.readouterr().out
    assert "note: release v1 was already finished; wrote its missing archive" in out and f"archive: {archive}" in out
    assert (rdir / "v1" / "release.json").read_bytes() == record and _hidden(results) == []
    again, _ = write_archive(rdir / "v1", results / "again.tar.gz")
    assert again.read_bytes() == archive.read_bytes()
    assert main(["verify", str(archive)]) == 0
    # a finished archive is never written again (unless --force: then from the folder, the same bytes)
    data = archive.read_bytes()
    capsys.readouterr()
    assert release(results, "v1", "--archive") == 2
    assert f"--archive {archive}: exists; --force replaces it" in capsys.readouterr().err
    assert archive.read_bytes() == data


def test_a_killed_archives_temporary_file_is_swept_by_a_later_release_of_another_tag(results, capsys):
    """Was: `.v1.tar.gz.<pid>@....tmp` of a SIGKILLed `release --archive` stayed after a later successful release
    (of another tag): the next archive writer removes any killed writer's temporary archive in the folder."""
    _killed_release(results, "archive-written", "--archive")
    assert [n for n in _hidden(results) if n.startswith(".v1.tar.gz.")]
    assert release(results, "v2", "--archive") == 0
    assert _hidden(results) == [] and (results / "releases" / "v2.tar.gz").is_file()
