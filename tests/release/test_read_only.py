"""`release` and `report` on a read-only results folder: one line naming the folder, exit 2, no traceback,
nothing written."""

import pytest

from release_helpers import release, run_read_only


def _snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.stat().st_mtime_ns for p in folder.rglob("*")}


@pytest.mark.parametrize("argv", [["release", "--tag", "v2"], ["release", "--tag", "v2", "--archive"],
                                  ["report", "--no-plots"]])
def test_read_only_results_folder_is_one_line(results, capsys, argv):
    assert release(results, "v1") == 0   # (a releases folder exists too)
    capsys.readouterr()
    before = _snapshot(results)
    p = run_read_only(results, [*argv, "--results", str(results)], cwd=results.parent)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr + p.stdout
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith(f"quantbench {argv[0]}: error: {results}") and "cannot write there (Read-only file system" in line
    assert _snapshot(results) == before
