"""A reader that stops early (`quantbench config | head -1`) closes quantbench's stdout: the command stops quietly
with SIGPIPE's exit code (141), never a BrokenPipeError traceback."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_closed_stdout_is_a_quiet_exit_141(tmp_path):
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first line: deterministic, whatever the output's size
    try:
        p = subprocess.run([sys.executable, "-m", "quantbench", "config"], stdout=write, stderr=subprocess.PIPE,
                           text=True, cwd=tmp_path, timeout=120)
    finally:
        os.close(write)
    assert p.returncode == 141, p.stderr
    assert p.stderr == ""
    assert list(tmp_path.iterdir()) == []
