"""A Ctrl-C while the command line is still loading (importing numpy, onnx, pyarrow and the command's module:
about a second of every command) is one line and exit code 130, never a KeyboardInterrupt traceback; nothing
is written. The interrupt is sent by the process itself at a known step (fsutil.kill_point), not by a timer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import digest


def _interrupted(argv, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, QUANTBENCH_TEST_KILL_AT="commands-imported", QUANTBENCH_TEST_KILL_SIGNAL="INT")
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("command", [["calibrate", "--no-progress"], ["equiv", "--hosts", "x86"], ["hosts", "list"]])
def test_ctrl_c_while_loading_is_one_line_and_exit_130(workdir, command):
    before = digest(workdir)
    proc = _interrupted([sys.executable, "-m", "quantbench", *command], workdir)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "quantbench: interrupted before the command started; nothing was written\n"
    assert digest(workdir) == before


def test_the_installed_script_handles_it_too(workdir):
    script = Path(sys.executable).parent / "quantbench"
    if not script.exists():
        script = shutil.which("quantbench")
    assert script, "the quantbench script is installed beside this interpreter (scripts/setup.sh)"
    proc = _interrupted([str(script), "hosts", "list"], workdir)
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr


def test_calibrate_seed_out_of_range_is_one_line(workdir):
    from quantbench.cli import main

    for seed in ("-1", str(2 ** 32)):
        before = digest(workdir)
        proc = subprocess.run([sys.executable, "-m", "quantbench", "calibrate", "--seed", seed, "--no-progress"],
                              cwd=workdir, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == (f"quantbench calibrate: error: --seed {seed}: must be a whole number from 0 to "
                               "4294967295 (2**32 - 1)\n")
        assert digest(workdir) == before
