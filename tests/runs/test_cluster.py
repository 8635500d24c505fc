"""`--cluster ADDRESS`: the emulated hosts run on a real Dask distributed cluster (distributed.LocalCluster, two
worker processes); the tables are those of a local run, a worker killed mid-run is survived (Dask runs its task
again), a killed client resumes without recomputing what it wrote, and a cluster that cannot run the hosts is
refused in one line before any work. Ordering comes from the worker's test-only pause hook (worker.py), never
from timing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cli_helpers import digest, one_line
from quantbench.store import partread
from quantbench.cli import main
from quantbench.errors import UserError
from quantbench.runs import cluster as C
from quantbench.hosts import emulated as E
from quantbench.runs.runner import plan_run, run_plan
from quantbench.runs.scheduling import Scheduler
from quantbench.inputs.variantdir import resolve_variants
from setup_required import missing_setup

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
#: columns a run stamps on its rows (which invocation wrote them, when): everything else must match
STAMPS = ("run_id", "created_at")


def _local_cluster(tmp_path, workers: int = 2, threads: int = 1, **env):
    """A LocalCluster of two single-threaded worker processes (or `workers` x `threads`), `env` set in them (the
    pause hook); its scratch folder beside the working folder `tmp_path`, never in it."""
    try:
        from distributed import LocalCluster
    except ImportError:
        missing_setup("distributed is not installed (scripts/setup.sh installs quantbench[cluster])")
    _need_pi()
    return LocalCluster(n_workers=workers, threads_per_worker=threads, processes=True, dashboard_address=None,
                        local_directory=str(tmp_path.parent / f"{tmp_path.name}-dask"), env={k: str(v) for k, v in env.items()})


def _need_pi() -> None:
    ok, msg = E.ready("pi")
    if not ok:
        missing_setup(f"pi not set up: {msg}")


def _rows(root: Path, name: str) -> list:
    """Every row of table `name` but the run stamps, sorted: what two runs must agree on."""
    t = partread.read(name, root=root)
    t = t.drop([c for c in STAMPS if c in t.column_names])
    return sorted(repr(sorted(r.items())) for r in t.to_pylist())


def _same_tables(a: Path, b: Path, names) -> None:
    for name in names:
        ra, rb = _rows(a, name), _rows(b, name)
        assert ra and ra == rb, name


def _wait_for(path: Path, proc=None) -> None:
    """Until `path` exists (the pause hook's signal); a subprocess that ends first fails the test."""
    while not path.exists():
        assert proc is None or proc.poll() is None, proc.communicate()
        time.sleep(0.05)


def _demo_plan(hosts, limit=2):
    return plan_run(hosts, resolve_variants(None), limit=limit, command="run")


@pytest.fixture(scope="module")
def local_pi(tmp_path_factory):
    """The demo's pi run here (_demo_plan), once for the module: (its tables, its summary), what each cluster run
    of that plan must equal (the tests only read them; three local runs of it were the same run)."""
    _need_pi()
    root = tmp_path_factory.mktemp("local-pi")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)   # an empty working folder, as each test's: the demo's variants
        summary = run_plan(_demo_plan(["pi"]), progress=False, tables_root=root / "tables")
    return root / "tables", summary


def test_a_cluster_run_writes_the_tables_of_a_local_run(workdir, tmp_path):
    """equiv --hosts pi,x86 on the demo: pi on the cluster's two workers, x86 here; every table row for row."""
    args = ["equiv", "--hosts", "pi,x86", "--limit", "2", "--no-progress", "-q"]
    assert main(args + ["--results", "local"]) == 0
    with _local_cluster(tmp_path) as lc:
        assert main(args + ["--results", "cluster", "--cluster", lc.scheduler_address]) == 0
    _same_tables(workdir / "local" / "tables", workdir / "cluster" / "tables",
                 ("fixtures", "models", "hosts", "outputs", "classes", "decisions"))


def _kept_workers() -> list:
    """On a cluster worker: how each host worker it keeps came to be (Popen: started; _ForkedProcess: forked)."""
    return sorted(type(hs.client.proc).__name__ for idle in C._IDLE.values() for hs in idle)


