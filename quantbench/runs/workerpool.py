"""A host's worker processes in a run: started (or forked from the first one), fingerprinted, granted
by the scheduler, each driving a task loop (runs/taskloop.py), killed on an interrupt, joined before
the run returns.

`HostWorkers` takes the host's run state (scheduling.HostRunState: the figures the scheduler asks, changed
only through its methods), its rows (resultrows.HostRows: its session, fingerprint, errors) and its host
object; it owns the processes, their threads and the fork requests the first worker serves."""

from __future__ import annotations

import threading
import time

from quantbench.errors import UserError, flag_mark
from quantbench.hosts.process import WorkerHost
from quantbench.runs.resultrows import failure
from quantbench.hosts.workerclient import WorkerClient
from quantbench.runs.taskloop import TaskLoop


class ForkRequest:
    """An extra worker waiting for the first worker to fork it (between two of its tasks)."""

    def __init__(self):
        self.done = threading.Event()
        self.session = None     # the forked WorkerClient, not yet fingerprinted; None: start one instead
        self.error = ""
        self.t0 = 0.0


def kill_client(client) -> None:
    try:
        client.proc.kill()
    except OSError:
        pass


class HostWorkers:
    """The worker processes of one host: `state` (its HostRunState), `rows` (its HostRows), `host` (its host
    object), `sched` (the scheduling.Scheduler an extra worker's slot goes back to)."""

    def __init__(self, state, rows, host: WorkerHost, sched):
        self.state, self.rows, self.host, self.sched = state, rows, host, sched
        self.clients: list = []
        self.extra_threads: list = []
        #: the first worker while it runs tasks, if it can fork extra ones (WorkerClient.fork); else None
        self.origin = None
        self.fork_requests: list = []

    def kill(self) -> None:
        """Stop every worker of this host now (interrupt): finished results are already buffered."""
        with self.state.lock:
            self.state.halt()
            clients = list(self.clients)
        for c in clients:
            kill_client(c)

    def track(self, hs) -> None:
        """Count a worker that exists and keep its client (killed on interrupt, or now if kill() came first)."""
        with self.state.lock:
            self.clients.append(hs.client)
            stopped = self.state.stop.is_set()
        self.state.count_worker()
        if stopped:
            kill_client(hs.client)

    def start_and_fingerprint(self, forked=None):
        """A new worker of this host (quantbench.hosts.workerclient.WorkerClient), fingerprinted: started, or
        `forked` from the first one (already tracked)."""
        rows = self.rows
        hs = forked or WorkerClient(rows.spec, rows.session, rows.ctx.require_providers, host=self.host)
        try:
            hs.open()
        finally:
            if forked is None and hs.client is not None:
                self.track(hs)
        if self.state.stop.is_set():
            hs.kill()
        return hs

    def drive_first(self, hs, tasks, total: int, bar=None) -> None:
        """The first worker `hs` runs the host's `tasks` (`total` fixtures) until none are left; free slots start
        more workers meanwhile (forked from it between two of its tasks, when the host can fork)."""
        origin = hs if self.host.can_fork() else None
        with self.state.lock:
            self.origin = origin
        self.state.begin(tasks, total, forking=origin is not None, bar=bar)
        self.sched.rebalance()  # free slots (more cores than hosts) go to the busiest hosts now
        serve = (lambda last=False: self.serve_forks(origin, last)) if origin is not None else None
        try:
            TaskLoop(self.state, self.rows, self.host, hs, serve).drive()
        finally:
            self.state.finished()

    def serve_forks(self, origin, last: bool = False) -> None:
        """Fork the extra workers asked for from `origin`, the first worker (they fingerprint and run on their own
        threads); `last`: it takes no more tasks, so later requests start a new worker instead."""
        if last:
            self.state.stop_forking()
        while True:
            with self.state.lock:
                if last:
                    self.origin = None
                if not self.fork_requests:
                    return
                req = self.fork_requests.pop(0)
            try:
                if not last and not self.state.stop.is_set():
                    req.t0 = time.monotonic()
                    req.session = origin.fork()
                    self.track(req.session)
                    if self.state.stop.is_set():  # interrupted meanwhile: kill() may have missed it
                        req.session.kill()
            except Exception as exc:  # e.g. the fork was refused: the extra worker starts anew
                req.error = str(exc)
            finally:
                req.done.set()

    def grant(self) -> None:
        """Start one more worker (a slot was given to this host); it runs tasks until none are left.
        The first worker forks it before its next task when it can; else it starts anew."""
        req = None
        with self.state.lock:
            stopped = self.state.stop.is_set()  # (granted just before the host stopped: no thread after kill())
            if not stopped:
                if self.origin is not None:
                    req = ForkRequest()
                    self.fork_requests.append(req)  # now: the first worker serves it before it takes a task
                th = threading.Thread(target=self._extra_worker, args=(req,), name=f"worker-{self.rows.spec.name}",
                                      daemon=True)
                self.extra_threads.append(th)
                th.start()
        if stopped:
            self.state.started()
            self.sched.release(self.state)

    def join(self) -> bool:
        """Wait for the extra workers' threads; False when none was left to wait for."""
        with self.state.lock:
            alive = [th for th in self.extra_threads if th.is_alive()]
        for th in alive:
            th.join()
        return bool(alive)

    def _forked(self, req):
        """The worker forked for `req` (None: start one); False when there is nothing left to start it for."""
        if req is None:
            return None
        while not req.done.wait(0.5) and not self.state.stop.is_set():
            pass
        if req.session is None and self.state.tasks_left() <= 0:  # the first worker ended: nothing to share
            return False
        if req.error:
            self.state.note(f"host {self.rows.spec.name}: a worker could not fork ({req.error}); started a new one")
        return req.session

    def _open_extra(self, req):
        """The extra worker's WorkerClient, started or forked and fingerprinted; None when it is not needed."""
        try:
            forked = self._forked(req)
            if forked is False:
                return None
            if self.state.stop.is_set():
                if forked is not None:
                    forked.kill()
                return None
            hs = self.start_and_fingerprint(forked)
            if forked is not None:
                self.state.count_worker(forked_seconds=time.monotonic() - req.t0)
            return hs
        finally:
            self.state.started()

    def _extra_worker(self, req: ForkRequest | None = None) -> None:
        name, hs = self.rows.spec.name, None
        try:
            hs = self._open_extra(req)
            if hs is None:
                return
            if hs.fingerprint_id != self.rows.fingerprint_id:
                self.state.halt()
                raise UserError(f"host {name}: two workers report different fingerprints ({self.rows.fingerprint_id[:12]} "
                                f"vs {hs.fingerprint_id[:12]}); run with {flag_mark('jobs')} 1")
            self.state.running()
            try:
                TaskLoop(self.state, self.rows, self.host, hs).drive()
            finally:
                self.state.finished()
        except UserError as exc:
            self.rows.error(failure(name, exc))
        except Exception as exc:
            self.rows.error(f"host {name}: {type(exc).__name__}: {exc}")
        finally:
            if hs is not None:
                hs.close()
            self.sched.release(self.state)
