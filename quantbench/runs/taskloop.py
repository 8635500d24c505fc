"""A host's tasks and one worker's loop over them: the unclaimed tasks of a host (a few fixtures of one
variant each, handed out so that workers build few sessions), the request one task sends, and the loop
that claims each from the host's run state (runs/scheduling.py), sends it through the worker's WorkerClient
and hands its result frames to the host's rows (runs/resultrows.py)."""

from __future__ import annotations

import collections
import threading
from pathlib import Path

from quantbench.errors import UserError
from quantbench import tensorcode
from quantbench.runs.resultrows import summary_message
from quantbench.hosts.keys import fixture_entry
from quantbench.hosts.process import WorkerDied


def fixture_label(fx) -> str:
    return f"{fx.fixture_id[:12]} ({fx.source})" if getattr(fx, "source", "") else fx.fixture_id[:12]


class Tasks:
    """A host's unclaimed tasks, by variant, handed out so that workers build few sessions.

    A worker keeps taking tasks of the variant it ran last (its session is kept); when
    that variant has none left it moves to the variant with the fewest workers on it
    (then the most fixtures left), so two workers start on different variants rather
    than both building every variant's session.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.by_variant: dict = {}
        self.workers_on: dict = {}

    def put(self, vi, fxs) -> None:
        with self.lock:
            self.by_variant.setdefault(vi.variant_id, collections.deque()).append((vi, fxs))
            self.workers_on.setdefault(vi.variant_id, 0)

    def qsize(self) -> int:
        with self.lock:
            return sum(len(q) for q in self.by_variant.values())

    def take(self, last: str | None):
        """(variant, fixtures) for a worker whose last task was of variant `last`; None when none are left."""
        with self.lock:
            if last is not None:
                self.workers_on[last] -= 1
            if last is not None and self.by_variant.get(last):
                vid = last
            else:
                left = [v for v, q in self.by_variant.items() if q]
                if not left:
                    return None
                vid = min(left, key=lambda v: (self.workers_on[v], -sum(len(f) for _, f in self.by_variant[v])))
            self.workers_on[vid] += 1
            return self.by_variant[vid].popleft()

    def done(self, last: str | None) -> None:
        if last is not None:
            with self.lock:
                self.workers_on[last] -= 1


def chunks(work: list, per: int) -> list:
    """[(variant, fixtures)] of `work` ([(variant, fixtures to run)]) in tasks of at most `per` fixtures."""
    out = []
    for vi, todo in work:
        size = max(1, min(per, len(todo)))
        out += [(vi, todo[i:i + size]) for i in range(0, len(todo), size)]
    return out


def task_request(host, ctx, vi, fxs: list, remote: bool = False, model_data: bytes | None = None,
                 session: dict | None = None) -> tuple[dict, list]:
    """(the request of one task on `host`, as WorkerClient.run_job takes it; its payload parts). `remote`: the
    worker runs on another machine (a cluster's): the model travels as bytes, first, and the inputs after it.
    `model_data`: vi.model_bytes() when the caller holds them already (a cluster reads each model once).
    `session`: the variant's own session on this host (HostRows.job_session; None: the host's)."""
    parts, offset = [], 0
    if host.model_by_path and not vi.external_data and not remote:
        model = {"path": str(vi.path.resolve()), "sha256": vi.raw_sha256}
    else:  # a model with external data travels as bytes, its data embedded (every host kind alike)
        data = vi.model_bytes() if model_data is None else model_data
        model = {"offset": 0, "nbytes": len(data), "sha256": vi.raw_sha256}
        parts.append(data)
        offset = len(data)
    entries = []
    store = ctx.input_store() if host.reads_input_store() and not remote else None
    for fx in fxs:
        arr = tensorcode.canonical(fx.array)
        if store is not None:  # same filesystem: the worker maps the inputs written once per run
            entries.append(fixture_entry(fx.fixture_id, fx.input_name, arr, store[1][fx.fixture_id], arr.nbytes))
        else:
            raw = ctx.fixture_bytes(fx)
            entries.append(fixture_entry(fx.fixture_id, fx.input_name, arr, offset, len(raw)))
            parts.append(raw)
            offset += len(raw)
    request = {"model": model, "fixtures": entries, "variant": vi.name, "variant_id": vi.variant_id,
               "return_tensors": True, "repeat": 1}
    if session is not None:
        request["session"] = session
    if store is not None:
        # the store's folder (in the results, removed with the run) holds the profiles too
        request["store"], request["scratch"] = store[0], str(Path(store[0]).parent)
    return request, parts


def error_line(rows, vi, h: dict) -> str:
    """The summary line of a job's "error" frame `h` (host, variant, the fixture it stopped at); `rows`: the host's
    resultrows.HostRows (its spec and the run's context)."""
    ctx, name = rows.ctx, rows.spec.name
    fx = ctx.fixtures_by_id.get(h.get("fixture_id") or "")
    where = f", fixture {fixture_label(fx)}" if fx else ""
    if h.get("stage") == "disk":   # a full disk: named by the folder the user knows (the run's scratch is in the tables)
        folder = str(h.get("folder") or "")
        inside = folder and Path(folder).is_relative_to(Path(ctx.root).resolve())
        return (f"{ctx.root if inside else folder}: no space left on device (host {name}, variant "
                f"{vi.name}{where}: {h['message']}); free some space and rerun")
    return f"host {name}, variant {vi.name}{where}: {h['stage']} error: {h['message']}"


def job_frame(state, rows, vi, h: dict, p: bytes, job: dict) -> bool:
    """One frame of a job on a host (a local worker's or a cluster task's; `state`: the host's
    scheduling.HostRunState, `rows`: its resultrows.HostRows): counted, its results as outputs rows (HostRows.frame;
    `job`: the job's frame state), the progress bar moved; False for an error frame (noted) after which the job
    stopped. An "unsupported" error is a result for this host and variant, not a failure."""
    rows.frame(vi, h, p, job)
    t = h.get("type")
    if t == "result":
        state.advance()
    elif t == "error" and h.get("stage") in ("unsupported", "requirement"):
        rows.cannot_run(vi, h["message"], requirement=h.get("stage") == "requirement")
    elif t == "error":
        rows.error(error_line(rows, vi, h))
        return False
    return True


class TaskLoop:
    """One worker's task loop: claims its host's tasks in turn (HostRunState.claim), sends each as one request
    through its WorkerClient `hs`, hands the result frames to the host's rows; the first worker also serves the
    fork requests of extra workers between two tasks (`serve_forks`, from runs/workerpool.py)."""

    def __init__(self, state, rows, host, hs, serve_forks=None):
        self.state, self.rows, self.host, self.hs, self.serve_forks = state, rows, host, hs, serve_forks

    def drive(self) -> None:
        """Run tasks until none are left (or the host stops); the first worker (`serve_forks`) forks the extra
        workers asked for before each task."""
        last = None
        try:
            while not self.state.stop.is_set():
                if self.serve_forks is not None:
                    self.serve_forks()
                got = self.state.claim(last)
                if got is None:
                    last = None  # claim() already counted this worker off its last variant
                    return
                vi, fxs = got
                last = vi.variant_id
                if not self._run_task(vi, fxs):
                    return
        finally:
            self.state.leave(last)
            if self.serve_forks is not None:
                self.serve_forks(last=True)

    def _run_task(self, vi, fxs) -> bool:
        """One job on this worker; False when the worker (or the host) must stop."""
        request, payload = task_request(self.host, self.rows.ctx, vi, fxs, session=self.rows.job_session(vi))
        pending = {fx.fixture_id: fx for fx in fxs}  # in order: the first one left was in flight
        job = self.rows.new_state()
        try:
            for h, p in self.hs.run_job(payload, **request):
                self._frame(vi, h, p, job, pending)
        except Exception as exc:
            self._failed(vi, pending, exc)
            return False
        self.rows.writer.flush()
        return not self.state.stop.is_set()

    def _frame(self, vi, h: dict, p: bytes, job: dict, pending: dict) -> None:
        """Count one frame of a job (job_frame); an error frame stops the host (results so far stand)."""
        if not job_frame(self.state, self.rows, vi, h, p, job):
            self.state.halt()  # the job stopped at the failing fixture: so does the host
        elif h.get("type") == "result":
            pending.pop(h["fixture_id"], None)

    def _failed(self, vi, pending: dict, exc: Exception) -> None:
        """The job ended with `exc` (a dead worker: its host says why): one error naming the fixture in flight."""
        self.rows.writer.flush()
        in_flight = next(iter(pending.values()), None)
        where = f", fixture {fixture_label(in_flight)}" if in_flight else ""
        if isinstance(exc, WorkerDied):
            msg = self.host.job_death_message(exc)
        else:
            msg = summary_message(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
        self.rows.error(f"host {self.rows.spec.name}, variant {vi.name}{where}: {msg}")
        self.state.halt()
