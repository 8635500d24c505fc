"""A host's worker processes in a run: started (or forked from the first one), fingerprinted, granted
by the runner's scheduler, killed on an interrupt, joined before the run returns.

The runner's host run (`runner._HostRun`) owns the scheduling figures (how much work is left, how
many workers run); this module owns the processes and their threads, and each worker's thread
drives a task loop (hosts/taskloop.py)."""

from __future__ import annotations

import threading
import time

from quantbench.errors import UserError, flag_mark
from quantbench.hosts.resultrows import failure
from quantbench.hosts.session import HostSession
from quantbench.hosts.taskloop import TaskLoop


class ForkRequest:
    """An extra worker waiting for the first worker to fork it (between two of its tasks)."""

    def __init__(self):
        self.done = threading.Event()
        self.session = None     # the forked HostSession, not yet fingerprinted; None: start one instead
        self.error = ""
        self.t0 = 0.0


def kill_client(client) -> None:
    try:
        client.proc.kill()
    except OSError:
        pass


class HostWorkers:
    """The worker processes of host run `run` (its spec, host object, context, summary, lock, stop event)."""

    def __init__(self, run):
        self.run = run
        self.stop = run.stop
        self.clients: list = []
        self.extra_threads: list = []
        #: the first worker while it runs tasks, if it can fork extra ones (HostSession.fork); else None
        self.origin = None
        self.fork_requests: list = []
        self.fork_seconds = 0.0  # the slowest fork so far, fingerprint included

    def kill(self) -> None:
        """Stop every worker of this host now (interrupt): finished results are already buffered."""
        with self.run.lock:
            self.stop.set()
            clients = list(self.clients)
        for c in clients:
            kill_client(c)

    def track(self, hs) -> None:
        """Count a worker that exists and keep its client (killed on interrupt, or now if kill() came first)."""
        with self.run.lock:
            self.run.summary.workers += 1
            self.clients.append(hs.client)
            stopped = self.stop.is_set()
        if stopped:
            kill_client(hs.client)

    def start_and_fingerprint(self, forked=None):
        """A new worker of this host (quantbench.hosts.session.HostSession), fingerprinted: started, or
        `forked` from the first one (already tracked)."""
        run = self.run
        hs = forked or HostSession(run.spec, run.rows.session, run.ctx.require_providers, host=run.host)
        try:
            hs.open()
        finally:
            if forked is None and hs.client is not None:
                self.track(hs)
        if self.stop.is_set():
            hs.kill()
        return hs

    def serve_forks(self, origin, last: bool = False) -> None:
        """Fork the extra workers asked for from `origin`, the first worker (they fingerprint and run on their own
        threads); `last`: it takes no more tasks, so later requests start a new worker instead."""
        while True:
            with self.run.lock:
                if last:
                    self.origin = None
                if not self.fork_requests:
                    return
                req = self.fork_requests.pop(0)
            try:
                if not last and not self.stop.is_set():
                    req.t0 = time.monotonic()
                    req.session = origin.fork()
                    self.track(req.session)
                    if self.stop.is_set():  # interrupted meanwhile: kill() may have missed it
                        req.session.kill()
            except Exception as exc:  # e.g. the fork was refused: the extra worker starts anew
                req.error = str(exc)
            finally:
                req.done.set()

    def grant(self) -> None:
        """Start one more worker (a slot was given to this host); it runs tasks until none are left.
        The first worker forks it before its next task when it can; else it starts anew."""
        run, req = self.run, None
        with run.lock:
            stopped = self.stop.is_set()  # (granted just before the host stopped: no thread after kill())
            if stopped:
                run.starting -= 1
            elif self.origin is not None:
                req = ForkRequest()
                self.fork_requests.append(req)  # now: the first worker serves it before it takes a task
            if not stopped:
                th = threading.Thread(target=self._extra_worker, args=(req,), name=f"worker-{run.spec.name}",
                                      daemon=True)
                self.extra_threads.append(th)
                th.start()
        if stopped:
            run.sched.release(run)

    def join(self) -> bool:
        """Wait for the extra workers' threads; False when none was left to wait for."""
        with self.run.lock:
            alive = [th for th in self.extra_threads if th.is_alive()]
        for th in alive:
            th.join()
        return bool(alive)

    def _forked(self, req):
        """The worker forked for `req` (None: start one); False when there is nothing left to start it for."""
        if req is None:
            return None
        while not req.done.wait(0.5) and not self.stop.is_set():
            pass
        if req.session is None and self.run.tasks.qsize() <= 0:  # the first worker ended: nothing to share
            return False
        if req.error:
            with self.run.lock:
                self.run.summary.notes.append(f"host {self.run.spec.name}: a worker could not fork ({req.error}); "
                                              f"started a new one")
        return req.session

    def _open_extra(self, req):
        """The extra worker's HostSession, started or forked and fingerprinted; None when it is not needed."""
        run = self.run
        try:
            forked = self._forked(req)
            if forked is False:
                return None
            if self.stop.is_set():
                if forked is not None:
                    forked.kill()
                return None
            hs = self.start_and_fingerprint(forked)
            if forked is not None:
                with run.lock:
                    run.summary.forked += 1
                    self.fork_seconds = max(self.fork_seconds, time.monotonic() - req.t0)
            return hs
        finally:
            with run.lock:
                run.starting -= 1

    def _extra_worker(self, req: ForkRequest | None = None) -> None:
        run, hs = self.run, None
        try:
            hs = self._open_extra(req)
            if hs is None:
                return
            if hs.fingerprint_id != run.fingerprint_id:
                self.stop.set()
                raise UserError(f"host {run.spec.name}: two workers report different fingerprints "
                                f"({run.fingerprint_id[:12]} vs {hs.fingerprint_id[:12]}); run with {flag_mark('jobs')} 1")
            with run.lock:
                run.active += 1
            try:
                TaskLoop(run, hs, run.tasks).drive()
            finally:
                with run.lock:
                    run.active -= 1
        except UserError as exc:
            run.rows.error(failure(run.spec.name, exc))
        except Exception as exc:
            run.rows.error(f"host {run.spec.name}: {type(exc).__name__}: {exc}")
        finally:
            if hs is not None:
                hs.close()
            run.sched.release(run)
