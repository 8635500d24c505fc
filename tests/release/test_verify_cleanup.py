"""Ctrl-C in `quantbench verify --host`: exit 130 with one line, no verdict printed; the re-run's tables
live in the results folder's staging area (never the system temp folder), which the next verify cleans."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from quantbench.cli import main

from release_helpers import release

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import signal, sys
# Ctrl-C raises KeyboardInterrupt even when the test runs as a background job (SIGINT ignored at start)
signal.signal(signal.SIGINT, signal.default_int_handler)
from quantbench.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _wait_until_paused(paused: Path, proc) -> None:
    """Until the worker made `paused` (the bound is on a hang, not a synchronisation)."""
    deadline = time.monotonic() + 300
    while not paused.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no worker paused (verify {'ended' if proc.poll() is not None else 'hangs'})")
        time.sleep(0.02)


def test_ctrl_c_in_verify_host_exits_130_in_one_line_and_leaves_nothing(results, tmp_path, capsys):
    assert release(results, "v1", "--archive") == 0
    capsys.readouterr()
    for target in (results / "releases" / "v1", results / "releases" / "v1.tar.gz"):
        tmp = tmp_path / f"systemp-{target.name}"
        tmp.mkdir()
        go = tmp_path / f"go-{target.name}"
        env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
                   QUANTBENCH_TEST_PAUSE_AFTER="1",
                   QUANTBENCH_TEST_PAUSE_FILE=str(go))
        # (--results: the default, results/ in the current folder, which the fixture made results' parent)
        proc = subprocess.Popen([sys.executable, "-c", SCRIPT, "verify", str(target), "--host", "x86", "--sample", "3"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _wait_until_paused(Path(f"{go}.paused"), proc)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=300)
        finally:
            go.write_text("")
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 130, (out, err)
        assert err.strip().splitlines() == ["quantbench verify: interrupted; finished results are kept, rerun to resume"]
        assert "PASS" not in out and "FAIL" not in out
        assert not list(tmp.iterdir())
        # what a straggling host thread may still write as the process ends lies in this run's own folder ...
        staging = results / ".staging"
        left = {p.relative_to(staging).parts[0] for p in staging.rglob("*")} if staging.exists() else set()
        assert left <= {n for n in left if n.startswith(f".verify.{proc.pid}@")}, left
        # ... which the next verify removes (its process is gone)
        assert main(["verify", str(results / "releases" / "v1.tar.gz")]) == 0
        assert not list(staging.rglob("*"))
