"""Emulated hosts' work on a Dask distributed cluster (`--cluster ADDRESS`; the `quantbench[cluster]` extra).

Emulated inference is the slow part of a run and is embarrassingly parallel: (host, variant,
fixture chunk) tasks whose results are keyed by content (run_key). With `--cluster`, every
host that `runs_on_cluster` (emulated: qemu on any x86 machine, never the cluster machine's own
CPU) runs on the cluster's workers; local and ssh hosts stay on this machine and its scheduler.

- Before any work is scheduled, `connect` reaches the scheduler and asks every worker for its
  quantbench and onnxruntime versions (and the worker code's hash) and whether each requested
  host is set up there (`hosts setup`); any difference or gap is one UserError.
- Each cluster worker process keeps its host workers alive across tasks (`_lease`: a pool of
  opened worker clients per host and session, one per Dask thread at most), so qemu starts once
  per cluster worker, and each task runs through the one worker-protocol client (WorkerClient).
  A host's session pins its threads (one intra-op thread by default): run `dask worker
  --nthreads N` with N the machine's cores.
- Every worker fingerprints the host before its tasks are submitted (`fingerprint`): the host's
  fingerprints must agree on every cluster machine, else the run of that host is refused (two
  machines that differ never count as one host); each task returns the fingerprint it ran under
  and a different one (a worker that joined later) stops the host with an error.
- Tasks are submitted with keys made of their content and results come back as they finish
  (distributed.as_completed); the client turns their frames into rows through the same
  resultrows.HostRows a local run uses, so the tables read the same. A lost worker's tasks are
  run again by Dask (idempotent: the same content, the same rows); a rerun after the client was
  killed plans only the run keys not yet in the tables.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from quantbench import __version__
from quantbench.errors import UserError
from quantbench.fsutil import canonical_json, content_key
from quantbench.runs.resultrows import HostRows, host_outcome, summary_message
from quantbench.hosts.keys import local_ort_version
from quantbench.hosts.process import WorkerDied, worker_code_sha256
from quantbench.hosts.registry import make_host
from quantbench.runs.scheduling import HostRunState
from quantbench.hosts.workerclient import WorkerClient
from quantbench.runs.taskloop import chunks, job_frame, task_request

CONNECT_SECONDS = 10
#: tasks per cluster thread a host's work is split into (enough to balance, few enough to keep sessions)
TASKS_PER_THREAD = 4
#: at most this many fixtures per task: the last task to finish bounds the run's tail (8 x 33 s for a real
#: detector under emulation), and a lost worker loses at most this much
MAX_TASK_FIXTURES = 8


def _distributed():
    try:
        import distributed
    except ImportError:
        raise UserError("a cluster run needs Dask distributed: pip install 'quantbench[cluster]'") from None
    return distributed


def facts(specs=()) -> dict:
    """What this machine brings to a cluster: versions, the worker code's hash, whether each host is set up."""
    ready = {}
    for spec in specs:
        try:
            ready[spec.name] = list(make_host(spec).ready())
        except Exception as exc:  # an unknown preset, a broken setup: the host is not ready here
            ready[spec.name] = [False, f"{type(exc).__name__}: {exc}"]
    return {"quantbench": __version__, "onnxruntime": local_ort_version(),
            "worker": worker_code_sha256(), "ready": ready}


# --------------------------------------------------------------------------- on each cluster worker

_IDLE: dict = {}   # (host, session, fallback) key -> opened worker clients no task is using
_MADE: dict = {}   # the same key -> how many workers this process made for it (started or forked)
_IDLE_LOCK = threading.Lock()


def _pool_key(spec, session: dict, require_providers: bool) -> str:
    return content_key([spec.name, spec.kind, canonical_json(spec.options), session, bool(require_providers)])


def _lease(spec, session: dict, require_providers: bool) -> WorkerClient:
    """An opened (started, fingerprinted) worker of `spec` on this cluster worker: an idle one, else a new one."""
    with _IDLE_LOCK:
        idle = _IDLE.get(_pool_key(spec, session, require_providers))
        if idle:
            return idle.pop()
    hs = WorkerClient(spec, session, require_providers).open()
    _count(hs, 1)
    return hs


def _count(hs: WorkerClient, n: int) -> None:
    """Count a worker made (n=1) or killed (n=-1) for its key on this process."""
    with _IDLE_LOCK:
        key = _pool_key(hs.spec, hs.session, hs.require_providers)
        _MADE[key] = _MADE.get(key, 0) + n


