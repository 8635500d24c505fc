"""Run every variant x fixture on every host, appending hashed outputs to the result tables.

Each host is driven by its own thread(s), each owning one single-threaded worker
process, so hosts run in parallel up to the core count. A host is fingerprinted
first (a cheap job on the same worker process that then runs the fixtures); the
cache key of one result is

    run_key = sha256(variant_id | fixture_id | fingerprint_id | session_key)

so a rerun skips every (host, run_key) already in the outputs table and an
interrupted run resumes where it stopped. Results are appended as they stream in
(a part every ~2 seconds), so a killed worker or workbench loses at most the
fixtures in flight.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from quantbench import tables
from quantbench.assets import TABLES_DIR
from quantbench.errors import ParameterError, UserError, flag
from quantbench.fixtures import calibration_labels, fixtures_chunks, fixtures_for_variants, no_fixtures_message
from quantbench.fsutil import canonical_json, owner_tag
from quantbench.hosts import fpcache
from quantbench.hosts.deploy import deployed_session, describe, worker_threads
from quantbench.hosts.placement import note_placement
from quantbench.hosts.placement import summary_text as placement_text
from quantbench.hosts import worker as W
from quantbench.hosts.imported import check_coverage, merge_imported
from quantbench.hosts.keys import fixture_entry, hosts_row, local_ort_version, run_key, session_key
from quantbench.hosts.process import WorkerDied
from quantbench.hosts.registry import HostSpec, make_host, resolve_hosts
from quantbench.hosts.session import HostSession
from quantbench.modelio import fits, graph_inputs, load_with_data, raw_sha256, self_contained_bytes, semantic_sha256
from quantbench.textfmt import text_table

FLUSH_SECONDS = 2.0
FLUSH_ROWS = 512


# --------------------------------------------------------------------------- inputs


@dataclass
class VariantInfo:
    """A variant with its identity computed once: semantic id, raw hash, model inputs."""

    name: str
    path: Path
    model: str
    recipe: dict
    variant_id: str
    raw_sha256: str
    inputs: dict  # input name -> shape (ints, or None for symbolic dims)
    external_data: bool = False  # its tensors' data lie in files beside it: it travels with them embedded
    outputs: list = field(default_factory=list)  # the graph's output names, in order

    def model_bytes(self) -> bytes:
        """The bytes a worker runs: the file's, or with its external data embedded (modelio.self_contained_bytes)."""
        return self_contained_bytes(self.path) if self.external_data else self.path.read_bytes()

    def row(self) -> dict:
        return {"variant_id": self.variant_id, "raw_sha256": self.raw_sha256, "model": self.model,
                "variant": self.name, "path": str(self.path), "recipe": canonical_json(self.recipe or {})}


def variant_info(v, loaded: tuple | None = None) -> VariantInfo:
    """Any object with .name, .path, .model, .recipe (quantbench.variants.Variant) -> VariantInfo (a VariantInfo
    as it is). `loaded`: (model, external data files) of v.path from modelio.load_with_data, when the caller
    has them (the file is not parsed again)."""
    if isinstance(v, VariantInfo):
        return v
    path = Path(v.path)
    model, files = loaded if loaded is not None else load_with_data(path)
    vid = getattr(v, "variant_id", None) or semantic_sha256(model)
    return VariantInfo(name=str(v.name), path=path, model=str(getattr(v, "model", "") or path.stem),
                       recipe=dict(getattr(v, "recipe", None) or {}), variant_id=vid,
                       raw_sha256=raw_sha256(path, files, model), inputs=graph_inputs(model),
                       external_data=bool(files), outputs=[o.name for o in model.graph.output])


def _fits(fx, vi: VariantInfo) -> bool:
    return fits(fx.input_name, list(fx.array.shape), vi.inputs)


@dataclass
class RunPlan:
    """A run worked out once, before anything runs or is written (plan_run): its hosts, each variant's
    identity, which fixtures fit which variant, its run id."""

    specs: list            # HostSpecs, each host once, in the order named
    hosts: list            # their host objects (registry.make_host), made once
    asked: list            # [(variant as asked, its VariantInfo)]: every variant asked for
    variants: list         # the distinct VariantInfos (by semantic id), in the order asked
    fixtures: list         # each fixture once
    fixtures_for: dict     # variant_id -> the fixtures that fit it
    session: dict | None   # the session options as given (overrides for every host)
    #: host name -> the normalised session it runs under (its deployed session, then `session`)
    sessions: dict = field(default_factory=dict)
    run_id: str | None = None
    limit: int | None = None
    labels: str | None = None   # the labels the fixtures were made from (None: the bundled corpus)
    images: str | None = None

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]


