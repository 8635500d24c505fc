"""A worker SIGKILLed mid-run, then the run resumed: no fixture lost, none duplicated.

The worker is stopped at a known point with its test-only pause hook
(QUANTBENCH_TEST_PAUSE_AFTER / QUANTBENCH_TEST_PAUSE_FILE, see quantbench.worker),
never by hoping a model is slow enough: the test means the same on any machine.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from hosts_helpers import fixtures, matmul_model, variant
from quantbench.hosts.process import WORKER_PATH
from quantbench.store import partread
from quantbench.runs.runner import run_hosts

N = 12
K = 5  # results the worker sends before it pauses (and is killed)

SCRIPT = """
import json, sys
sys.path[:0] = [{tests!r}, {repo!r}]
from hosts_helpers import fixtures, variant
from quantbench.runs.runner import run_hosts
s = run_hosts(["x86"], [variant({model!r})], fixtures({n}), progress=False, tables_root={root!r}, jobs=1,
              raise_on_error=False)
print(json.dumps({{"ran": s.hosts[0].ran, "errors": s.errors}}))
"""


def _raw_rows(root):
    """Every row of every part, without the readers' de-duplication."""
    rows = []
    for p in partread.parts("outputs", root):
        rows.extend(pq.read_table(p, columns=["run_key", "host", "output_name", "fixture_id"]).to_pylist())
    return rows


def _children(pid):
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                out.append((int(d.name), cmd))
    return out


def _finish(proc) -> str:
    """The child run's stdout once it exits 0 (killed if it has not ended within 300 s)."""
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    return out


def _paused_run(workdir, model, root, go: Path):
    """The run in a child process whose worker pauses after K results; returns (proc, worker pid)."""
    tests_dir = str(Path(__file__).resolve().parents[1])
    code = SCRIPT.format(tests=tests_dir, repo=str(Path(tests_dir).parent), model=str(model), n=N, root=str(root))
    env = dict(os.environ, QUANTBENCH_TEST_PAUSE_AFTER=str(K), QUANTBENCH_TEST_PAUSE_FILE=str(go))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    paused = Path(f"{go}.paused")
    deadline = time.monotonic() + 600  # a bound on a hang, not a synchronisation
    while not paused.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before its worker paused: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the worker never paused")
        time.sleep(0.02)
    return proc, int(paused.read_text())


def test_killed_worker_then_resume(workdir):
    model = matmul_model(workdir / "m.onnx")
    root = workdir / "t"
    proc, pid = _paused_run(workdir, model, root, workdir / "go")
    try:
        workers = [p for p, cmd in _children(proc.pid) if WORKER_PATH.name in cmd]
        assert workers == [pid]
        os.kill(pid, signal.SIGKILL)  # paused after exactly K results: never resumed
    finally:
        out = _finish(proc)
    first = json.loads(out.strip().splitlines()[-1])
    assert first["ran"] == K, first
    assert len(first["errors"]) == 1
    e = first["errors"][0]
    assert "host x86" in e and "variant fp32" in e and "killed by signal 9" in e and "fixture " in e
    saved = {r["fixture_id"] for r in _raw_rows(root)}
    assert len(saved) == K  # every fixture the worker finished was kept

    again = run_hosts(["x86"], [variant(model)], fixtures(N), progress=False, tables_root=root, jobs=1)
    assert (again.hosts[0].cached, again.hosts[0].ran) == (K, N - K)
    rows = _raw_rows(root)
    keys = [(r["run_key"], r["host"], r["output_name"]) for r in rows]
    assert len(keys) == len(set(keys)) == 2 * N  # one row per fixture and output: none lost, none duplicated
    assert {r["fixture_id"] for r in rows} == {fx.fixture_id for fx in fixtures(N)}


def test_paused_worker_goes_on_when_released(workdir):
    """The hook itself: the paused worker resumes once the file exists, and the run completes."""
    model = matmul_model(workdir / "m.onnx")
    root = workdir / "t"
    go = workdir / "go"
    proc, _ = _paused_run(workdir, model, root, go)
    try:
        go.write_text("")
    finally:
        out = _finish(proc)
    assert json.loads(out.strip().splitlines()[-1]) == {"ran": N, "errors": []}
