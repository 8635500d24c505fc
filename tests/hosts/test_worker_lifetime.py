"""A worker never outlives the command that started it, and never starts more threads than its host has cores.

Was: `run --threads 100000` never finished (onnxruntime starting every thread, the worker growing 40 MB/s), and
a SIGTERM or SIGKILL of the command left that worker running with PPID 1. Now the thread count is refused before
anything starts (one line naming the host, the value and the limit: the cores, as --jobs is capped), and each
worker asks the kernel to kill it when its parent dies (worker.die_with_parent); the workers that are not the
command's children (forked from another worker, or remote over ssh) end when their input closes in the middle of a
job (worker.InputWatch). The kill tests pause the worker
at a known point (QUANTBENCH_TEST_PAUSE_AFTER / _FILE) before they signal the command: no timing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import digest, one_line
from hosts_helpers import make_corpus, need_cores
from run_helpers import variants_folder
from quantbench.hosts.deploy import usable_cores
from setup_required import missing_setup, need_tier


@pytest.fixture
def bench(workdir):
    vdir, labels = variants_folder(workdir / "v"), make_corpus(workdir / "corpus")
    return workdir, ["run", "--variants", vdir, "--fixtures", labels, "--no-progress", "--jobs", "1"]


def _quantbench(args, cwd, env=None, **kw):
    return subprocess.Popen([sys.executable, "-m", "quantbench", *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, **kw)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("where", ["flag", "hosts file"])
def test_more_threads_than_cores_is_refused_before_anything_starts(bench, where):
    wd, args = bench
    cores = usable_cores()
    if where == "flag":
        args = [*args, "--hosts", "x86", "--threads", 100000]
        host = "x86"
    else:
        (wd / "h.toml").write_text('big = { kind = "local", intra_op_num_threads = 100000 }\n')
        args = [*args, "--hosts", "big", "--hosts-file", wd / "h.toml"]
        host = "big"
    before = digest(wd)
    proc = _quantbench(args, wd)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    assert one_line(err, "run") == (f"quantbench run: error: host {host}: intra_op_num_threads=100000: more than the "
                                    f"{cores} cores it runs on; use at most {cores}")
    assert digest(wd) == before


def test_an_emulated_device_keeps_its_own_thread_count():
    """A Pi 5 runs 4 intra-op threads wherever it is emulated, also on fewer cores: only more than both is refused."""
    from quantbench.hosts.registry import parse_hosts

    (req,) = parse_hosts("pi")
    assert req.session["intra_op_num_threads"] == 4
    limit = max(4, usable_cores())
    with pytest.raises(Exception, match=f"more than the {limit} cores it runs on"):
        parse_hosts(f"pi+intra_op_num_threads={limit + 1}")


def _paused_worker(cwd, args, go: Path, timeout: float = 600):
    """The command started with its worker paused after one result: (process, worker pid)."""
    env = dict(os.environ, QUANTBENCH_TEST_PAUSE_AFTER="1", QUANTBENCH_TEST_PAUSE_FILE=str(go))
    proc = _quantbench(args, cwd, env=env)
    deadline = time.monotonic() + timeout  # a bound on a hang, not a synchronisation
    paused = Path(f"{go}.paused")
    while not paused.exists():
        assert proc.poll() is None, f"the run ended before its worker paused: {proc.communicate()}"
        assert time.monotonic() < deadline, "no worker paused"
        time.sleep(0.02)
    return proc, int(paused.read_text().strip())


def _assert_worker_dies_with(cwd, args, sig, go):
    proc, worker = _paused_worker(cwd, args, go)
    try:
        assert _running(worker)
        proc.send_signal(sig)
        proc.communicate(timeout=300)
        deadline = time.monotonic() + 60  # the kernel kills it at once; this bounds a failure
        while _running(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(worker), f"worker {worker} outlived its command ({sig.name})"
    finally:
        go.write_text("")  # a worker left behind by a failure goes on and ends
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if _running(worker):
            os.kill(worker, signal.SIGKILL)


def test_a_worker_opened_by_a_thread_that_ended_lives_on():
    """The kernel counts the thread that started a worker as its parent: workers are started from the main thread
    or one lasting thread (process.spawn), so a worker a pool thread opened outlives that thread (was: localize's
    second host "killed by signal 9 while receiving its job")."""
    import threading

    from quantbench.hosts.registry import parse_hosts
    from quantbench.hosts.workerclient import WorkerClient

    (req,) = parse_hosts("x86")
    box = []
    th = threading.Thread(target=lambda: box.append(WorkerClient(req.spec, req.session).open()))
    th.start()
    th.join()
    (hs,) = box   # fingerprinted: the worker ran its prctl before the thread ended
    proc = hs.client.proc
    hs.close()
    assert proc.returncode == 0   # it read "end" and left; -9 had it died with the thread


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_local_worker_dies_with_its_command(bench, sig):
    wd, args = bench
    _assert_worker_dies_with(wd, [*args, "--hosts", "x86"], sig, wd / "go")


@pytest.mark.slow
@pytest.mark.parametrize("host", ["pi", "x86-avx2"])
def test_an_emulated_or_masked_worker_dies_with_its_command(bench, host):
    """Under qemu-user the prctl reaches the kernel for the qemu process, the command's own child."""
    from quantbench.hosts.registry import make_host, resolve_hosts

    (spec,) = resolve_hosts([host])
    ok, msg = make_host(spec).ready()
    if not ok:
        missing_setup(f"{host} not set up: {msg}")
    wd, args = bench
    _assert_worker_dies_with(wd, [*args, "--hosts", host], signal.SIGKILL, wd / "go")


