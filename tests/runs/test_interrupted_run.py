"""Ctrl-C during a run: run_hosts stops every worker thread it started (the first workers' and the extra
ones a free slot granted) before it raises, so nothing writes into the tables after it returned."""

import threading

import pytest

from hosts_helpers import fixtures, matmul_model, variant
from quantbench.store import partread
from quantbench.runs import runner as R
from quantbench.runs.resultrows import Writer
from quantbench.runs.workerpool import HostWorkers
from quantbench.runs.runner import run_hosts
from quantbench.runs.scheduling import Scheduler


#: process.py's one spawner thread lives as long as the process once the first run made it: not a run's worker
SPAWNER = "worker-spawner"


def _worker_threads():
    return [t for t in threading.enumerate() if t.name.startswith("worker-") and not t.name.startswith(SPAWNER)]


def _new_live_threads(before: set) -> list:
    return [t.name for t in set(threading.enumerate()) - before if t.is_alive() and not t.name.startswith(SPAWNER)]


def test_ctrl_c_stops_the_extra_workers_before_run_hosts_raises(workdir, monkeypatch):
    model = matmul_model(workdir / "m.onnx", n=64, k=16)
    root = workdir / "t"
    extra_ran, interrupted = threading.Event(), threading.Event()
    real_add, real_rebalance, real_write = Writer.add, Scheduler.rebalance, R._write_inputs

    def add(self, rows):  # an extra worker has a finished result in hand
        real_add(self, rows)
        if threading.current_thread().name.startswith("worker-"):
            extra_ran.set()

    def rebalance(self):  # the user presses Ctrl-C once an extra worker ran something
        if threading.current_thread() is threading.main_thread() and extra_ran.is_set() and not interrupted.is_set():
            interrupted.set()
            raise KeyboardInterrupt
        real_rebalance(self)

    def write_inputs(ctx, preprocess):  # the fixtures table is still being written when Ctrl-C comes
        interrupted.wait()
        real_write(ctx, preprocess)

    monkeypatch.setattr(Writer, "add", add)
    monkeypatch.setattr(Scheduler, "rebalance", rebalance)
    monkeypatch.setattr(R, "_write_inputs", write_inputs)
    before = set(threading.enumerate())
    with pytest.raises(KeyboardInterrupt):
        run_hosts(["x86"], [variant(model)], fixtures(64, n=64), progress=False, tables_root=root, jobs=2)
    assert interrupted.is_set()
    assert [t for t in _worker_threads() if t not in before] == []
    assert _new_live_threads(before) == []
    parts = sorted(p.name for p in (root / "outputs").glob("*.parquet")) if (root / "outputs").exists() else []
    rows = partread.read("outputs", root=root, columns=["run_key"]).num_rows
    # the finished results were kept (the rerun resumes from them), all written before run_hosts raised
    assert rows > 0
    assert sorted(p.name for p in (root / "outputs").glob("*.parquet")) == parts


def test_a_worker_granted_as_ctrl_c_comes_never_outlives_run_hosts(workdir, monkeypatch):
    """A slot granted just before Ctrl-C (the grant was decided, the thread not yet started): no worker thread
    runs once run_hosts has raised (it used to start anyway and outlive run_hosts, writing a part later)."""
    model = matmul_model(workdir / "m.onnx", n=64, k=16)
    granting, released = threading.Event(), threading.Event()
    real_grant, real_rebalance, real_extra = R._HostRun.grant, Scheduler.rebalance, HostWorkers._extra_worker

    def rebalance(self):
        if threading.current_thread() is threading.main_thread():
            if granting.is_set():
                raise KeyboardInterrupt  # Ctrl-C while the host's thread is granting a worker
            return
        real_rebalance(self)

    def grant(self):
        granting.set()
        self.stop.wait()  # the grant completes after kill()
        real_grant(self)

    def extra_worker(self, req=None):
        released.wait()
        real_extra(self, req)

    monkeypatch.setattr(Scheduler, "rebalance", rebalance)
    monkeypatch.setattr(R._HostRun, "grant", grant)
    monkeypatch.setattr(HostWorkers, "_extra_worker", extra_worker)
    before = set(threading.enumerate())
    try:
        with pytest.raises(KeyboardInterrupt):
            run_hosts(["x86"], [variant(model)], fixtures(16, n=64), progress=False, tables_root=workdir / "t",
                      jobs=2)
        assert granting.is_set()
        assert _new_live_threads(before) == []
    finally:
        released.set()
