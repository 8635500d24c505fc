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

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from quantbench import tensorcode
from quantbench.store import arrowrows, compaction, partread, partwrite
from quantbench.store.resultpaths import TABLES_DIR
from quantbench.errors import ParameterError, UserError, flag_mark
from quantbench.inputs.fixtures import (calibration_labels, fixtures_chunks, fixtures_for_variants, no_fixtures_message,
                                       squeeze_note)
from quantbench.fsutil import canonical_json, owner_tag
from quantbench.hosts import fingerprintcache, shards
from quantbench.runs.cluster import ClusterHostRun, takes as takes_host
from quantbench.hosts.imported import check_coverage, merge_imported, split_by_fingerprint
from quantbench.runs.resultrows import HostRows, failure, host_outcome
from quantbench.hosts.keys import local_ort_version, session_key
from quantbench.hosts.deploy import deployed_session, describe, usable_cores, worker_threads
from quantbench.runs.placement import summary_text as placement_text
from quantbench.hosts.requirements import RequirementConflict, entries_text, for_variant
from quantbench.hosts.registry import HostSpec, make_host, resolve_hosts
from quantbench.runs.scheduling import HostRunState, Scheduler
from quantbench.hosts.setup import first_use_setup
from quantbench.runs.taskloop import Tasks, chunks
from quantbench.runs.workerpool import HostWorkers
from quantbench.inputs.sidecarfile import requirements_of, variant_identity
from quantbench.inputs.modelio import (ModelFacts, fits, load_with_data, model_facts, refuse_non_tensors,
                                       self_contained_bytes)
from quantbench.textfmt import text_table

# --------------------------------------------------------------------------- inputs


@dataclass
class VariantInfo:
    """A variant with its identity computed once: its id (sidecarfile.variant_identity: the semantic hash, with its
    session requirement if any), semantic and raw hashes, model inputs."""

    name: str
    path: Path
    model: str
    recipe: dict
    variant_id: str
    raw_sha256: str
    inputs: dict  # input name -> shape (ints, or None for symbolic dims)
    external_data: bool = False  # its tensors' data lie in files beside it: it travels with them embedded
    outputs: list = field(default_factory=list)  # the graph's output names, in order
    semantic_sha256: str = ""   # the model's semantic hash ("": the variant_id, a variant without requirement)

    def model_bytes(self) -> bytes:
        """The bytes a worker runs: the file's, or with its external data embedded (modelio.self_contained_bytes)."""
        return self_contained_bytes(self.path) if self.external_data else self.path.read_bytes()

    def row(self) -> dict:
        return {"variant_id": self.variant_id, "semantic_sha256": self.semantic_sha256 or self.variant_id,
                "raw_sha256": self.raw_sha256, "model": self.model,
                "variant": self.name, "path": str(self.path), "recipe": canonical_json(self.recipe or {})}


def variant_info(v, facts: ModelFacts | None = None) -> VariantInfo:
    """Any object with .name, .path, .model, .recipe (quantbench.inputs.variantdir.Variant) -> VariantInfo (a VariantInfo
    as it is). `facts`: v.path's modelio.ModelFacts, when the caller has them (else modelio.model_facts)."""
    if isinstance(v, VariantInfo):
        return v
    path = Path(v.path)
    facts = facts if facts is not None else model_facts(path)
    vid = getattr(v, "variant_id", None) or variant_identity(facts.semantic_sha256, requirements_of(v))
    return VariantInfo(name=str(v.name), path=path, model=str(getattr(v, "model", "") or path.stem),
                       recipe=dict(getattr(v, "recipe", None) or {}), variant_id=vid,
                       raw_sha256=facts.raw_sha256, inputs=dict(facts.inputs),
                       external_data=bool(facts.external_data), outputs=list(facts.outputs),
                       semantic_sha256=facts.semantic_sha256)


def _fits(fx, vi: VariantInfo) -> bool:
    return fits(fx.input_name, list(fx.array.shape), vi.inputs)


