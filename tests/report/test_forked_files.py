"""quantbench.report.forkedfiles: jobs shared by a forked child and this process, each done once."""

import os

import pytest

from quantbench.report.forkedfiles import MAX_JOBS, Ahead


def _log_job(log, i, signal_w=None):
    def job():
        with open(log, "a") as fh:
            fh.write(f"{i} {os.getpid()}\n")
        if signal_w is not None:
            os.write(signal_w, b"x")   # tells the parent the child has done this job
    return job


def _done(log):
    rows = [ln.split() for ln in log.read_text().splitlines()]
    return sorted(int(i) for i, _ in rows), {int(i): int(p) for i, p in rows}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_the_child_starts_at_once_and_the_parent_finishes_every_job_left_each_once(tmp_path):
    log = tmp_path / "log"
    r, w = os.pipe()
    jobs = [_log_job(log, 0, signal_w=w)] + [_log_job(log, i) for i in range(1, 40)]
    ahead = Ahead(jobs)
    os.close(w)
    assert os.read(r, 1) == b"x"   # job 0 was taken and done by the child, before the parent joined in
    os.close(r)
    ahead.finish()
    order, by = _done(log)
    assert order == list(range(40))   # every job once: none twice, none left out
    assert by[0] != os.getpid()
    assert ahead.close() is False      # finished: no child left


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_failing_child_leaves_only_the_job_it_failed_undone(tmp_path):
    log = tmp_path / "log"
    parent = os.getpid()

    def fails_in_child():
        if os.getpid() != parent:
            raise RuntimeError("child")
        _log_job(log, 0)()

    ahead = Ahead([fails_in_child] + [_log_job(log, i) for i in range(1, 10)])
    ahead.finish()   # the child dies on job 0 (if it took it first): the parent does every job it did not take
    order, _ = _done(log)
    assert order[-9:] == list(range(1, 10)) and order.count(0) <= 1


def test_without_fork_nothing_runs_until_the_caller_does_it(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "fork")
    log = tmp_path / "log"
    ahead = Ahead([_log_job(log, 0)])
    ahead.finish()
    assert not log.exists() and ahead.close() is False   # the caller makes every file itself, as without a child


def test_at_most_max_jobs():
    with pytest.raises(ValueError):
        Ahead([print] * (MAX_JOBS + 1))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_stuck_child_is_killed_and_its_job_left_to_the_parent(tmp_path):
    """A child that never returns from its job (as one stuck on a lock held at the fork would) does not
    hold the parent: after the grace it is killed, reported as not having done its jobs."""
    log = tmp_path / "log"
    parent = os.getpid()
    started_r, started_w = os.pipe()
    never_r, never_w = os.pipe()

    def blocks_in_child():
        if os.getpid() != parent:
            os.write(started_w, b"x")
            os.read(never_r, 1)   # nobody writes: blocked for good
        _log_job(log, 0)()

    ahead = Ahead([blocks_in_child] + [_log_job(log, i) for i in range(1, 5)])
    assert os.read(started_r, 1) == b"x"   # the child holds job 0
    pid = ahead.pid
    for i in range(1, 5):                  # the parent does the rest
        ahead.jobs[ahead._take()]()
    assert ahead.close(grace=0.2) is False
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)        # killed and reaped: no process left behind
    order, _ = _done(log)
    assert order == [1, 2, 3, 4]           # job 0 undone: the caller makes its files, as after a failed child
    for fd in (started_r, started_w, never_r, never_w):
        os.close(fd)