def _give_back(hs: WorkerClient) -> None:
    with _IDLE_LOCK:
        key = _pool_key(hs.spec, hs.session, hs.require_providers)
        if hs not in _IDLE.setdefault(key, []):
            _IDLE[key].append(hs)


def _threads() -> int:
    """The Dask threads of this cluster worker (1 outside one)."""
    try:
        from distributed import get_worker

        return max(1, int(get_worker().state.nthreads))
    except (ImportError, ValueError, AttributeError):
        return 1


def fingerprint(spec, session: dict, require_providers: bool) -> tuple[dict, str]:
    """(fingerprint, fingerprint id) of `spec` on this cluster worker. Its worker is kept for the tasks, with as
    many more as the cluster worker has threads, forked from it (warm, like a local run's extra workers; each
    fingerprinted, and they must agree)."""
    hs = _lease(spec, session, require_providers)
    kept_ = [hs]
    try:
        key = _pool_key(spec, hs.session, require_providers)
        with _IDLE_LOCK:
            missing = _threads() - _MADE.get(key, 0)
        for _ in range(max(0, missing) if hs.host.can_fork() else 0):
            child = hs.fork().open()
            kept_.append(child)
            _count(child, 1)
            if child.fingerprint_id != hs.fingerprint_id:
                raise UserError(f"host {spec.name}: two workers on one cluster machine report different "
                                f"fingerprints ({hs.fingerprint_id[:12]} vs {child.fingerprint_id[:12]})")
    except BaseException:
        for k in kept_[1:]:
            k.kill()
            _count(k, -1)
        _give_back(hs)
        raise
    for k in kept_:
        _give_back(k)
    return hs.fingerprint, hs.fingerprint_id


def model_bytes(data: bytes) -> bytes:
    """A model's bytes as the result of a task of their own, which the tasks of its variant take: every worker
    fetches them once, and Dask makes them again if the worker holding them is lost (scattered data is not)."""
    return data


def run_task(spec, session: dict, require_providers: bool, model: bytes, request: dict, parts: list):
    """One task on this cluster worker: (the fingerprint id it ran under, its frames [(header, payload)])."""
    hs = _lease(spec, session, require_providers)
    try:
        frames = [(h, bytes(p)) for h, p in hs.run_job([model, *parts], **request)]
    except WorkerDied as exc:
        hs.kill()
        _count(hs, -1)
        raise UserError(hs.host.job_death_message(exc)) from None
    except BaseException:
        hs.kill()
        _count(hs, -1)
        raise
    _give_back(hs)
    return hs.fingerprint_id, frames


# --------------------------------------------------------------------------- on the client


@dataclass
class Cluster:
    """A reachable cluster whose every worker can run the run's cluster hosts (connect)."""

    address: str
    client: object
    workers: dict                 # worker address -> its facts
    threads: int = 1              # Dask threads over all workers
    submitted: int = 0            # tasks submitted by this client (a rerun counts only what was left)
    #: called after each finished task with (host name, tasks finished so far); tests act on a run there
    after_task: object = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def takes(host) -> bool:
    """Whether `host` runs on the cluster (its class says so; local, ssh and imported hosts stay here)."""
    return bool(getattr(host, "runs_on_cluster", False))