@dataclass
class RunPlan:
    """A run worked out once, before anything runs or is written (plan_run): its hosts, each variant's
    identity, which fixtures fit which variant, its run id."""

    specs: list            # HostSpecs, each host once, in the order named
    hosts: list            # their host objects (registry.make_host), made once
    asked: list            # [(variant as asked, its VariantInfo)]: every variant asked for
    variants: list         # the distinct VariantInfos (by variant_id), in the order asked
    fixtures: list         # each fixture once
    fixtures_for: dict     # variant_id -> the fixtures that fit it
    session: dict | None   # the session options as given (overrides for every host)
    #: host name -> the normalised session it runs under (its deployed session, then `session`)
    sessions: dict = field(default_factory=dict)
    run_id: str | None = None
    limit: int | None = None
    labels: str | None = None   # the labels the fixtures were made from (None: the bundled corpus)
    images: str | None = None
    shard: dict | None = None   # the shard this run is (shards.select): K, N, fixture set, its fixture ids
    notes: list = field(default_factory=list)  # e.g. an imported host split by fingerprint
    models: dict = field(default_factory=dict)  # variant_id -> its parsed ModelProto (plan_run(keep_models=True))

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]


def plan_run(hosts, variants, *, fixtures=None, labels=None, images=None, split: str | None = "eval",
             limit: int | None = None, sidecar: dict | None = None, session: dict | None = None, hosts_file=None,
             command: str | None = None, check_hosts: bool = True, check_variant=None, shard=None,
             keep_models: bool = False) -> RunPlan:
    """Everything a run needs, each model file parsed once: the hosts (made once; each ready, unless
    `check_hosts` is False), each variant's info, the fixtures (given, or made from `labels`/`images`/`split`/
    `limit`: without labels, the ones the variants were calibrated with) and which fit which variant, the run
    id (`command` names the run; None: no id). `check_variant(variant, output_names)` runs on every variant
    before its fixtures are made (e.g. a decoder check); `shard` ('K/N' or shards.Shard): only that shard of the
    fixtures (hosts/shards.py); `keep_models`: the parsed models stay on the plan (`models`, for a caller that
    reads the graph itself: the explain commands). Nothing is written."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ParameterError("limit", "must be at least 1", limit)
    shard = shards.parse_shard(shard)
    specs = _host_specs(hosts, hosts_file)
    specs, made, notes = split_by_fingerprint(specs, [make_host(spec) for spec in specs])
    if check_hosts:
        for host in made:
            _ready(host)
    if not variants:
        raise UserError(f"no model variants to run; run `quantbench calibrate` first or pass {flag_mark('variants')}")
    # each file parsed at most once: for its graph (keep_models), else only when its facts are not remembered
    loaded = [load_with_data(Path(v.path)) if keep_models and not isinstance(v, VariantInfo) else None
              for v in variants]
    facts = [None if isinstance(v, VariantInfo) else model_facts(v.path, lw) for v, lw in zip(variants, loaded)]
    for v, f in zip(variants, facts):   # before any write: a ZipMap output has no tensor bytes to hash
        if f is not None:
            refuse_non_tensors(f.not_tensors, v.path)
    if check_variant is not None:
        for v, f in zip(variants, facts):
            check_variant(v, v.outputs if f is None else list(f.outputs))
    if fixtures is None:
        if not labels:
            labels, images = calibration_labels(variants, images)
        fixtures, _ = fixtures_for_variants(variants, labels, images, split, limit, sidecar, facts=facts)
        if not fixtures:
            raise UserError(no_fixtures_message(labels, split))
        notes = notes + [n for n in [squeeze_note(fixtures)] if n]
    asked = [(v, variant_info(v, f)) for v, f in zip(variants, facts)]
    fixtures, shard_record = shards.select(fixtures, shard)
    plan = _plan_fixtures(specs, made, asked, fixtures, session, limit)
    plan.labels, plan.images, plan.shard, plan.notes = labels, images, shard_record, notes
    if keep_models:
        plan.models = {vi.variant_id: lw[0] for (_, vi), lw in zip(asked, loaded) if lw is not None}
    plan.sessions = {s.name: deployed_session(s, session, h.recorded_session()) for s, h in zip(specs, made)}
    if command is not None:
        plan.run_id = arrowrows.run_id_of(command=command, hosts=plan.names, session=plan.sessions,
                                       variants=sorted(str(v.path) for v in variants),
                                       fixtures=sorted(fx.fixture_id for fx in fixtures))
    return plan


def _plan_fixtures(specs, made, asked, fixtures, session, limit) -> RunPlan:
    """The plan's variants (each identity once: one model under two session requirements is two) and fixtures (each
    once); every variant fits one."""
    if not fixtures:
        raise UserError(f"no fixtures to run; check {flag_mark('fixtures')}/{flag_mark('split')}/{flag_mark('limit')}")
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


# --------------------------------------------------------------------------- cores


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
    #: why the host's runtime cannot start on its CPU (a result, recorded in the hosts table; "": it started)
    does_not_start: str = ""
    #: variant_id -> why this host's runtime cannot run that variant (no kernel for an op, a provider failing on it)
    cannot_run: dict = field(default_factory=dict)
    #: an imported host: the (fingerprint_id, session_key, variant_id, fixture_id) its files hold (None: not one);
    #: an analysis takes no other rows of it (an earlier import's rows fill no gap)
    held: set | None = None
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
        out += [f"session requirement {vi.model}/{vi.name}: {entries_text(requirements_of(vi))}, added to every "
                "host's session for it" for vi in self.variants if requirements_of(vi)]
        return out


class RunFailed(UserError):
    """Some host/variant/fixture failed; every finished result was kept (see .summary)."""

    def __init__(self, message: str, summary: RunSummary):
        super().__init__(message)
        self.summary = summary


# --------------------------------------------------------------------------- the run




class _HostRun:
    """One host that runs workers, top-down: its fingerprint (remembered, or its first worker's) and plan
    (resultrows.HostRows), then its first worker runs the tasks while free slots start more
    (workerpool.HostWorkers). Its run state (scheduling.HostRunState) is what the scheduler asks."""

    #: an extra worker pays when the work it would share outlasts this many of its start-ups
    STARTUP_FACTOR = 1.0

    def __init__(self, spec: HostSpec, host, ctx: "_Context", position: int, sched: Scheduler):
        self.spec, self.host, self.ctx, self.position, self.sched = spec, host, ctx, position, sched
        self.summary = HostSummary(spec.name, spec.kind)
        #: core slots each worker takes: its threads, at most every slot (a 4-thread guest on 2 cores takes both)
        cores = min(worker_threads(ctx.sessions[spec.name]), sched.slots)
        self.state = HostRunState(self.summary, cores=cores, uses_local_slot=host.uses_local_cores, grant=self.grant,
                                  startup_factor=self.STARTUP_FACTOR)
        self.rows = HostRows(spec, host, ctx, self.summary, self.state.lock)   # owns the host's session and its key
        self.workers = HostWorkers(self.state, self.rows, host, sched)
        self.holds_first_slot = False

    @property
    def stop(self):
        return self.state.stop

    def kill(self) -> None:
        """Stop every worker of this host now (interrupt): finished results are already buffered."""
        self.workers.kill()

    def grant(self) -> None:
        """Start one more worker (the scheduler gave this host a slot): HostWorkers.grant."""
        self.workers.grant()

    def join_workers(self) -> bool:
        """Wait for the extra workers' threads; False when none was left to wait for."""
        return self.workers.join()

    def _plan(self, fid: str) -> list:
        """[(variant, fixtures not yet in the tables under fid)]; counts the cached ones (HostRows.plan)."""
        return self.rows.plan(fid)

    # -- the host's thread

    def run(self) -> None:
        try:
            with host_outcome(self.state, self.rows):
                self._run()
        finally:
            if self.ctx.confirm is not None:   # nobody waits for this host's outputs any more
                self.ctx.confirm.end(self.spec.name)

    def _run(self) -> None:
        """The remembered fingerprint first (nothing to start when it holds every result), then a first slot."""
        try:
            key = fingerprintcache.cache_key(self.host, self.rows.session, self.ctx.require_providers)
        except Exception:  # the cache is an optimisation: never a reason to fail
            key = None
        hit = fingerprintcache.lookup(key)
        planned = None  # (fingerprint id, its plan) when the remembered fingerprint was adopted
        if hit is not None:
            # Every result cached under the remembered fingerprint: nothing to start.
            self.rows.adopt(*hit)
            planned = (hit[1], self._plan(hit[1]))
            if not planned[1]:
                self.summary.fingerprint_cached = True
                self._register(*hit)
                return
        if not self.sched.first_slot(self.state):
            return
        self.holds_first_slot = True
        try:
            self._run_workers(key, planned)
        finally:
            self._free_first_slot()
            self.host.close_connection()

    def _take_slot(self) -> None:
        """A first slot again (after a wait of equiv's confirm that gave it back), ahead of the hosts that have not
        started: its worker is up already (else a one-core host waits behind every emulated host's whole run)."""
        if not self.holds_first_slot and self.sched.first_slot(self.state, front=True):
            self.holds_first_slot = True

    def _register(self, fp: dict, fid: str) -> None:
        """This run's fingerprint of the host, and its measured outputs of the confirming fixtures already in the
        tables, to equiv's confirm (runs.confirmboard; nothing without one)."""
        board = self.ctx.confirm
        if board is not None:
            board.register(self.spec.name, fp, self.rows.session)
            board.saw(self.rows.measured_rows(fid, board.first))

    def _confirm_first(self, work: list) -> tuple[list, dict]:
        """(the work to run now: every confirming fixture first, then the rest of the variants this host is not
        predicted on; per predicted variant_id its other fixtures, run only if the confirming ones differ)."""
        board = self.ctx.confirm
        if board is None:
            return work, {}
        anchors = board.anchors_of(self.spec.name, pause=self._free_first_slot, resume=self._take_slot)
        now, tail, later = [], [], {}
        for vi, fxs in work:
            first = set(board.first.get(vi.variant_id, ()))
            conf, rest = [fx for fx in fxs if fx.fixture_id in first], [fx for fx in fxs if fx.fixture_id not in first]
            now += [(vi, conf)] if conf else []
            if vi.variant_id in anchors:
                later[vi.variant_id] = (vi, rest)
            elif rest:
                tail.append((vi, rest))
        return now + tail, later

    def _unconfirmed(self, later: dict) -> list:
        """The work of the predicted variants whose confirming fixtures differ from their anchor's (waits for the
        anchors' outputs with the slot given back)."""
        if not later:
            return []
        verdicts = self.ctx.confirm.verdicts_of(self.spec.name, pause=self._free_first_slot, resume=lambda: None)
        return [later[v] for v, ok in verdicts.items() if not ok and later[v][1]]

    def _free_first_slot(self) -> None:
        """The first worker is done: its slot goes back to the pool (the busiest host, or nobody), once."""
        if self.holds_first_slot:
            self.holds_first_slot = False
            self.sched.release(self.state)

    def _run_workers(self, key, planned=None) -> None:
        """Start the first worker, fingerprint it, plan, and run tasks (more workers join via grant).
        `planned`: (fingerprint id, plan) already adopted from the fingerprint cache, kept if the worker agrees."""
        ctx = self.ctx
        t0 = time.monotonic()
        if self.host.reads_input_store():  # same filesystem: write the input store while the worker starts
            threading.Thread(target=ctx.input_store, name="input-store", daemon=True).start()
        hs = self.workers.start_and_fingerprint()
        fp, fid = hs.fingerprint, hs.fingerprint_id
        fingerprintcache.store(key, fp, fid)
        self.summary.startup_seconds = time.monotonic() - t0
        try:
            if planned is not None and planned[0] == fid:
                work = planned[1]  # the remembered fingerprint held: adopted and planned already
            else:
                self.rows.adopt(fp, fid)
                work = self._plan(fid)
            self._register(fp, fid)
            work, later = self._confirm_first(work)
            self.summary.planned = sum(len(f) for _, f in work)
            if self.summary.planned:
                self.state.cap_workers(self.host.max_workers(fp))  # e.g. an ssh remote's cores
                self._drive_first(hs, work)
            self._free_first_slot()
            if later:   # every confirming fixture of this host in (its other workers too) before the verdicts
                self.workers.join()
                self.ctx.confirm.settle(self.spec.name)
            rest = self._unconfirmed(later)
            if rest:   # a prediction missed: the same worker runs the rest, on a slot again (its others joined)
                self._take_slot()
                self.summary.planned += sum(len(f) for _, f in rest)
                self._drive_first(hs, rest, sum(len(f) for _, f in rest))
        finally:
            self.workers.join()
            hs.close()  # after the extra workers: the forked ones are its children
        self.rows.writer.flush()
        t_run = self.state.t_run  # when the first worker began its tasks (0: it had none)
        self.summary.run_seconds = time.monotonic() - t_run if t_run else 0.0

    def _drive_first(self, hs, work: list, total: int | None = None) -> None:
        """The first worker runs the host's tasks (`work`, split in tasks; `total` fixtures, default all planned);
        free slots start more meanwhile."""
        total = self.summary.planned if total is None else total
        # Tasks of a few fixtures per variant: enough of them that a worker started later
        # (a slot freed by another host) still finds work to share.
        tasks = Tasks()
        for vi, fxs in chunks(work, max(1, -(-total // (8 * max(self.sched.slots, 1))))):
            tasks.put(vi, fxs)
        self.workers.drive_first(hs, tasks, total, self._progress_bar(total))
        self._free_first_slot()

    def _progress_bar(self, total: int):
        if not self.ctx.progress:
            return None
        from tqdm import tqdm

        return tqdm(total=total, desc=f"{self.spec.name:>10}", position=self.position, leave=True,
                    unit="fixture", file=sys.stderr, dynamic_ncols=True)


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
            self.summary.errors.append(failure(self.host.name, exc))
        finally:
            self.summary.seconds = time.monotonic() - t0

    def kill(self) -> None:
        """Nothing to stop: a merge is one table append per table."""


class _Context:
    def __init__(self, plan: RunPlan, sessions, root, require_providers, progress):
        self.variants = plan.variants
        self.fixtures = plan.fixtures
        self.fixtures_by_id = {fx.fixture_id: fx for fx in plan.fixtures}
        self.sessions = sessions
        self.root = Path(root)
        self.require_providers = require_providers
        self.progress = progress
        self.local_ort = local_ort_version()
        self._bytes: dict[str, bytes] = {}
        self._store = None
        self._lock = threading.Lock()
        self.fixtures_for = plan.fixtures_for
        self.inputs_done = threading.Event()   # the fixtures and models rows are written (or failed): _write_inputs
        self.inputs_ok = False
        self.confirm = None   # equiv's confirm in this run (runs.confirmboard.ConfirmBoard), or None

    def skey_of(self, host: str, vi=None) -> str:
        """The session key `host` runs under in this run (of variant `vi`, its session requirement added; a
        requirement the host's session contradicts keys as the host's own: nothing of it is run)."""
        if vi is None or not requirements_of(vi):
            return session_key(self.sessions[host])
        try:
            return session_key(for_variant(self.sessions[host], vi))
        except RequirementConflict:
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
                            raw = tensorcode.tensor_bytes(fx.array)
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
                b = self._bytes[fx.fixture_id] = tensorcode.tensor_bytes(fx.array)
            return b


def run_hosts(host_names, variants, fixtures, session=None, hosts_file=None, require_providers=False,
              progress=True, tables_root=TABLES_DIR, jobs=None,
              preprocess: dict | None = None, raise_on_error: bool = True) -> RunSummary:
    """Run every variant on every fixture it accepts, on every named host; returns a RunSummary.

    `host_names`: names (see registry.resolve_hosts) or HostSpecs. `variants`: objects
    with .name, .path, .model, .recipe (or VariantInfos). `fixtures`: quantbench.inputs.fixtures.Fixture
    list; a variant runs the fixtures whose input name and shape match its single input.
    plan_run, then run_plan (which see).
    """
    worker_slots(jobs)  # a bad jobs fails before anything else
    plan = plan_run(host_names, variants, fixtures=fixtures, session=session, hosts_file=hosts_file)
    return run_plan(plan, require_providers=require_providers,
                    progress=progress, tables_root=tables_root, jobs=jobs, preprocess=preprocess,
                    raise_on_error=raise_on_error)


def run_plan(plan: RunPlan, require_providers=False, progress=True,
             tables_root=TABLES_DIR, jobs=None, preprocess: dict | None = None,
             raise_on_error: bool = True, cluster=None, confirm=None) -> RunSummary:
    """Run a plan (plan_run): writes the fixtures, models, hosts and outputs tables under `tables_root`.
    Finished work is skipped (cache by run_key); every finished result is kept when something fails,
    and then RunFailed (a UserError) is raised after all hosts ended (unless raise_on_error=False: the
    errors are in the summary). `cluster`: a runs.cluster.Cluster (connect) that runs the hosts it takes.
    `confirm`: equiv's confirm (runs.confirmboard.ConfirmBoard): predicted hosts run their confirming fixtures
    first and the rest only where those differ."""
    slots = worker_slots(jobs)
    sessions = plan.sessions or {s.name: deployed_session(s, plan.session, h.recorded_session())
                                 for s, h in zip(plan.specs, plan.hosts)}
    ctx = _Context(plan, sessions, tables_root, require_providers, progress)
    ctx.confirm = confirm
    for host in plan.hosts:  # an imported file must hold some of this run (one that holds none must not
        if not host.runs_workers:  # join a class unmeasured)
            check_coverage(host, ctx)
    summary = RunSummary(_run_all(plan, ctx, slots, preprocess, cluster), ctx.variants, [fx.fixture_id for fx in ctx.fixtures],
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
    if not ok and first_use_setup(host):  # a runtime of its own, set up at its first use
        ok, msg = host.ready()
    if not ok:
        raise UserError(f"host {host.name}: {msg}")
    host.ready_checked = True  # its workers start from this object without asking again


def _write_inputs(ctx: _Context, preprocess: dict | None) -> None:
    """The fixtures and models rows of this run (the outputs rows will refer to them: see resultrows.Writer)."""
    # Fixtures are keyed by their tensor hash: one already in the table is not written again
    # (its ~200 KB tensor would only make a duplicate part that readers drop).
    try:
        have = set(partread.read("fixtures", root=ctx.root, columns=["fixture_id"]).column("fixture_id").to_pylist())
        new = [fx for fx in ctx.fixtures if fx.fixture_id not in have]
        if new:
            partwrite.append_chunks("fixtures", fixtures_chunks(
                new, lambda fx: preprocess or getattr(fx, "preprocess", None) or {}), root=ctx.root)
        partwrite.append("models", [vi.row() for vi in ctx.variants], root=ctx.root, ledger=True)
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


def _host_run(spec, host, ctx: _Context, i: int, sched: Scheduler, cluster):
    """The run of one host: on the cluster (the ones it takes), with local workers, or an imported file merged."""
    if cluster is not None and takes_host(host):
        return ClusterHostRun(spec, host, ctx, HostSummary(spec.name, spec.kind), cluster)
    return _HostRun(spec, host, ctx, i, sched) if host.runs_workers else _ImportedRun(host, ctx)


def _run_all(plan: RunPlan, ctx: _Context, slots: int, preprocess: dict | None, cluster=None) -> list[HostSummary]:
    """Each host in its own thread, in the order named: hosts that run workers share the scheduler's
    slots (or run on the `cluster`); imported hosts merge their file. The fixtures and models rows are
    written meanwhile. Returns the hosts' summaries in that order."""
    sched = Scheduler(slots)
    runs = [_host_run(spec, host, ctx, i, sched, cluster) for i, (spec, host) in enumerate(zip(plan.specs, plan.hosts))]
    sched.runs = [r.state for r in runs if isinstance(r, _HostRun)]
    for r in runs:   # a host without workers of its own (imported, cluster) neither predicts nor anchors
        if ctx.confirm is not None and not isinstance(r, _HostRun):
            ctx.confirm.end(r.summary.name)
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
        if ctx.confirm is not None:   # a host waiting on another's fingerprint or outputs stops waiting
            ctx.confirm.halt()
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
                compaction.maybe_compact(name, ctx.root)
            except Exception:
                pass
    if inputs_error is not None:
        raise inputs_error
    return [r.summary for r in runs]
