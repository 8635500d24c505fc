"""The search under hostile or careless input (issue 45's probes): each refused in one line naming the option or
file and the problem, exit 2, before anything runs where it can be told before, and nothing written, left behind
or written outside the results folder."""

from __future__ import annotations

import pytest

from cli_helpers import digest, one_line
from quantbench.cli import main
from search_helpers import calibrated, index_of, run_dir  # noqa: F401  (fixtures)

SEARCH = ["search", "--variant", "static-minmax", "--hosts", "x86", "--space", "global", "--no-progress"]


def _refused(run_dir, capsys, argv) -> str:
    capsys.readouterr()
    before = digest(run_dir.parent)
    rc = main(argv)
    line = one_line(capsys.readouterr().err, "search")
    assert rc == 2
    assert digest(run_dir.parent) == before, "something was written"
    return line


@pytest.mark.parametrize("name", ["../../../escape", "a/b", ".hidden", "bad\nname", ""])
def test_a_name_that_is_not_a_plain_variant_name_is_refused_before_anything_runs(run_dir, capsys, name):
    line = _refused(run_dir, capsys, [*SEARCH, "--name", name])
    assert f"--name: {name!r} is not a plain variant name" in line
    assert index_of(run_dir) == ["fp32", "static-minmax"]


@pytest.mark.parametrize("flag, value, message", [
    ("--max-seconds", "nan", "--max-seconds nan: must be a finite number"),
    ("--max-float-share", "nan", "--max-float-share nan: must be a finite number"),
    ("--max-latency-ms", "inf", "--max-latency-ms inf: must be a finite number"),
])
def test_a_number_that_is_not_finite_is_refused(run_dir, capsys, flag, value, message):
    assert message in _refused(run_dir, capsys, [*SEARCH, flag, value])
