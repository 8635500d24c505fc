"""A worker SIGKILLed mid-run, then the run resumed: no fixture lost, none duplicated."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from hosts_helpers import fixtures, slow_model, variant
from quantbench import tables
from quantbench.hosts.runner import run_hosts

N = 12

SCRIPT = """
import json, sys
sys.path[:0] = [{tests!r}, {repo!r}]
from hosts_helpers import fixtures, variant
from quantbench.hosts.runner import run_hosts
s = run_hosts(["x86"], [variant({model!r})], fixtures({n}), progress=False, tables_root={root!r}, jobs=1,
              raise_on_error=False)
print(json.dumps({{"ran": s.hosts[0].ran, "errors": s.errors}}))
"""


def _raw_rows(root):
    """Every row of every part, without the readers' de-duplication."""
    rows = []
    for p in tables.parts("outputs", root):
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


def test_killed_worker_then_resume(workdir):
    model = slow_model(workdir / "slow.onnx", rows=2048, layers=64)  # ~0.5 s per fixture on a fast AVX-512 core
    root = workdir / "t"
    tests_dir = str(Path(__file__).resolve().parent)
    code = SCRIPT.format(tests=tests_dir, repo=str(Path(tests_dir).parent), model=str(model), n=N, root=str(root))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while not tables.parts("outputs", root):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no results appeared"
            time.sleep(0.05)
        workers = [pid for pid, cmd in _children(proc.pid) if "worker.py" in cmd]
        assert len(workers) == 1
        os.kill(workers[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    first = json.loads(out.strip().splitlines()[-1])
    assert 1 <= first["ran"] < N, first
    assert len(first["errors"]) == 1
    e = first["errors"][0]
    assert "host x86" in e and "variant fp32" in e and "killed by signal 9" in e and "fixture " in e
    saved = {r["fixture_id"] for r in _raw_rows(root)}
    assert len(saved) == first["ran"]  # every fixture the worker finished was kept

    again = run_hosts(["x86"], [variant(model)], fixtures(N), progress=False, tables_root=root, jobs=1)
    assert (again.hosts[0].cached, again.hosts[0].ran) == (first["ran"], N - first["ran"])
    rows = _raw_rows(root)
    keys = [(r["run_key"], r["host"], r["output_name"]) for r in rows]
    assert len(keys) == len(set(keys)) == N  # one output per fixture: none lost, none duplicated
    assert {r["fixture_id"] for r in rows} == {fx.fixture_id for fx in fixtures(N)}
