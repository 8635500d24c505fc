"""One host's run state, and the worker slots every host of a run shares.

`HostRunState` is the one owner of what a host's run counts while it runs: the fixtures in tasks no worker
has claimed, the workers running and starting, whether the first worker can fork more, the progress bar,
the stop event and the lock that guards them. The workers (runs/workerpool.py), their task loops
(runs/taskloop.py), the results rows (runs/resultrows.py) and the cluster executor change it only
through its methods, so every rule about a host's scheduling figures reads in this one class.

`Scheduler` hands the machine's worker slots to the hosts' states: a first worker as soon as a slot is
free, every later slot to the host with the most work left (`HostRunState.wants_worker`, `work_left`).
"""

from __future__ import annotations

import threading
import time


class HostRunState:
    """The run state of one host (`summary`: its runner.HostSummary, whose worker counts and notes it keeps).

    `cores`: the slots one worker takes (its threads); `uses_local_slot`: False for a host whose workers run on
    another machine's cores (ssh); `grant`: what starts one more worker when the scheduler gives the host a slot;
    `startup_factor`: an extra worker pays when the work it would share outlasts this many of its start-ups."""

    def __init__(self, summary, *, cores: int = 1, uses_local_slot: bool = True, grant=None,
                 startup_factor: float = 1.0):
        self.summary = summary
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.cores, self.uses_local_slot = cores, uses_local_slot
        self.startup_factor = startup_factor
        self._grant = grant
        self.tasks = None       # the host's Tasks (taskloop.Tasks) once its work is planned
        self.unclaimed = 0      # fixtures in tasks no worker has taken yet
        self.active = 0         # workers running tasks
        self.starting = 0       # workers granted and starting (the scheduler counts a grant)
        self.max_workers = 1 << 30
        self.t_run = 0.0
        self.forking = False    # the first worker can fork extra ones (it still takes tasks)
        self.fork_seconds = 0.0  # the slowest fork so far, fingerprint included
        self.bar = None

    # -- the run's course

    def begin(self, tasks, total: int, forking: bool, bar=None) -> None:
        """The first worker starts on `tasks` (`total` fixtures); `forking`: it can fork extra workers."""
        self.bar = bar
        with self.lock:
            self.unclaimed = total
            self.active = 1
            self.t_run = time.monotonic()
            self.tasks = tasks
            self.forking = forking

    def show_progress(self, bar) -> None:
        """A progress bar (tqdm) that each result moves (advance) and the host's end closes (close_bar)."""
        self.bar = bar

    def cap_workers(self, n: int) -> None:
        """At most `n` workers at once (e.g. an ssh remote's cores)."""
        with self.lock:
            self.max_workers = n

    def halt(self) -> None:
        """Stop the host: every worker ends at its next step (an error, a killed worker, an interrupt)."""
        self.stop.set()

    def claim(self, last: str | None):
        """The next task (variant, fixtures) for a worker whose last task was of variant `last`, its fixtures
        claimed; None when none is left (the worker is then counted off `last` already)."""
        got = self.tasks.take(last)
        if got is not None:
            with self.lock:
                self.unclaimed -= len(got[1])
        return got

    def leave(self, last: str | None) -> None:
        """A worker stops taking tasks; `last`: the variant of its last task (None: counted off already)."""
        self.tasks.done(last)

    def tasks_left(self) -> int:
        return self.tasks.qsize() if self.tasks is not None else 0

    def running(self) -> None:
        """One more worker runs tasks."""
        with self.lock:
            self.active += 1

    def finished(self) -> None:
        """A worker ran its last task."""
        with self.lock:
            self.active -= 1

    def started(self) -> None:
        """A granted worker is up (or will not be): it no longer counts as starting."""
        with self.lock:
            self.starting -= 1

    def stop_forking(self) -> None:
        """The first worker takes no more tasks: an extra worker now starts anew."""
        with self.lock:
            self.forking = False

    def count_worker(self, forked_seconds: float | None = None) -> None:
        """A worker process exists (`forked_seconds`: a fork, fingerprinted in that long)."""
        with self.lock:
            if forked_seconds is None:
                self.summary.workers += 1
            else:
                self.summary.forked += 1
                self.fork_seconds = max(self.fork_seconds, forked_seconds)

    def note(self, message: str) -> None:
        with self.lock:
            self.summary.notes.append(message)

    def advance(self) -> None:
        """One result arrived: the progress bar moves."""
        if self.bar is not None:
            self.bar.update(1)

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()

    # -- what the scheduler asks

    def grant(self) -> None:
        """Start one more worker: the scheduler gave this host a slot."""
        self._grant()

    def seconds_per_fixture(self) -> float | None:
        """Wall seconds one worker spends per fixture, from this run so far (None before a result)."""
        ran = self.summary.ran
        if ran < 1 or not self.t_run:
            return None
        return (time.monotonic() - self.t_run) * max(1, self.active) / ran

    def wants_worker(self) -> bool:
        with self.lock:
            if self.stop.is_set() or self.tasks is None or self.unclaimed <= 0:
                return False
            workers = self.active + self.starting
            if workers >= self.max_workers or self.tasks.qsize() <= 0:
                return False
            spf = self.seconds_per_fixture()
            if spf is None:  # no result to measure yet: only a fork (warm, a fraction of a second) is worth it
                return self.forking and self.tasks.qsize() > workers
            left = self.unclaimed * spf  # one worker's seconds of work nobody has taken yet
            startup = self.fork_seconds if self.forking and self.fork_seconds else self.summary.startup_seconds
            return left / (workers + 1) > self.startup_factor * max(startup, 1e-3)

    def work_left(self) -> float:
        spf = self.seconds_per_fixture() or 0.0
        return self.unclaimed * spf / max(1, self.active + self.starting)