def plan_run(hosts, variants, *, fixtures=None, labels=None, images=None, split: str | None = "eval",
             limit: int | None = None, sidecar: dict | None = None, session: dict | None = None, hosts_file=None,
             command: str | None = None, check_hosts: bool = True, check_variant=None) -> RunPlan:
    """Everything a run needs, each model file parsed once: the hosts (made once; each ready, unless
    `check_hosts` is False), each variant's info, the fixtures (given, or made from `labels`/`images`/`split`/
    `limit`: without labels, the ones the variants were calibrated with) and which fit which variant, the run
    id (`command` names the run; None: no id). `check_variant(variant, output_names)` runs on every variant
    before its fixtures are made (e.g. a decoder check). Nothing is written."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ParameterError("limit", "must be at least 1", limit)
    specs = _host_specs(hosts, hosts_file)
    made = [make_host(spec) for spec in specs]
    if check_hosts:
        for host in made:
            _ready(host)
    if not variants:
        raise UserError(f"no model variants to run; run `quantbench calibrate` first or pass {flag('variants')}")
    loaded = [None if isinstance(v, VariantInfo) else load_with_data(Path(v.path)) for v in variants]
    if check_variant is not None:
        for v, lw in zip(variants, loaded):
            check_variant(v, v.outputs if lw is None else [o.name for o in lw[0].graph.output])
    if fixtures is None:
        if not labels:
            labels, images = calibration_labels(variants, images)
        fixtures, _ = fixtures_for_variants(variants, labels, images, split, limit, sidecar,
                                            models=[lw[0] if lw else None for lw in loaded])
        if not fixtures:
            raise UserError(no_fixtures_message(labels, split))
    asked = [(v, variant_info(v, lw)) for v, lw in zip(variants, loaded)]
    plan = _plan_fixtures(specs, made, asked, fixtures, session, limit)
    plan.labels, plan.images = labels, images
    plan.sessions = {s.name: deployed_session(s, session, h.recorded_session()) for s, h in zip(specs, made)}
    if command is not None:
        plan.run_id = tables.run_id_of(command=command, hosts=plan.names, session=plan.sessions,
                                       variants=sorted(str(v.path) for v in variants),
                                       fixtures=sorted(fx.fixture_id for fx in fixtures))
    return plan


def _plan_fixtures(specs, made, asked, fixtures, session, limit) -> RunPlan:
    """The plan's variants (each semantic id once) and fixtures (each once); every variant fits one."""
    if not fixtures:
        raise UserError(f"no fixtures to run; check {flag('fixtures')}/{flag('split')}/{flag('limit')}")
    infos: dict[str, VariantInfo] = {}
    for _, vi in asked:
        infos.setdefault(vi.variant_id, vi)
    uniq = list({fx.fixture_id: fx for fx in fixtures}.values())
    fits_of = {vid: [fx for fx in uniq if _fits(fx, vi)] for vid, vi in infos.items()}
    for vid, vi in infos.items():
        if not fits_of[vid]:
            shapes = sorted({f"{fx.input_name}{list(fx.array.shape)}" for fx in uniq})
            raise UserError(f"variant {vi.name} ({vi.path}): no fixture fits its input(s) "
                            f"{vi.inputs}; fixtures are {', '.join(shapes[:4])}")
    return RunPlan(specs, made, asked, list(infos.values()), uniq, fits_of, session, limit=limit)


def fixture_label(fx) -> str:
    return f"{fx.fixture_id[:12]} ({fx.source})" if getattr(fx, "source", "") else fx.fixture_id[:12]


# --------------------------------------------------------------------------- cores


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. under taskset), else the core count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worker_slots(jobs: int | None) -> int:
    """The local worker slots for `jobs` (None: one per usable core), validated. An explicit count is taken as
    given (a caller that asks for two workers on one core gets two); the command line caps its --jobs first
    (capped_jobs)."""
    if jobs is None:
        return usable_cores()
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ParameterError("jobs", "must be at least 1 (leave it out for one worker per core)", jobs)
    return jobs


def capped_jobs(jobs: int | None) -> tuple[int | None, str | None]:
    """`jobs` validated and capped at the usable cores, with a note when it was: a worker beyond the cores only
    competes for them (10000 jobs on 2 cores ran 4x slower)."""
    worker_slots(jobs)
    cores = usable_cores()
    if jobs is not None and jobs > cores:
        return cores, f"using {cores} jobs: this machine has {cores} cores"
    return jobs, None


def announce_jobs(jobs: int | None, to_stderr: bool = False) -> int | None:
    """The worker count a command runs with (capped_jobs), checked before anything is written; prints the
    note, if any."""
    jobs, note = capped_jobs(jobs)
    if note:
        print(f"note: {note}", file=sys.stderr if to_stderr else sys.stdout, flush=True)
    return jobs


# --------------------------------------------------------------------------- summary


@dataclass
class HostSummary:
    name: str
    kind: str
    #: results measured by this run's own workers (False: merged from an imported file, under its session)
    measured: bool = True
    fingerprint_id: str = ""
    #: the session this host ran under (hosts.deploy.deployed_session) and its key
    session: dict = field(default_factory=dict)
    session_key: str = ""
    ran: int = 0
    cached: int = 0
    imported: int = 0
    planned: int = 0
    seconds: float = 0.0
    #: starting the first worker and fingerprinting (interpreter start, imports; qemu start-up)
    startup_seconds: float = 0.0
    #: running the fixtures (sessions, inference, hashing, transfer, table appends)
    run_seconds: float = 0.0
    #: inside the workers: session.run time, input hash verification, session creation
    infer_seconds: float = 0.0
    #: each fixture's session.run time, in arrival order (benchmarks compare its fast tail)
    infer_each: list = field(default_factory=list)
    verify_seconds: float = 0.0
    session_seconds: float = 0.0
    providers: list = field(default_factory=list)
    #: variant name -> {provider: {op type: nodes}}: which provider ran each node (the run's profile)
    placements: dict = field(default_factory=dict)
    #: provider requests the run did not honour: "variant fp32: XnnpackExecutionProvider is not available ..."
    provider_findings: list = field(default_factory=list)
    #: worker processes started (0: every result was cached under the remembered fingerprint)
    workers: int = 0
    #: of those, workers forked from the first one (warm) rather than started anew
    forked: int = 0
    #: jobs that reused a session the worker had built for an earlier job (same variant and options)
    sessions_reused: int = 0
    #: the fingerprint came from the fingerprint cache and no worker was needed
    fingerprint_cached: bool = False
    errors: list = field(default_factory=list)
    notes: list = field(default_factory=list)