def _processes_with(marker: str) -> set:
    """The running processes whose environment holds `marker` (one run's: its workers inherit it, forked or not)."""
    out = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in env and _running(int(d.name)):
            out.add(int(d.name))
    return out


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _paused_pids(go: Path, n: int, proc, timeout: float = 600) -> set:
    """The pids of the first `n` workers that paused (the hook's PATH.paused.PID files)."""
    deadline = time.monotonic() + timeout  # a bound on a hang, not a synchronisation
    while True:
        pids = {int(p.name.rsplit(".", 1)[1]) for p in go.parent.glob(go.name + ".paused.*")
                if p.name.rsplit(".", 1)[1].isdigit()}
        if len(pids) >= n:
            return pids
        assert proc.poll() is None, f"the run ended before {n} workers paused: {proc.communicate()}"
        assert time.monotonic() < deadline, f"{len(pids)} of {n} workers paused"
        time.sleep(0.02)


def _ready_host(host: str) -> None:
    from quantbench.hosts.registry import make_host, resolve_hosts

    if host.startswith("x86-"):
        need_tier(host)
    (spec,) = resolve_hosts([host])
    ok, msg = make_host(spec).ready()
    if not ok:
        missing_setup(f"{host} not set up: {msg}")


def _run_dies_with_its_command(workdir, args, workers: int, check=None) -> None:
    """Start `run ... args --jobs 2` with its workers paused after one result; once `workers` have paused (and
    `check(command pid, paused pids)` held), SIGKILL the command: no process of the run (its workers inherit the
    pause variables: the marker) may be left."""
    vdir, labels = variants_folder(workdir / "v"), make_corpus(workdir / "corpus", count=4)
    go = workdir / "go"
    env = dict(os.environ, QUANTBENCH_TEST_PAUSE_AFTER="1", QUANTBENCH_TEST_PAUSE_FILE=str(go))
    marker = f"QUANTBENCH_TEST_PAUSE_FILE={go}"
    proc = _quantbench(["run", "--variants", vdir, "--fixtures", labels, "--no-progress", "--jobs", "2",
                        "--threads", "1", *args], workdir, env=env)
    try:
        paused = _paused_pids(go, workers, proc)
        assert paused <= _processes_with(marker)
        if check is not None:
            check(proc.pid, paused)
        proc.kill()
        proc.communicate(timeout=300)
        deadline = time.monotonic() + 60  # a bound on a failure (an ssh master lingers ControlPersist=10 s)
        while _processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _processes_with(marker), f"processes of the run outlived its command ({args})"
    finally:
        go.write_text("")  # a worker left behind by a failure goes on and ends
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for p in _processes_with(marker):
            os.kill(p, signal.SIGKILL)