def test_a_cluster_worker_with_two_threads_forks_its_second_host_worker(workdir, tmp_path, local_pi):
    """One cluster worker process with two threads (one machine, `dask worker --nthreads 2`): the host's second
    worker is forked from the first, and the rows are a local run's."""
    plan = _demo_plan(["pi"])
    with _local_cluster(tmp_path, workers=1, threads=2) as lc, C.connect_plan(lc.scheduler_address, plan) as cluster:
        s = run_plan(plan, progress=False, tables_root=workdir / "cluster", cluster=cluster)
        kept = cluster.client.run(_kept_workers)
    assert s.errors == [] and list(kept.values()) == [["Popen", "_ForkedProcess"]]
    _same_tables(local_pi[0], workdir / "cluster", ("hosts", "outputs"))


def test_a_cluster_worker_killed_mid_run_is_survived(workdir, tmp_path, local_pi):
    """Each emulated worker pauses after its first result; one cluster worker process is then killed with its
    task in flight, and Dask runs that task again: every result arrives once, the same as a local run's."""
    pause = tmp_path / "go"
    plan, (local_root, local) = _demo_plan(["pi"]), local_pi
    with _local_cluster(tmp_path, QUANTBENCH_TEST_PAUSE_AFTER=1, QUANTBENCH_TEST_PAUSE_FILE=pause) as lc, \
            C.connect_plan(lc.scheduler_address, plan) as cluster:
        before = set(cluster.client.run(os.getpid).values())
        out = {}
        th = threading.Thread(target=lambda: out.update(s=run_plan(plan, progress=False, raise_on_error=False,
                                                                   tables_root=workdir / "cluster", cluster=cluster)))
        th.start()
        try:
            _wait_for(Path(f"{pause}.paused"))
            qemu = int(Path(f"{pause}.paused").read_text())
            dask_worker = int(Path(f"/proc/{qemu}/stat").read_text().rsplit(")", 1)[1].split()[1])
            assert dask_worker in before
            os.kill(dask_worker, signal.SIGKILL)
        finally:
            pause.write_text("")
            th.join()
        s = out["s"]
        assert s.errors == []
    pi, pi_local = s.hosts[0], local.hosts[0]
    assert (pi.ran, pi.cached, pi.fingerprint_id) == (pi_local.ran, 0, pi_local.fingerprint_id)
    _same_tables(local_root, workdir / "cluster", ("hosts", "outputs"))


def test_a_killed_client_resumes_without_running_again_what_it_wrote(workdir, tmp_path, local_pi):
    """The client (a `quantbench run --cluster` process) is killed once a task's results are in the tables; the
    rerun submits only the tasks whose results are missing."""
    pause, root = tmp_path / "go", workdir / "t"
    with _local_cluster(tmp_path, QUANTBENCH_TEST_PAUSE_AFTER=2, QUANTBENCH_TEST_PAUSE_FILE=pause) as lc:
        cmd = [sys.executable, "-m", "quantbench", "run", "--hosts", "pi", "--limit", "2", "--no-progress",
               "--tables", str(root), "--cluster", lc.scheduler_address]
        proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            _wait_for(Path(f"{pause}.paused"), proc)  # a worker ran its first task and paused in its second
            while not (root / "outputs").exists() or partread.read("outputs", root=root).num_rows == 0:
                assert proc.poll() is None
                time.sleep(0.05)
            proc.kill()
            proc.wait()
        finally:
            pause.write_text("")
            if proc.poll() is None:
                proc.kill()
        written = {(r["variant_id"], r["fixture_id"]) for r in partread.read("outputs", root=root).to_pylist()}
        plan = _demo_plan(["pi"])
        total = sum(len(f) for f in plan.fixtures_for.values())
        assert 0 < len(written) < total
        with C.connect_plan(lc.scheduler_address, plan) as cluster:
            s = run_plan(plan, progress=False, tables_root=root, cluster=cluster)
            assert (s.hosts[0].cached, s.hosts[0].ran) == (len(written), total - len(written))
            assert cluster.submitted == total - len(written)  # one fixture per task here
    local_root, local = local_pi
    _same_tables(local_root, root, ("hosts", "outputs"))
    assert local.hosts[0].ran == total