class Scheduler:
    """One pool of worker slots (default: the usable cores) shared by every host.

    A host's first worker takes a slot as soon as one is free (hosts in the order
    named). Every slot freed later (a host finished, or had nothing to run) goes to
    the host with the most work left, which starts another worker, as long as its
    unclaimed work outlasts a worker's start-up (a local or emulated host forks its
    first worker instead: that takes a fraction of a second, so such a host takes a
    free slot as soon as its work is planned). Work is split into tasks of a few
    fixtures per variant that a host's workers take in turn; results are merged by
    content key, so who ran what does not matter. ssh workers run on the remote's
    cores: they take no local slot and are capped by the remote's core count.

    `runs`: the hosts' states (HostRunState, or anything with its scheduling part: lock, stop, cores,
    uses_local_slot, starting, wants_worker, work_left, grant).
    """

    def __init__(self, slots: int):
        self.slots = max(1, int(slots))
        self.free = self.slots
        self.cond = threading.Condition()
        self.runs: list = []
        self.waiting: list = []

    def first_slot(self, run, front: bool = False) -> bool:
        """Block until `run` may start its first worker (it takes `run.cores` slots: one per thread of its
        session); False if it was stopped meanwhile. `front`: ahead of the hosts waiting (a worker already started
        that gave its slot back for a moment: equiv's confirm waiting on another host)."""
        if not run.uses_local_slot:
            return True
        with self.cond:
            if front:
                self.waiting.insert(0, run)
            else:
                self.waiting.append(run)
            try:
                while not run.stop.is_set():
                    if self.free >= run.cores and self.waiting[0] is run:
                        self.free -= run.cores
                        return True
                    self.cond.wait(0.2)
                return False
            finally:
                self.waiting.remove(run)
                self.cond.notify_all()

    def release(self, run) -> None:
        if run.uses_local_slot:
            with self.cond:
                self.free += run.cores
                self.cond.notify_all()
        self.rebalance()

    def rebalance(self) -> None:
        """Start a worker for the busiest host on each free slot (first workers are served first)."""
        grants = []
        with self.cond:
            while True:
                cands = [r for r in self.runs if r.wants_worker()]
                if self.waiting:
                    cands = [r for r in cands if not r.uses_local_slot]
                cands = [r for r in cands if not r.uses_local_slot or r.cores <= self.free]
                if not cands:
                    break
                best = max(cands, key=lambda r: r.work_left())
                with best.lock:
                    best.starting += 1
                if best.uses_local_slot:
                    self.free -= best.cores
                grants.append(best)
        for r in grants:
            r.grant()