def _one_started_one_forked(command: int, paused: set) -> None:
    first = [p for p in paused if _ppid(p) == command]
    assert len(first) == 1 and [_ppid(p) for p in paused - set(first)] == first


@pytest.mark.parametrize("host", ["x86", pytest.param("pi", marks=pytest.mark.slow),
                                  pytest.param("x86-avx2", marks=pytest.mark.slow)])
def test_forked_workers_die_with_their_command(workdir, host):
    """--jobs 2 on one host: the second worker is forked from the first, so its parent is that worker, not the
    command, and a fork clears the parent-death signal. A SIGKILL of the command while both workers are paused
    leaves no process of the run (was: the forked worker lived on, paused or busy, with PPID 1)."""
    need_cores(2)
    _ready_host(host)
    _run_dies_with_its_command(workdir, ["--hosts", host], 2, _one_started_one_forked)


def test_remote_workers_die_when_the_command_is_killed(workdir, sshd):
    """An ssh host's workers run on the remote, children of its sshd, out of reach of this machine's kernel: when
    the command is killed (or the connection drops) their input ends, and a worker whose input ends in the middle
    of a job ends at once (was: a paused or busy remote worker ran on, and its ssh client waited for it)."""
    d = sshd.parent
    (workdir / "h.toml").write_text(
        f'far = {{ kind = "ssh", address = "qbtest", python = "{sys.executable}", '
        f'ssh_options = ["-F", "{d}/ssh_config", "-o", "SendEnv=QUANTBENCH_TEST_PAUSE_*"] }}\n')
    _run_dies_with_its_command(workdir, ["--hosts", "far", "--hosts-file", workdir / "h.toml"],
                               min(2, os.cpu_count() or 1))


def test_a_remote_worker_dies_when_its_connection_drops(workdir, sshd):
    """The connection drops while the remote worker is paused (every ssh process of the run killed, the shared
    master included; the command lives on): the remote worker ends with it (its sshd session ends, which its
    parent-death signal follows, and its input ends, which InputWatch follows: either alone suffices here)."""
    d = sshd.parent
    (workdir / "h.toml").write_text(
        f'far = {{ kind = "ssh", address = "qbtest", python = "{sys.executable}", '
        f'ssh_options = ["-F", "{d}/ssh_config", "-o", "SendEnv=QUANTBENCH_TEST_PAUSE_*"] }}\n')
    vdir, labels = variants_folder(workdir / "v"), make_corpus(workdir / "corpus", count=2)
    go = workdir / "go"
    env = dict(os.environ, QUANTBENCH_TEST_PAUSE_AFTER="1", QUANTBENCH_TEST_PAUSE_FILE=str(go))
    marker = f"QUANTBENCH_TEST_PAUSE_FILE={go}"
    proc = _quantbench(["run", "--variants", vdir, "--fixtures", labels, "--no-progress", "--jobs", "1",
                        "--hosts", "far", "--hosts-file", workdir / "h.toml"], workdir, env=env)
    try:
        (remote,) = _paused_pids(go, 1, proc)
        ssh = {p for p in _processes_with(marker) if Path(f"/proc/{p}/exe").resolve().name == "ssh"}
        assert ssh and remote not in ssh
        for p in ssh:
            os.kill(p, signal.SIGKILL)
        deadline = time.monotonic() + 60  # sshd closes the session's input at once; this bounds a failure
        while _running(remote) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(remote), "the remote worker outlived its connection"
    finally:
        go.write_text("")
        try:
            proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
            for p in _processes_with(marker):
                os.kill(p, signal.SIGKILL)