def test_ctrl_c_during_a_cluster_run_cancels_its_tasks_and_writes_nothing_after(workdir, tmp_path, monkeypatch):
    """Ctrl-C while the cluster's emulated workers are mid-task: run_plan raises once the host's thread ended
    (its tasks cancelled), and nothing is written after it, not even when the paused tasks then finish."""
    from quantbench.runs import runner as R

    pause, root = tmp_path / "go", workdir / "t"
    real_rebalance = Scheduler.rebalance

    def rebalance(self):  # the user presses Ctrl-C once a cluster worker is paused in a task
        if threading.current_thread() is threading.main_thread() and Path(f"{pause}.paused").exists():
            raise KeyboardInterrupt
        real_rebalance(self)

    plan = _demo_plan(["pi"])
    with _local_cluster(tmp_path, QUANTBENCH_TEST_PAUSE_AFTER=1, QUANTBENCH_TEST_PAUSE_FILE=pause) as lc, \
            C.connect_plan(lc.scheduler_address, plan) as cluster:
        monkeypatch.setattr(Scheduler, "rebalance", rebalance)
        before = set(threading.enumerate())
        try:
            with pytest.raises(KeyboardInterrupt):
                run_plan(plan, progress=False, tables_root=root, cluster=cluster)
            left = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
            assert [n for n in left if not n.startswith("Dask-")] == []  # (Dask's own pools live with its client)
            parts = sorted(p.name for p in (root / "outputs").glob("*.parquet"))
        finally:
            pause.write_text("")
        total = sum(len(f) for f in plan.fixtures_for.values())
        assert cluster.submitted == total  # one fixture per task, all cancelled before any finished
        while any(cluster.client.processing().values()):  # the paused tasks end (their results unused)
            time.sleep(0.05)
    assert sorted(p.name for p in (root / "outputs").glob("*.parquet")) == parts == []


def _another_machine() -> None:
    """On one cluster worker: stand for a machine whose CPU differs (two such machines cannot exist here), so
    the host's fingerprint taken there differs."""
    real = C.fingerprint

    def fingerprint(spec, session, allow_fallback):
        fp, fid = real(spec, session, allow_fallback)
        return fp, "f" * 64

    C.fingerprint = fingerprint


def test_cluster_machines_that_differ_are_not_one_host(workdir, tmp_path):
    """A host whose fingerprint differs between two cluster workers is refused before any of its tasks runs."""
    plan = _demo_plan(["pi"], limit=1)
    with _local_cluster(tmp_path) as lc, C.connect_plan(lc.scheduler_address, plan) as cluster:
        cluster.client.run(_another_machine, workers=sorted(cluster.workers)[1:])
        s = run_plan(plan, progress=False, raise_on_error=False, tables_root=workdir / "t", cluster=cluster)
        assert cluster.submitted == 0
    (error,) = s.errors
    a, b = sorted(cluster.workers)
    assert error.startswith(f"host pi: cluster workers {a} and {b} report different fingerprints (")
    assert error.endswith("the machines differ, so they cannot run one host: start the cluster on identical "
                          "machines or run the host elsewhere")
    assert s.hosts[0].ran == 0 and not (workdir / "t" / "outputs").exists()


def _refused(workdir, capsys, address: str) -> str:
    before = digest(workdir, skip_lock=False)
    rc = main(["run", "--hosts", "pi,x86", "--limit", "1", "--no-progress", "--cluster", address])
    assert rc == 2
    assert digest(workdir, skip_lock=False) == before  # nothing written, not even the lock
    return one_line(capsys.readouterr().err, "run")


def test_an_unreachable_cluster_is_one_line_before_any_work(workdir, capsys):
    ok, msg = E.ready("pi")
    if not ok:
        missing_setup(f"pi not set up: {msg}")
    line = _refused(workdir, capsys, "tcp://127.0.0.1:9")
    assert "cluster tcp://127.0.0.1:9: cannot reach the scheduler" in line


def test_a_worker_without_the_emulated_setup_is_one_line_before_any_work(workdir, tmp_path, capsys):
    with _local_cluster(tmp_path, QUANTBENCH_HOME=tmp_path.parent / f"{tmp_path.name}-empty-home") as lc:
        line = _refused(workdir, capsys, lc.scheduler_address)
    assert f"cluster {lc.scheduler_address}: worker tcp://" in line and ": host pi: " in line
    assert "quantbench hosts setup pi" in line


def test_a_worker_of_another_version_is_refused():
    """What a worker reports (facts) against this client's: another onnxruntime or quantbench is one line."""
    mine = C.facts()
    for what in ("onnxruntime", "quantbench"):
        theirs = dict(mine, **{what: "0.0.1"})
        with pytest.raises(UserError) as exc:
            C._check_workers("tcp://s:8786", {"tcp://w:1": theirs}, mine)
        assert str(exc.value) == (f"cluster tcp://s:8786: worker tcp://w:1 runs {what} 0.0.1, this client "
                                  f"{mine[what]}; install the same version on every machine")
    theirs = dict(mine, worker="0" * 64)
    with pytest.raises(UserError, match="another quantbench worker code"):
        C._check_workers("tcp://s:8786", {"tcp://w:1": theirs}, mine)
