"""Extra workers forked from a host's warm first worker (worker.py "fork", WorkerConnection.fork).

A forked worker must be indistinguishable from a started one: same fingerprint, the
same bytes out; it must let go of its parent's pipes, and die with the run on an
interrupt. The emulated tests use the real qemu host `pi` (a fork there copies
qemu's translated code, which is the point); ordering comes from the worker's
test-only pause hook, never from timing.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hosts_helpers import fixtures, matmul_model, variant
from quantbench.hosts import emulated as E
from quantbench.store import hostresults
from quantbench.hosts.keys import normalize_session
from quantbench.hosts.registry import HostSpec
from quantbench.runs.runner import run_hosts
from quantbench.hosts.workerclient import WorkerClient
from setup_required import missing_setup

PI = HostSpec("pi", "emulated", {"preset": "pi"})


def _need_pi():
    ok, msg = E.ready("pi")
    if not ok:
        missing_setup(f"pi not set up: {msg}")


def _stat(pid: int):
    """(state, ppid, session id) of a process, or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1]), int(fields[3])


def _running(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def _outputs(res):
    return [{name: (o["sha256"], o["dtype"], o["shape"], o["array"].tobytes()) for name, o in r["outputs"].items()}
            for r in res]


@pytest.mark.slow
def test_forked_emulated_worker_is_indistinguishable_from_a_started_one(tmp_path):
    _need_pi()
    model = matmul_model(tmp_path / "m.onnx", n=64, k=16).read_bytes()
    fxs = fixtures(4, n=64)
    sess = normalize_session(None)
    origin = WorkerClient(PI, sess).open()
    started = WorkerClient(PI, sess).open()
    try:
        child = origin.fork().open()
        try:
            pid = child.client.pid
            assert pid not in (origin.client.pid, started.client.pid)
            # forked, not started: the first worker is its parent; it runs in a session of its own
            state, ppid, sid = _stat(pid)
            assert ppid == origin.client.pid and sid == pid
            assert child.fingerprint_id == started.fingerprint_id == origin.fingerprint_id
            assert child.fingerprint["identity"] == started.fingerprint["identity"]
            want = started.run(model, fxs, return_tensors=True)
            assert _outputs(child.run(model, fxs, return_tensors=True)) == _outputs(want)
            # the child let go of its parent's pipes: the first worker ends cleanly (its stdout and
            # stderr reach end of file) while the child goes on answering
            origin.close()
            assert origin.client.proc.returncode == 0 and not origin.client._drain.is_alive()
            assert _outputs(child.run(model, fxs[:1], return_tensors=True)) == _outputs(want[:1])
        finally:
            child.close()
        assert not _running(pid)
    finally:
        origin.kill()
        started.close()


@pytest.mark.slow
def test_a_free_slot_forks_the_emulated_hosts_first_worker(workdir, monkeypatch):
    """One host, two slots: the second worker is forked before the first runs anything, and the
    results are those of a single started worker, byte for byte."""
    from quantbench.runs import taskloop

    _need_pi()
    model = matmul_model(workdir / "m.onnx", n=64, k=16)
    fxs = fixtures(8, n=64)
    jobs = []
    real_job = taskloop.task_request
    monkeypatch.setattr(taskloop, "task_request",
                        lambda host, ctx, vi, f, **kw: jobs.append(real_job(host, ctx, vi, f, **kw)) or jobs[-1])
    one1 = {"intra_op_num_threads": 1}  # one-thread workers: two fit two slots (the Pi's deployed 4 take both)
    one = run_hosts([PI], [variant(model)], fxs, progress=False, tables_root=workdir / "one", jobs=1,
                    session=one1).hosts[0]
    two = run_hosts([PI], [variant(model)], fxs, progress=False, tables_root=workdir / "two", jobs=2,
                    session=one1).hosts[0]
    assert (one.workers, one.forked) == (1, 0)
    assert (two.workers, two.forked, two.ran, two.errors) == (2, 1, 8, [])
    assert two.fingerprint_id == one.fingerprint_id

    def rows(root):
        t = hostresults.load_outputs(host="pi", tables_root=root).to_pylist()
        return sorted((r["run_key"], r["output_name"], r["sha256"], r["tensor"]) for r in t)

    assert rows(workdir / "two") == rows(workdir / "one") and len(rows(workdir / "one")) == 16
    # the emulated workers map the run's input store (each input verified once per worker): a job carries
    # the model bytes only
    assert jobs and all(h.get("store") and len(parts) == 1 for h, parts in jobs)


SCRIPT = """
import signal, sys
# Ctrl-C must raise KeyboardInterrupt even when this test runs as a shell's background job
# (which starts with SIGINT ignored: Python then installs no handler of its own)
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path[:0] = [{tests!r}, {repo!r}]
from hosts_helpers import fixtures, matmul_model, variant
from quantbench.hosts.registry import HostSpec
from quantbench.runs.runner import run_hosts
run_hosts([HostSpec("pi", "emulated", {{"preset": "pi"}})], [variant({model!r})], fixtures(8, n=64),
          progress=False, tables_root={root!r}, jobs=2, session={{"intra_op_num_threads": 1}})
"""


def _descendants(pid: int) -> dict:
    """{pid: parent pid} of every process below `pid`."""
    parents = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            st = _stat(int(d.name))
            if st is not None:
                parents[int(d.name)] = st[1]
    out, todo = {}, [pid]
    while todo:
        p = todo.pop()
        for child, parent in parents.items():
            if parent == p:
                out[child] = p
                todo.append(child)
    return out


@pytest.mark.slow
def test_an_interrupt_kills_forked_workers(workdir):
    """Ctrl-C while a first worker and the worker forked from it are both paused: both are killed."""
    _need_pi()
    tests_dir = str(Path(__file__).resolve().parents[1])
    model = matmul_model(workdir / "m.onnx", n=64, k=16)
    code = SCRIPT.format(tests=tests_dir, repo=str(Path(tests_dir).parent), model=str(model),
                         root=str(workdir / "t"))
    go = workdir / "go"
    env = dict(os.environ, QUANTBENCH_TEST_PAUSE_AFTER="1", QUANTBENCH_TEST_PAUSE_FILE=str(go))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    workers = {}
    try:
        deadline = time.monotonic() + 600  # a bound on a hang, not a synchronisation
        while not Path(f"{go}.paused").exists():
            assert proc.poll() is None, f"the run ended before a worker paused: {proc.communicate()}"
            assert time.monotonic() < deadline, "no worker paused"
            time.sleep(0.02)
        # A worker has run a fixture, so the fork (served before the first worker's first task) is done.
        workers = {p: parent for p, parent in _descendants(proc.pid).items() if _running(p)}
        first = [p for p, parent in workers.items() if parent == proc.pid]
        assert len(first) == 1, workers
        forked = [p for p, parent in workers.items() if parent == first[0]]
        assert len(forked) == 1, workers
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode != 0 and "KeyboardInterrupt" in err
        deadline = time.monotonic() + 60
        while any(_running(p) for p in first + forked) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [p for p in first + forked if _running(p)]
    finally:
        go.write_text("")  # a worker left behind by a failure goes on, and ends with its run
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for p in workers:
            if _running(p):
                os.kill(p, signal.SIGKILL)


def test_a_local_forked_worker_serves_and_ends(tmp_path):
    """The fast path of the same protocol on this machine's interpreter: fork, fingerprint, run, end."""
    from quantbench.hosts.registry import resolve_hosts

    model = matmul_model(tmp_path / "m.onnx").read_bytes()
    fxs = fixtures(3)
    origin = WorkerClient(resolve_hosts(["x86"], None)[0], normalize_session(None)).open()
    try:
        want = _outputs(origin.run(model, fxs, return_tensors=True))
        child = origin.fork()
        assert child.fingerprint is None  # forked, not yet fingerprinted: open() does it
        child.open()
        assert child.fingerprint_id == origin.fingerprint_id
        assert _outputs(child.run(model, fxs, return_tensors=True)) == want
        pid = child.client.pid
        child.kill()
        assert child.client.proc.returncode == -signal.SIGKILL
        assert child.client.proc.wait(timeout=10) == -signal.SIGKILL and not _running(pid)
        # the first worker goes on, and forks again
        again = origin.fork().open()
        assert _outputs(again.run(model, fxs, return_tensors=True)) == want
        again.close()
        assert again.client.proc.wait(timeout=10) is None  # its exit status went to the first worker
    finally:
        origin.close()
    assert not _running(again.client.pid)