@dataclass
class RunSummary:
    """What a run did: per host counts and errors, the ids involved, where tables went."""

    hosts: list[HostSummary]
    variants: list[VariantInfo]
    fixture_ids: list[str]
    sessions: dict       # host -> the session it ran under
    tables_root: Path

    def fingerprints(self) -> dict[str, str]:
        """{host: fingerprint_id} this run produced or merged (filter results by these)."""
        return {h.name: h.fingerprint_id for h in self.hosts if h.fingerprint_id}

    @property
    def errors(self) -> list[str]:
        return [e for h in self.hosts for e in h.errors]

    def table(self) -> str:
        rows = [("host", "kind", "fingerprint", "ran", "cached", "imported", "errors", "seconds")]
        for h in self.hosts:
            rows.append((h.name, h.kind, h.fingerprint_id[:12], str(h.ran), str(h.cached), str(h.imported),
                         str(len(h.errors)), f"{h.seconds:.1f}"))

        return text_table(rows[0], rows[1:])

    def session_lines(self) -> list[str]:
        """Per host: the session it ran under, which provider ran how many nodes, and each provider finding."""
        out = []
        for h in self.hosts:
            if h.session:
                out.append(f"session {h.name}: {describe(h.session)}")
            for variant, placement in h.placements.items():
                out.append(f"  {variant}: {placement_text(placement)}")
            out += [f"  FALLBACK {h.name}: {f}" for f in h.provider_findings]
        return out


class RunFailed(UserError):
    """Some host/variant/fixture failed; every finished result was kept (see .summary)."""

    def __init__(self, message: str, summary: RunSummary):
        super().__init__(message)
        self.summary = summary


# --------------------------------------------------------------------------- the run


class _Writer:
    """Buffers output rows of finished fixtures and appends them as table parts.

    Nothing is appended before the run's fixtures and models rows are (`ctx.inputs_done`), and
    nothing at all if writing them failed (a full disk): an outputs row never refers to a fixture
    the tables lack. The first failed append is raised once; the rows after it are dropped (the
    rerun computes them), so a full disk is one error, not one per result.
    """

    def __init__(self, ctx: "_Context"):
        self.ctx, self.root = ctx, ctx.root
        self.rows: list[dict] = []
        self.last = time.monotonic()
        self.lock = threading.Lock()
        self.failed = False

    def add(self, rows: list[dict]) -> None:
        with self.lock:
            self.rows.extend(rows)
            if self.ctx.inputs_done.is_set() and (len(self.rows) >= FLUSH_ROWS
                                                  or time.monotonic() - self.last >= FLUSH_SECONDS):
                self._flush()

    def _flush(self) -> None:
        if self.failed or not self.ctx.inputs_ok:
            self.rows = []
        if self.rows:
            rows, self.rows = self.rows, []
            try:
                tables.append("outputs", rows, root=self.root)
            except Exception:
                self.failed = True
                raise
        self.last = time.monotonic()

    def flush(self) -> None:
        self.ctx.inputs_done.wait()
        with self.lock:
            self._flush()


def done_run_keys(host: str, fingerprint_id: str, skey: str, root: Path) -> set[str]:
    """run_keys already in the outputs table for this host, fingerprint and session."""
    t = tables.read("outputs", root=root, columns=["run_key"],
                    filter={"host": host, "fingerprint_id": fingerprint_id, "session_key": skey})
    return set(t.column("run_key").to_pylist())


class _Tasks:
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


class _Scheduler:
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
    """

    def __init__(self, slots: int):
        self.slots = max(1, int(slots))
        self.free = self.slots
        self.cond = threading.Condition()
        self.runs: list = []
        self.waiting: list = []

    def first_slot(self, run) -> bool:
        """Block until `run` may start its first worker (it takes `run.cores` slots: one per thread of its
        session); False if it was stopped meanwhile."""
        if not run.uses_local_slot:
            return True
        with self.cond:
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


class _ForkRequest:
    """An extra worker waiting for the first worker to fork it (between two of its tasks)."""

    def __init__(self):
        self.done = threading.Event()
        self.session = None     # the forked HostSession, not yet fingerprinted; None: start one instead
        self.error = ""
        self.t0 = 0.0


def _task_request(host, ctx: "_Context", vi: VariantInfo, fxs: list) -> tuple[dict, list]:
    """(the request of one task on `host`, as HostSession.run_job takes it; its payload parts)."""
    parts, offset = [], 0
    if host.model_by_path and not vi.external_data:
        model = {"path": str(vi.path.resolve()), "sha256": vi.raw_sha256}
    else:  # a model with external data travels as bytes, its data embedded (every host kind alike)
        data = vi.model_bytes()
        model = {"offset": 0, "nbytes": len(data), "sha256": vi.raw_sha256}
        parts.append(data)
        offset = len(data)
    entries = []
    store = ctx.input_store() if host.reads_input_store() else None
    for fx in fxs:
        arr = W.canonical(fx.array)
        if store is not None:  # same filesystem: the worker maps the inputs written once per run
            entries.append(fixture_entry(fx.fixture_id, fx.input_name, arr, store[1][fx.fixture_id], arr.nbytes))
        else:
            raw = ctx.fixture_bytes(fx)
            entries.append(fixture_entry(fx.fixture_id, fx.input_name, arr, offset, len(raw)))
            parts.append(raw)
            offset += len(raw)
    request = {"model": model, "fixtures": entries, "variant": vi.name, "variant_id": vi.variant_id,
               "return_tensors": True, "repeat": 1}
    if store is not None:  # the store's folder (in the results, removed with the run) holds the profiles too
        request["store"], request["scratch"] = store[0], str(Path(store[0]).parent)
    return request, parts


def _result_rows(run, vi: VariantInfo, h: dict, payload: bytes, state: dict) -> list[dict]:
    """The outputs rows of one result frame `h` of host run `run` (under its fingerprint and session); `state`:
    its job's providers and placement (_TaskLoop._frame)."""
    fid = h["fixture_id"]
    rk = run_key(vi.variant_id, fid, run.fingerprint_id, run.skey)
    rows = []
    for o in h["outputs"]:
        tensor = payload[o["offset"]:o["offset"] + o["nbytes"]] if "offset" in o else None
        rows.append({"run_key": rk, "host": run.spec.name, "fingerprint_id": run.fingerprint_id,
                     "session_key": run.skey, "session_options": run.session_json,
                     "variant_id": vi.variant_id, "variant": vi.name, "fixture_id": fid,
                     "output_name": o["name"], "dtype": o["dtype"], "shape": o["shape"], "sha256": o["sha256"],
                     "tensor": tensor, "providers": state["providers"], "placement": state["placement"]})
    return rows


