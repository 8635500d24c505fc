"""Keyed files made by a forked child and this process together, while this process does other work.

For jobs whose every result is a file with a key file (``fsutil.made_from``): a child
forked from this process starts on them at once, on another core, while the parent goes
on with its own work (scoring, writing tables); then the parent joins in (``finish``):
both take the next job from one queue until none is left, and the parent waits for the
child. The queue is a pipe of job numbers written before the fork: each 4-byte read takes
one job, whoever reads it, so no job is done twice and none is left out.

Afterwards the parent finds each file made from its key and makes any the child did not
(a child that failed, or no fork on this platform) itself, exactly as it would have
without the child. So the child changes when a file is written, never its bytes, and a
failing child costs time, never a result.

The child works on data the parent read (it reads no table), writes nothing but its
files (stdout and stderr go to /dev/null: a lock another thread of the parent held at
the fork stays held in the child), and leaves with ``os._exit``, running none of the
parent's exit handlers. It dies with its parent (``PR_SET_PDEATHSIG`` on Linux): a killed
parent leaves no child running, holding the tables lock it inherited.
"""

from __future__ import annotations

import os
import signal
import struct
import sys
import time

from quantbench.worker.jobs import die_with_parent

RECORD = struct.Struct("<I")
MAX_JOBS = 1024   # job numbers fit a pipe's buffer on every platform (4 KiB): more work is grouped by the caller
#: seconds the parent waits, once the queue is empty, for the child to finish the one job it holds;
#: a child still alive then (stuck on a lock another thread held at the fork) is killed and the
#: parent makes that job's files itself: waiting longer could only cost time, never a byte
GRACE_S = 60.0


class Ahead:
    """`jobs` (callables) shared by a forked child and, from ``finish()`` on, this process."""

    def __init__(self, jobs: list):
        if len(jobs) > MAX_JOBS:
            raise ValueError(f"{len(jobs)} jobs: at most {MAX_JOBS}")
        self.jobs = list(jobs)
        self.pid = None
        self.queue = None
        if not self.jobs or not hasattr(os, "fork"):
            return
        r, w = os.pipe()
        try:
            os.write(w, b"".join(RECORD.pack(i) for i in range(len(self.jobs))))
        finally:
            os.close(w)
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError:   # no memory or process left for a child: the parent does the work
            os.close(r)
            return
        if pid == 0:
            _child(self.jobs, r, parent)
        self.pid, self.queue = pid, r

    def _take(self) -> int | None:
        data = os.read(self.queue, RECORD.size)
        return RECORD.unpack(data)[0] if data else None

    def finish(self) -> None:
        """Do the jobs the child has not taken, then wait for it (nothing without a child)."""
        if self.pid is None:
            return
        try:
            while (i := self._take()) is not None:
                self.jobs[i]()
        finally:
            self.close()

    def close(self, grace: float | None = None) -> bool:
        """Leave the jobs not taken undone and wait for the child (at most `grace` seconds, default
        GRACE_S, then kill it); whether it did all it took."""
        if self.pid is None:
            return False
        while self._take() is not None:   # empty the queue: the child stops after its current job
            pass
        os.close(self.queue)
        pid, self.pid, self.queue = self.pid, None, None
        deadline = time.monotonic() + (GRACE_S if grace is None else grace)
        try:
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    return os.waitstatus_to_exitcode(status) == 0
                if time.monotonic() >= deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    return False
                time.sleep(0.02)
        except ChildProcessError:   # reaped already (SIGCHLD ignored): its files are checked all the same
            return False


def _child(jobs: list, queue: int, parent: int) -> None:
    code = 1
    try:
        die_with_parent(parent)
        sink = open(os.devnull, "w")
        sys.stdout = sys.stderr = sink
        while data := os.read(queue, RECORD.size):
            jobs[RECORD.unpack(data)[0]]()
        code = 0
    except BaseException:   # noqa: BLE001 - the parent makes whatever is missing, and reports its errors
        pass
    finally:
        os._exit(code)