def connect(address: str, hosts=(), timeout: float | None = None) -> Cluster:
    """The cluster at `address`, checked before any work: reachable within `timeout` (CONNECT_SECONDS, read at
    the call), with workers whose quantbench, worker code and onnxruntime are this client's, each with every host
    in `hosts` (the ones that run there) set up."""
    timeout = CONNECT_SECONDS if timeout is None else timeout
    distributed = _distributed()
    probe_scheduler(address, timeout)
    try:
        client = distributed.Client(address, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise UserError(f"cluster {address}: cannot reach the scheduler ({_first_line(exc)})") from None
    try:
        specs = [h.spec if hasattr(h, "spec") else h for h in hosts]
        try:
            seen = client.run(facts, specs)
        except Exception as exc:  # e.g. a worker without quantbench cannot even load the question
            raise UserError(f"cluster {address}: a worker cannot run quantbench's check ({type(exc).__name__}: "
                            f"{_first_line(exc)}); install quantbench[cluster] on every worker") from None
        if not seen:
            raise UserError(f"cluster {address}: the scheduler has no workers; start some with "
                            f"`dask worker {address}`")
        _check_workers(address, seen, facts())
        threads = sum(client.nthreads().values()) or 1
    except BaseException:
        client.close()
        raise
    return Cluster(address, client, seen, threads)


def connect_plan(address: str, plan, timeout: float | None = None) -> Cluster:
    """`connect` for a run plan (runner.plan_run): its hosts the cluster takes are checked on every worker."""
    return connect(address, [spec for spec, host in zip(plan.specs, plan.hosts) if takes(host)], timeout)


#: the largest first message a Dask scheduler sends (its handshake: a few hundred bytes)
MAX_HANDSHAKE_BYTES = 1 << 20


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a tcp address (`tcp://HOST:PORT`, `HOST:PORT`, `[v6]:PORT`); None for another protocol."""
    rest = address[len("tcp://"):] if address.startswith("tcp://") else address
    if "://" in rest:
        return None
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UserError(f"cluster {address}: not an address (expected tcp://HOST:PORT)")
    return host.strip("[]"), int(port)


def probe_scheduler(address: str, timeout: float) -> None:
    """Before distributed meets it: a tcp `address` is reached within `timeout` seconds and greets as a Dask
    scheduler does (the length of a small handshake, first); else one UserError. distributed itself waits without
    end on a port that accepts and never answers, and reads a greeting such as an ssh banner as a 2.82 EiB
    message (numpy's MemoryError)."""
    import socket
    import struct

    where = _host_port(address)
    if where is None:
        return
    try:
        with socket.create_connection(where, timeout=timeout) as sock:
            head = b""
            while len(head) < 8:
                more = sock.recv(8 - len(head))
                if not more:
                    raise UserError(f"cluster {address}: not a Dask scheduler (it closed the connection unasked)")
                head += more
    except socket.timeout:
        raise UserError(f"cluster {address}: cannot reach the scheduler (no answer within {timeout:g} s)") from None
    except OSError as exc:
        raise UserError(f"cluster {address}: cannot reach the scheduler ({exc.strerror or exc})") from None
    size = struct.unpack("<Q", head)[0]
    if not 0 < size <= MAX_HANDSHAKE_BYTES:
        shown = head.decode("ascii", "replace") if all(32 <= b < 127 or b in (9, 10, 13) for b in head) else head.hex()
        raise UserError(f"cluster {address}: not a Dask scheduler (it greets with {shown!r})")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _check_workers(address: str, seen: dict, mine: dict) -> None:
    for worker, theirs in sorted(seen.items()):
        for what in ("quantbench", "onnxruntime"):
            if theirs[what] != mine[what]:
                raise UserError(f"cluster {address}: worker {worker} runs {what} {theirs[what]}, this client "
                                f"{mine[what]}; install the same version on every machine")
        if theirs["worker"] != mine["worker"]:
            raise UserError(f"cluster {address}: worker {worker} runs another quantbench worker code "
                            f"({theirs['worker'][:12]} vs {mine['worker'][:12]}); install this checkout there")
        for name, (ok, msg) in sorted(theirs["ready"].items()):
            if not ok:
                raise UserError(f"cluster {address}: worker {worker}: host {name}: {msg}")


def fingerprint_everywhere(cluster: Cluster, spec, session: dict, require_providers: bool) -> tuple[dict, str]:
    """The host's fingerprint, taken on every cluster worker (one task pinned to each); all must agree."""
    client = cluster.client
    futs = {w: client.submit(fingerprint, spec, session, require_providers, workers=[w], allow_other_workers=False,
                             pure=False, key=f"quantbench-fingerprint-{spec.name}-{w}-{time.time_ns()}")
            for w in sorted(cluster.workers)}
    got = {w: f.result() for w, f in futs.items()}
    ids = {w: fid for w, (_, fid) in got.items()}
    if len(set(ids.values())) > 1:
        (w1, f1), (w2, f2) = [(w, ids[w]) for w in sorted(ids)][:2]
        raise UserError(f"host {spec.name}: cluster workers {w1} and {w2} report different fingerprints "
                        f"({f1[:12]} vs {f2[:12]}); the machines differ, so they cannot run one host: "
                        f"start the cluster on identical machines or run the host elsewhere")
    return next(iter(got.values()))


class ClusterHostRun:
    """One host of a run on the cluster: fingerprinted on every worker, its plan (what the tables lack) split in
    tasks submitted to the cluster, each task's frames written as they come, like a local worker's (HostRows)."""

    def __init__(self, spec, host, ctx, summary, cluster: Cluster):
        self.spec, self.host, self.ctx, self.summary, self.cluster = spec, host, ctx, summary, cluster
        self.state = HostRunState(summary)   # its stop, lock and progress bar; the cluster schedules its tasks
        self.rows = HostRows(spec, host, ctx, summary, self.state.lock)
        self.futures: list = []

    def run(self) -> None:
        with host_outcome(self.state, self.rows):
            self._run()

    def kill(self) -> None:
        """Stop now (interrupt): the tasks not finished are cancelled; finished results are already buffered."""
        self.state.halt()
        for f in list(self.futures):
            f.cancel()

    def _run(self) -> None:
        ctx, t0 = self.ctx, time.monotonic()
        fp, fid = fingerprint_everywhere(self.cluster, self.spec, self.rows.session, ctx.require_providers)
        self.summary.startup_seconds = time.monotonic() - t0
        self.summary.workers = len(self.cluster.workers)
        self.rows.adopt(fp, fid)
        work = self.rows.plan(fid)
        total = self.summary.planned
        if not total or self.state.stop.is_set():
            return
        per = min(MAX_TASK_FIXTURES, max(1, -(-total // (TASKS_PER_THREAD * self.cluster.threads))))
        tasks = chunks(work, per)
        if ctx.progress:
            from tqdm import tqdm

            self.state.show_progress(tqdm(total=total, desc=f"{self.spec.name:>10}", leave=True, unit="fixture",
                                          dynamic_ncols=True))
        t1 = time.monotonic()
        by_key = self._submit(tasks, fid)
        self._collect(by_key, fid)
        self.summary.run_seconds = time.monotonic() - t1

    def _submit(self, tasks: list, fid: str) -> dict:
        """Submit every task (each model once, as a task of its own: model_bytes); {future key: (variant, fixtures)}."""
        client, ctx = self.cluster.client, self.ctx
        models, by_key = {}, {}  # variant id -> (its model's bytes, read once; the task that carries them)
        for vi, fxs in tasks:
            if vi.variant_id not in models:  # a task, not scattered data: a lost worker's copy is made again
                data = vi.model_bytes()
                models[vi.variant_id] = data, client.submit(model_bytes, data, pure=False,
                                                            key=f"quantbench-model-{vi.raw_sha256}")
            data, model_task = models[vi.variant_id]
            request, parts = task_request(self.host, ctx, vi, fxs, remote=True, model_data=data,
                                          session=self.rows.job_session(vi))
            key = "quantbench-task-" + content_key([self.spec.name, fid, self.rows.variant_session(vi).key, vi.variant_id,
                                                    [fx.fixture_id for fx in fxs]])
            fut = client.submit(run_task, self.spec, self.rows.session, ctx.require_providers, model_task,
                                request, parts[1:], key=key, pure=False, retries=0)
            self.futures.append(fut)
            by_key[fut.key] = (vi, fxs)
        with self.cluster.lock:
            self.cluster.submitted += len(tasks)
        return by_key

    def _collect(self, by_key: dict, fid: str) -> None:
        """Each finished task's frames into rows, as they finish; the first failure stops the host."""
        distributed = _distributed()
        done = 0
        for fut in distributed.as_completed(self.futures, loop=self.cluster.client.loop):
            if self.state.stop.is_set():
                break
            vi, fxs = by_key[fut.key]
            if not self._task_done(fut, vi, fxs, fid):
                self.kill()
                break
            done += 1
            if self.cluster.after_task is not None:
                self.cluster.after_task(self.spec.name, done)

    def _task_done(self, fut, vi, fxs, fid: str) -> bool:
        """Write one task's results; False (with the error noted) when the task or a frame failed."""
        try:
            ran_under, frames = fut.result()
        except Exception as exc:
            msg = summary_message(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {_first_line(exc)}"
            self.rows.error(f"host {self.spec.name}, variant {vi.name}: {msg}")
            return False
        if ran_under != fid:
            self.rows.error(f"host {self.spec.name}: a cluster worker reports fingerprint {ran_under[:12]}, the "
                            f"others {fid[:12]}; the machines differ, so they cannot run one host")
            return False
        job = self.rows.new_state()
        for h, p in frames:
            if not job_frame(self.state, self.rows, vi, h, p, job):
                return False
        self.rows.writer.flush()
        return True