class _TaskLoop:
    """One worker's task loop: takes its host's tasks (_Tasks) in turn, sends each as one request through its
    HostSession, turns the result frames into outputs rows for the host's writer; the first worker
    (`origin`) also forks the extra workers asked for between two tasks."""

    def __init__(self, run: "_HostRun", hs, tasks: "_Tasks", origin=None):
        self.run, self.hs, self.tasks, self.origin = run, hs, tasks, origin

    def drive(self) -> None:
        """Run tasks until none are left (or the host stops); the first worker (`origin`) forks the extra
        workers asked for before each task."""
        last = None
        try:
            while not self.run.stop.is_set():
                if self.origin is not None:
                    self._serve_forks()
                got = self.tasks.take(last)
                if got is None:
                    last = None  # take() already counted this worker off its last variant
                    return
                vi, fxs = got
                last = vi.variant_id
                with self.run.lock:
                    self.run.unclaimed -= len(fxs)
                if not self._run_task(vi, fxs):
                    return
        finally:
            self.tasks.done(last)
            if self.origin is not None:
                self._serve_forks(last=True)

    def _serve_forks(self, last: bool = False) -> None:
        """Fork the extra workers asked for (they fingerprint and run on their own threads); `last`:
        this worker takes no more tasks, so later requests start a new worker instead."""
        while True:
            with self.run.lock:
                if last:
                    self.run.origin = None
                if not self.run.fork_requests:
                    return
                req = self.run.fork_requests.pop(0)
            try:
                if not last and not self.run.stop.is_set():
                    req.t0 = time.monotonic()
                    req.session = self.origin.fork()
                    self.run._track(req.session)
                    if self.run.stop.is_set():  # interrupted meanwhile: kill() may have missed it
                        req.session.kill()
            except Exception as exc:  # e.g. the fork was refused: the extra worker starts anew
                req.error = str(exc)
            finally:
                req.done.set()

    def _run_task(self, vi, fxs) -> bool:
        """One job on this worker; False when the worker (or the host) must stop."""
        request, payload = _task_request(self.run.host, self.run.ctx, vi, fxs)
        pending = {fx.fixture_id: fx for fx in fxs}  # in order: the first one left was in flight
        state = {"providers": [], "placement": None}
        try:
            for h, p in self.hs.run_job(payload, **request):
                self._frame(vi, h, p, state, pending)
        except Exception as exc:
            self._failed(vi, pending, exc)
            return False
        self.run.writer.flush()
        return not self.run.stop.is_set()

    def _frame(self, vi, h: dict, p: bytes, state: dict, pending: dict) -> None:
        """Count one frame of a job, its results as outputs rows; `state` keeps the providers that ran its nodes
        (placement.note_placement: from the run's profile, once the session's first run is done)."""
        run, summary, t = self.run, self.run.summary, h.get("type")
        if t == "session":
            state["providers"] = h["providers"]
            with run.lock:
                summary.sessions_reused += 1 if h.get("reused") else 0
                summary.session_seconds += h.get("session_seconds", 0.0)
        if h.get("placement") is not None:
            with run.lock:
                note_placement(summary, f"{vi.model}/{vi.name}", run.session["providers"], h, state)
        if t == "verified":  # input hashing time, spent on the worker's helper thread
            with run.lock:
                summary.verify_seconds += h.get("verify_seconds", 0.0)
        elif t == "result":
            run.writer.add(_result_rows(run, vi, h, p, state))
            pending.pop(h["fixture_id"], None)
            with run.lock:
                summary.ran += 1
                summary.infer_seconds += h.get("seconds", 0.0)
                summary.infer_each.append(h.get("seconds", 0.0))
            if run.bar is not None:
                run.bar.update(1)
        elif t == "error":
            fx = run.ctx.fixtures_by_id.get(h.get("fixture_id") or "")
            where = f", fixture {fixture_label(fx)}" if fx else ""
            run._error(f"host {run.spec.name}, variant {vi.name}{where}: {h['stage']} error: {h['message']}")
            run.stop.set()  # the job stopped at the failing fixture: so does the host (results so far stand)

    def _failed(self, vi, pending: dict, exc: Exception) -> None:
        """The job ended with `exc` (a dead worker: its host says why): one error naming the fixture in flight."""
        run = self.run
        run.writer.flush()
        in_flight = next(iter(pending.values()), None)
        where = f", fixture {fixture_label(in_flight)}" if in_flight else ""
        if isinstance(exc, WorkerDied):
            msg = run.host.job_death_message(exc)
        else:
            msg = _kept(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
        run._error(f"host {run.spec.name}, variant {vi.name}{where}: {msg}")
        run.stop.set()


class _HostRun:
    #: an extra worker pays when the work it would share outlasts this many of its start-ups
    STARTUP_FACTOR = 1.0

    def __init__(self, spec: HostSpec, host, ctx: "_Context", position: int, sched: "_Scheduler"):
        self.spec = spec
        self.host = host
        self.ctx = ctx
        self.position = position
        self.sched = sched
        self.session = ctx.sessions[spec.name]
        self.session_json, self.skey = canonical_json(self.session), session_key(self.session)
        self.summary = HostSummary(spec.name, spec.kind, session=self.session, session_key=self.skey)
        #: core slots each worker takes: its threads, at most every slot (a 4-thread guest on 2 cores takes both)
        self.cores = min(worker_threads(self.session), sched.slots)
        self.writer = _Writer(ctx)
        self.stop = threading.Event()
        self.bar = None
        self.lock = threading.Lock()
        self.clients: list = []
        self.uses_local_slot = self.host.uses_local_cores
        self.tasks: _Tasks | None = None
        self.unclaimed = 0      # fixtures in tasks no worker has taken yet
        self.active = 0         # workers running tasks
        self.starting = 0       # workers granted and starting
        self.max_workers = 1 << 30
        self.t_run = 0.0
        self.extra_threads: list = []
        #: the first worker while it runs tasks, if it can fork extra ones (HostSession.fork); else None
        self.origin = None
        self.fork_requests: list = []
        self.fork_seconds = 0.0  # the slowest fork so far, fingerprint included

    def kill(self) -> None:
        """Stop every worker of this host now (interrupt): finished results are already buffered."""
        with self.lock:
            self.stop.set()
            clients = list(self.clients)
        for c in clients:
            _kill_client(c)

    # -- worker side

    def _error(self, msg: str) -> None:
        with self.lock:
            self.summary.errors.append(msg)

    # -- host side

    def run(self) -> None:
        t0 = time.monotonic()
        try:
            self._run()
        except Exception as exc:  # keep the other hosts going; report this one
            self._error(_failure(self.spec.name, exc))
        finally:
            self.writer.flush()
            if self.bar is not None:
                self.bar.close()
            self.summary.seconds = time.monotonic() - t0

    def _track(self, hs) -> None:
        """Count a worker that exists and keep its client (killed on interrupt, or now if kill() came first)."""
        with self.lock:
            self.summary.workers += 1
            self.clients.append(hs.client)
            stopped = self.stop.is_set()
        if stopped:
            _kill_client(hs.client)

    def _start_and_fingerprint(self, forked=None):
        """A new worker of this host (quantbench.hosts.session.HostSession), fingerprinted: started, or
        `forked` from the first one (already tracked)."""
        hs = forked or HostSession(self.spec, self.session, self.ctx.require_providers, host=self.host)
        try:
            hs.open()
        finally:
            if forked is None and hs.client is not None:
                self._track(hs)
        if self.stop.is_set():
            hs.kill()
        return hs

    def _adopt(self, fp: dict, fid: str) -> None:
        """Take `fid` as this host's fingerprint: the host's version policy, the hosts row (written once)."""
        ctx = self.ctx
        self.fingerprint_id = fid
        self.summary.fingerprint_id = fid
        ort_v = fp["identity"].get("onnxruntime", {}).get("version", "")
        note = self.host.version_policy(ort_v, ctx.local_ort, ctx.allow_version_mismatch)
        if note and note not in self.summary.notes:
            self.summary.notes.append(note)
        tables.append("hosts", [hosts_row(self.spec.name, self.spec.kind, fp, fid)], root=ctx.root, ledger=True)

    def _plan(self, fid: str) -> list:
        """[(variant, fixtures not yet in the tables under fid)]; counts the cached ones."""
        ctx = self.ctx
        done = done_run_keys(self.spec.name, fid, self.skey, ctx.root)
        work, cached = [], 0
        for vi in ctx.variants:
            todo = [fx for fx in ctx.fixtures_for[vi.variant_id]
                    if run_key(vi.variant_id, fx.fixture_id, fid, self.skey) not in done]
            cached += len(ctx.fixtures_for[vi.variant_id]) - len(todo)
            if todo:
                work.append((vi, todo))
        self.summary.cached = cached
        self.summary.planned = sum(len(t) for _, t in work)
        return work

    def _run(self) -> None:
        ctx = self.ctx

        try:
            key = fpcache.cache_key(self.host, self.session, ctx.require_providers)
        except Exception:  # the cache is an optimisation: never a reason to fail
            key = None
        hit = fpcache.lookup(key)
        planned = None  # (fingerprint id, its plan) when the remembered fingerprint was adopted
        if hit is not None:
            # Every result cached under the remembered fingerprint: nothing to start.
            self._adopt(*hit)
            planned = (hit[1], self._plan(hit[1]))
            if not planned[1]:
                self.summary.fingerprint_cached = True
                return
        if not self.sched.first_slot(self):
            return
        released = []

        def free_first_slot():
            if not released:
                released.append(True)
                self.sched.release(self)

        self._free_first_slot = free_first_slot
        try:
            self._run_workers(key, planned)
        finally:
            free_first_slot()
            self.host.close_connection()

    def _run_workers(self, key, planned=None) -> None:
        """Start the first worker, fingerprint it, plan, and run tasks (more workers join via grant).
        `planned`: (fingerprint id, plan) already adopted from the fingerprint cache, kept if the worker agrees."""
        ctx = self.ctx
        t0 = time.monotonic()
        if self.host.reads_input_store():  # same filesystem: write the input store while the worker starts
            threading.Thread(target=ctx.input_store, name="input-store", daemon=True).start()
        hs = self._start_and_fingerprint()
        fp, fid = hs.fingerprint, hs.fingerprint_id
        fpcache.store(key, fp, fid)
        self.summary.startup_seconds = time.monotonic() - t0
        try:
            if planned is not None and planned[0] == fid:
                work = planned[1]  # the remembered fingerprint held: adopted and planned already
            else:
                self._adopt(fp, fid)
                work = self._plan(fid)
            total = self.summary.planned
            if not total:
                return
            self.max_workers = self.host.max_workers(fp)  # e.g. an ssh remote's cores
            # Tasks of a few fixtures per variant: enough of them that a worker started later
            # (a slot freed by another host) still finds work to share.
            per = max(1, -(-total // (8 * max(self.sched.slots, 1))))
            tasks = _Tasks()
            for vi, todo in work:
                size = max(1, min(per, len(todo)))
                for i in range(0, len(todo), size):
                    tasks.put(vi, todo[i:i + size])
            if ctx.progress:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=f"{self.spec.name:>10}", position=self.position, leave=True,
                                unit="fixture", file=sys.stderr, dynamic_ncols=True)
            origin = hs if self.host.can_fork() else None
            with self.lock:
                self.unclaimed = total
                self.active = 1
                self.t_run = time.monotonic()
                self.tasks = tasks
                self.origin = origin
            self.sched.rebalance()  # free slots (more cores than hosts) go to the busiest hosts now
            _TaskLoop(self, hs, tasks, origin).drive()
            with self.lock:
                self.active -= 1
            # this worker is done: its slot goes back to the pool (the busiest host, or nobody)
            self._free_first_slot()
        finally:
            for th in list(self.extra_threads):
                th.join()
            hs.close()  # after the extra workers: the forked ones are its children
        self.writer.flush()
        self.summary.run_seconds = time.monotonic() - self.t_run if self.t_run else 0.0

    # -- scheduling

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
                return self.origin is not None and self.tasks.qsize() > workers
            left = self.unclaimed * spf  # one worker's seconds of work nobody has taken yet
            startup = self.fork_seconds if self.origin is not None and self.fork_seconds else self.summary.startup_seconds
            return left / (workers + 1) > self.STARTUP_FACTOR * max(startup, 1e-3)

    def work_left(self) -> float:
        spf = self.seconds_per_fixture() or 0.0
        return self.unclaimed * spf / max(1, self.active + self.starting)

    def grant(self) -> None:
        """Start one more worker (a slot was given to this host); it runs tasks until none are left.
        The first worker forks it before its next task when it can; else it starts anew."""
        req = None
        with self.lock:
            stopped = self.stop.is_set()  # (granted just before the host stopped: no thread after kill())
            if stopped:
                self.starting -= 1
            elif self.origin is not None:
                req = _ForkRequest()
                self.fork_requests.append(req)  # now: the first worker serves it before it takes a task
            if not stopped:
                th = threading.Thread(target=self._extra_worker, args=(req,), name=f"worker-{self.spec.name}",
                                      daemon=True)
                self.extra_threads.append(th)
                th.start()
        if stopped:
            self.sched.release(self)

    def join_workers(self) -> bool:
        """Wait for the extra workers' threads; False when none was left to wait for."""
        with self.lock:
            alive = [th for th in self.extra_threads if th.is_alive()]
        for th in alive:
            th.join()
        return bool(alive)

    def _extra_worker(self, req: "_ForkRequest | None" = None) -> None:
        hs = None
        try:
            try:
                forked = None
                if req is not None:
                    while not req.done.wait(0.5) and not self.stop.is_set():
                        pass
                    forked = req.session
                    if forked is None and self.tasks.qsize() <= 0:  # the first worker ended: nothing to share
                        return
                    if req.error:
                        with self.lock:
                            self.summary.notes.append(f"host {self.spec.name}: a worker could not fork ({req.error}); "
                                                      f"started a new one")
                if self.stop.is_set():
                    if forked is not None:
                        forked.kill()
                    return
                hs = self._start_and_fingerprint(forked)
                fid2 = hs.fingerprint_id
                if forked is not None:
                    with self.lock:
                        self.summary.forked += 1
                        self.fork_seconds = max(self.fork_seconds, time.monotonic() - req.t0)
            finally:
                with self.lock:
                    self.starting -= 1
            if fid2 != self.fingerprint_id:
                self.stop.set()
                raise UserError(f"host {self.spec.name}: two workers report different fingerprints "
                                f"({self.fingerprint_id[:12]} vs {fid2[:12]}); run with {flag('jobs')} 1")
            with self.lock:
                self.active += 1
            try:
                _TaskLoop(self, hs, self.tasks).drive()
            finally:
                with self.lock:
                    self.active -= 1
        except UserError as exc:
            self._error(_failure(self.spec.name, exc))
        except Exception as exc:
            self._error(f"host {self.spec.name}: {type(exc).__name__}: {exc}")
        finally:
            if hs is not None:
                hs.close()
            self.sched.release(self)


def _kill_client(client) -> None:
    try:
        client.proc.kill()
    except OSError:
        pass


class _ImportedRun:
    """An imported host: its file is merged into the tables (imported.merge_imported); no worker, no slot."""

    def __init__(self, host, ctx: "_Context"):
        self.host, self.ctx = host, ctx
        self.summary = HostSummary(host.name, host.kind, measured=host.runs_workers, session=ctx.sessions[host.name],
                                   session_key=ctx.skey_of(host.name))

    def run(self) -> None:
        t0 = time.monotonic()
        try:
            merge_imported(self.host, self.ctx, self.summary)
        except Exception as exc:  # keep the other hosts going; report this one
            self.summary.errors.append(_failure(self.host.name, exc))
        finally:
            self.summary.seconds = time.monotonic() - t0

    def kill(self) -> None:
        """Nothing to stop: a merge is one table append per table."""


def _failure(host: str, exc: Exception) -> str:
    """One error line for a host that failed: a UserError as it reads (prefixed with the host), else the type."""
    if isinstance(exc, UserError):
        return _kept(exc) if str(exc).startswith("host ") else f"host {host}: {_kept(exc)}"
    return f"host {host}: {type(exc).__name__}: {exc}"


def _kept(exc: UserError) -> str:
    """A UserError's message for a run summary, its flag(param) marks kept: str(RunFailed) shows the parameters'
    names, the CLI their flags (a command prints summary errors through args._render)."""
    return str(exc) if isinstance(exc, ParameterError) else Exception.__str__(exc)


class _Context:
    def __init__(self, plan: RunPlan, sessions, root, require_providers, allow_version_mismatch, progress):
        self.variants = plan.variants
        self.fixtures = plan.fixtures
        self.fixtures_by_id = {fx.fixture_id: fx for fx in plan.fixtures}
        self.sessions = sessions
        self.root = Path(root)
        self.require_providers = require_providers
        self.allow_version_mismatch = allow_version_mismatch
        self.progress = progress
        self.local_ort = local_ort_version()
        self._bytes: dict[str, bytes] = {}
        self._store = None
        self._lock = threading.Lock()
        self.fixtures_for = plan.fixtures_for
        self.inputs_done = threading.Event()   # the fixtures and models rows are written (or failed): _write_inputs
        self.inputs_ok = False

    def skey_of(self, host: str) -> str:
        """The session key `host` runs under in this run."""
        return session_key(self.sessions[host])

    def input_store(self) -> tuple[str, dict] | None:
        """(path, {fixture_id: offset}): every input tensor written once to a temporary file, in a folder of the
        tables root named with its owner (a killed run's is removed by the next one: tables.clean_stale_parts).
        None when it cannot be written (a full disk): the inputs then travel in each job's payload."""
        with self._lock:
            if self._store is None:
                import shutil
                import tempfile

                d = None
                try:
                    self.root.mkdir(parents=True, exist_ok=True)
                    d = tempfile.mkdtemp(prefix=f".inputs.{owner_tag()}.", suffix=".tmp", dir=self.root.resolve())
                    path = Path(d) / "inputs.bin"
                    offsets, off = {}, 0
                    with open(path, "wb") as fh:
                        for fx in self.fixtures:
                            raw = W.tensor_bytes(fx.array)
                            offsets[fx.fixture_id] = off
                            fh.write(raw)
                            off += len(raw)
                    self._store = (str(path), offsets)
                except OSError:
                    if d is not None:
                        shutil.rmtree(d, ignore_errors=True)
                    self._store = False
            return self._store or None

    def cleanup(self) -> None:
        with self._lock:  # waits for a store still being written while a worker started
            if self._store:
                import shutil

                shutil.rmtree(Path(self._store[0]).parent, ignore_errors=True)
                self._store = None

    def fixture_bytes(self, fx) -> bytes:
        with self._lock:
            b = self._bytes.get(fx.fixture_id)
            if b is None:
                b = self._bytes[fx.fixture_id] = W.tensor_bytes(fx.array)
            return b


def run_hosts(host_names, variants, fixtures, session=None, hosts_file=None, require_providers=False,
              allow_version_mismatch=False, progress=True, tables_root=TABLES_DIR, jobs=None,
              preprocess: dict | None = None, raise_on_error: bool = True) -> RunSummary:
    """Run every variant on every fixture it accepts, on every named host; returns a RunSummary.

    `host_names`: names (see registry.resolve_hosts) or HostSpecs. `variants`: objects
    with .name, .path, .model, .recipe (or VariantInfos). `fixtures`: quantbench.fixtures.Fixture
    list; a variant runs the fixtures whose input name and shape match its single input.
    plan_run, then run_plan (which see).
    """
    worker_slots(jobs)  # a bad jobs fails before anything else
    plan = plan_run(host_names, variants, fixtures=fixtures, session=session, hosts_file=hosts_file)
    return run_plan(plan, require_providers=require_providers, allow_version_mismatch=allow_version_mismatch,
                    progress=progress, tables_root=tables_root, jobs=jobs, preprocess=preprocess,
                    raise_on_error=raise_on_error)


def run_plan(plan: RunPlan, require_providers=False, allow_version_mismatch=False, progress=True,
             tables_root=TABLES_DIR, jobs=None, preprocess: dict | None = None,
             raise_on_error: bool = True) -> RunSummary:
    """Run a plan (plan_run): writes the fixtures, models, hosts and outputs tables under `tables_root`.
    Finished work is skipped (cache by run_key); every finished result is kept when something fails,
    and then RunFailed (a UserError) is raised after all hosts ended (unless raise_on_error=False: the
    errors are in the summary)."""
    slots = worker_slots(jobs)
    sessions = plan.sessions or {s.name: deployed_session(s, plan.session, h.recorded_session())
                                 for s, h in zip(plan.specs, plan.hosts)}
    ctx = _Context(plan, sessions, tables_root, require_providers, allow_version_mismatch, progress)
    for host in plan.hosts:  # an imported file must hold some of this run (one that holds none must not
        if not host.runs_workers:  # join a class unmeasured)
            check_coverage(host, ctx)
    summary = RunSummary(_run_all(plan, ctx, slots, preprocess), ctx.variants, [fx.fixture_id for fx in ctx.fixtures],
                         sessions, ctx.root)
    if summary.errors and raise_on_error:
        first = summary.errors[0]
        more = f" (and {len(summary.errors) - 1} more)" if len(summary.errors) > 1 else ""
        raise RunFailed(f"{first}{more}; finished results are kept in {ctx.root}, rerun to resume", summary)
    return summary


def _host_specs(host_names, hosts_file) -> list[HostSpec]:
    """HostSpecs in the order given, each host once: specs as they are, names looked up (registry.resolve_hosts)."""
    names = [h for h in host_names if not isinstance(h, HostSpec)]
    by_name = {s.name: s for s in (resolve_hosts(names, hosts_file) if names else [])}
    once: dict[str, HostSpec] = {}
    for h in host_names:
        if isinstance(h, HostSpec) or h.strip():
            spec = h if isinstance(h, HostSpec) else by_name[h.strip()]
            once.setdefault(spec.name, spec)
    return list(once.values())


def _ready(host) -> None:
    ok, msg = host.ready()
    if not ok:
        raise UserError(f"host {host.name}: {msg}")
    host.ready_checked = True  # its workers start from this object without asking again


def _write_inputs(ctx: _Context, preprocess: dict | None) -> None:
    """The fixtures and models rows of this run (the outputs rows will refer to them: see _Writer)."""
    # Fixtures are keyed by their tensor hash: one already in the table is not written again
    # (its ~200 KB tensor would only make a duplicate part that readers drop).
    try:
        have = set(tables.read("fixtures", root=ctx.root, columns=["fixture_id"]).column("fixture_id").to_pylist())
        new = [fx for fx in ctx.fixtures if fx.fixture_id not in have]
        if new:
            tables.append_chunks("fixtures", fixtures_chunks(
                new, lambda fx: preprocess or getattr(fx, "preprocess", None) or {}), root=ctx.root)
        tables.append("models", [vi.row() for vi in ctx.variants], root=ctx.root, ledger=True)
        ctx.inputs_ok = True
    finally:
        ctx.inputs_done.set()


def _join_all(threads, runs) -> None:
    """Wait for the hosts' threads, then for every extra worker any of them was granted (a worker ending
    may grant another host one, so until none is left). After kill() each ends at its next step."""
    for th in threads:
        th.join()
    while any([r.join_workers() for r in runs if isinstance(r, _HostRun)]):
        pass


def _run_all(plan: RunPlan, ctx: _Context, slots: int, preprocess: dict | None) -> list[HostSummary]:
    """Each host in its own thread, in the order named: hosts that run workers share the scheduler's
    slots; imported hosts merge their file. The fixtures and models rows are written meanwhile.
    Returns the hosts' summaries in that order."""
    sched = _Scheduler(slots)
    runs = [_HostRun(spec, host, ctx, i, sched) if host.runs_workers else _ImportedRun(host, ctx)
            for i, (spec, host) in enumerate(zip(plan.specs, plan.hosts))]
    sched.runs = [r for r in runs if isinstance(r, _HostRun)]
    threads = [threading.Thread(target=r.run, daemon=True) for r in runs]
    writing, inputs_written = ThreadPoolExecutor(1, thread_name_prefix="input-tables"), None
    try:
        for th in threads:
            th.start()
        # Written while the first workers start (nothing reads these tables during the run; the run
        # ends only once they are complete): a fresh run's fixtures table takes a good part of a second.
        inputs_written = writing.submit(_write_inputs, ctx, preprocess)
        writing.shutdown(wait=False)
        for th in threads:
            while th.is_alive():
                th.join(timeout=0.2)
                sched.rebalance()  # a host's first results make its remaining work measurable
    except KeyboardInterrupt:
        for r in runs:
            r.kill()
        raise
    finally:
        inputs_error = inputs_written.exception() if inputs_written else None  # (waits for the tables)
        ctx.inputs_done.set()  # (interrupted before they were written: no writer waits for them)
        _join_all(threads, runs)  # every worker thread ended: nothing writes once run_hosts returned or raised
        ctx.cleanup()
        for name in ("outputs", "hosts", "models", "fixtures"):
            try:  # a slow host leaves a part every few seconds: keep reads fast as the table grows
                tables.maybe_compact(name, ctx.root)
            except Exception:
                pass
    if inputs_error is not None:
        raise inputs_error
    return [r.summary for r in runs]
