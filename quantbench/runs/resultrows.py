"""A host's results, as rows: its fingerprint adopted (the hosts row), what is left to run under it (the
run keys not yet in the outputs table), each result frame turned into outputs rows, and the writer that
appends them as table parts.

Every executor of a run's host writes through this one path: the local workers' task loop
(runs/taskloop.py) and the cluster executor (runs/cluster.py), so a result reads the same in
the tables whichever machine computed it.
"""

from __future__ import annotations

import re
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from quantbench.store import partread, partwrite
from quantbench.errors import ParameterError, UserError
from quantbench.fsutil import canonical_json
from quantbench.hosts.keys import hosts_row, not_started_row, run_key, session_key, session_options
from quantbench.runs.placement import note_placement
from quantbench.hosts.requirements import RequirementConflict, entries_text, for_variant
from quantbench.inputs.sidecarfile import requirements_of
from quantbench.hosts.process import DoesNotStart

FLUSH_SECONDS = 2.0
FLUSH_ROWS = 512


class Writer:
    """Buffers output rows of finished fixtures and appends them as table parts.

    Nothing is appended before the run's fixtures and models rows are (`ctx.inputs_done`), and
    nothing at all if writing them failed (a full disk): an outputs row never refers to a fixture
    the tables lack. The first failed append is raised once; the rows after it are dropped (the
    rerun computes them), so a full disk is one error, not one per result.
    """

    def __init__(self, ctx):
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
                partwrite.append("outputs", rows, root=self.root)
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
    t = partread.read("outputs", root=root, columns=["run_key"],
                    filter={"host": host, "fingerprint_id": fingerprint_id, "session_key": skey})
    return set(t.column("run_key").to_pylist())


class VariantSession:
    """The session one variant runs under on one host: the host's, its session requirement added
    (hosts/requirements.py): the session, its JSON and key (recorded with every result of it there)."""

    def __init__(self, session: dict):
        options = session_options(session)
        self.session, self.json, self.key = options.wire(), options.json(), options.key()


class HostRows:
    """One host's rows in a run: `spec` and `host` (its host object: the version policy), the run's context
    (`ctx`: variants, fixtures, session, tables root), the host's summary (counts, notes, errors) and the lock
    that guards it."""

    def __init__(self, spec, host, ctx, summary, lock):
        self.spec, self.host, self.ctx, self.summary, self.lock = spec, host, ctx, summary, lock
        #: the session this host runs under (hosts.deploy.deployed_session): its JSON and key go in every row
        self.session = ctx.sessions[spec.name]
        self.session_json, self.skey = canonical_json(self.session), session_key(self.session)
        summary.session, summary.session_key = self.session, self.skey
        self.writer = Writer(ctx)
        self.fingerprint_id = ""
        self._variant_sessions: dict = {}

    def variant_session(self, vi) -> VariantSession:
        """The session variant `vi` runs under on this host (its requirement added); RequirementConflict when the
        host's own session sets a required key to another value."""
        got = self._variant_sessions.get(vi.variant_id)
        if got is None:
            got = self._variant_sessions[vi.variant_id] = VariantSession(for_variant(self.session, vi)) \
                if requirements_of(vi) else VariantSession(self.session)
        return got

    def job_session(self, vi) -> dict | None:
        """The session a job of `vi` sends its worker: None when it is the host's own (the worker's default)."""
        vs = self.variant_session(vi)
        return None if vs.key == self.skey else vs.session

    def adopt(self, fp: dict, fid: str) -> None:
        """Take `fid` as this host's fingerprint: the host's version policy, the hosts row (written once)."""
        ctx = self.ctx
        self.fingerprint_id = fid
        self.summary.fingerprint_id = fid
        ort_v = fp["identity"].get("onnxruntime", {}).get("version", "")
        note = self.host.version_policy(ort_v, ctx.local_ort)
        if note and note not in self.summary.notes:
            self.summary.notes.append(note)
        partwrite.append("hosts", [hosts_row(self.spec.name, self.spec.kind, fp, fid)], root=ctx.root, ledger=True)

    def plan(self, fid: str) -> list:
        """[(variant, fixtures not yet in the tables under fid)]; counts the cached ones."""
        ctx = self.ctx
        done: dict = {}
        work, cached = [], 0
        for vi in ctx.variants:
            try:
                skey = self.variant_session(vi).key
            except RequirementConflict as exc:  # the host cannot apply the variant's requirement: a result
                self.cannot_run(vi, str(exc), requirement=True)
                continue
            if skey not in done:
                done[skey] = done_run_keys(self.spec.name, fid, skey, ctx.root)
            todo = [fx for fx in ctx.fixtures_for[vi.variant_id]
                    if run_key(vi.variant_id, fx.fixture_id, fid, skey) not in done[skey]]
            cached += len(ctx.fixtures_for[vi.variant_id]) - len(todo)
            if todo:
                work.append((vi, todo))
        self.summary.cached = cached
        self.summary.planned = sum(len(t) for _, t in work)
        return work

    def measured_rows(self, fid: str, wanted: dict) -> list[dict]:
        """This host's measured outputs rows (hashes) under `fid` and each variant's session of the fixtures
        `wanted` (variant_id -> fixture ids) already in the tables."""
        fixtures = sorted({f for fids in wanted.values() for f in fids})
        if not fixtures:
            return []
        t = partread.read("outputs", root=self.ctx.root, columns=["host", "variant_id", "fixture_id", "output_name",
                                                                  "sha256", "session_key", "inherited"],
                          filter={"host": self.spec.name, "fingerprint_id": fid, "fixture_id": fixtures})
        keys = {}
        for vi in self.ctx.variants:
            try:
                keys[vi.variant_id] = self.variant_session(vi).key
            except RequirementConflict:
                continue
        return [r for r in t.to_pylist() if r["inherited"] is None and r["fixture_id"] in wanted.get(r["variant_id"], ())
                and keys.get(r["variant_id"]) == r["session_key"]]

    def rows(self, vi, h: dict, payload: bytes, state: dict) -> list[dict]:
        """The outputs rows of one result frame `h` (under this host's fingerprint and session); `state`: its
        job's providers and placement (frame)."""
        fid = h["fixture_id"]
        vs = self.variant_session(vi)
        rk = run_key(vi.variant_id, fid, self.fingerprint_id, vs.key)
        rows = []
        for o in h["outputs"]:
            tensor = payload[o["offset"]:o["offset"] + o["nbytes"]] if "offset" in o else None
            rows.append({"run_key": rk, "host": self.spec.name, "fingerprint_id": self.fingerprint_id,
                         "session_key": vs.key, "session_options": vs.json,
                         "variant_id": vi.variant_id, "variant": vi.name, "fixture_id": fid,
                         "output_name": o["name"], "dtype": o["dtype"], "shape": o["shape"], "sha256": o["sha256"],
                         "tensor": tensor, "providers": state["providers"], "placement": state["placement"]})
        return rows

    def frame(self, vi, h: dict, p: bytes, state: dict) -> None:
        """Count one frame of a job in the summary (a result also as outputs rows, to the writer); `state`
        (start a job with new_state()) keeps the providers that ran its nodes (placement.note_placement: from
        the run's profile, once the session's first run is done). An "error" frame is left to the caller."""
        summary, t = self.summary, h.get("type")
        if t == "session":
            state["providers"] = h["providers"]
            with self.lock:
                summary.sessions_reused += 1 if h.get("reused") else 0
                summary.session_seconds += h.get("session_seconds", 0.0)
        if h.get("placement") is not None:
            with self.lock:
                note_placement(summary, f"{vi.model}/{vi.name}", self.session["providers"], h, state)
        if t == "verified":  # input hashing time, spent on the worker's helper thread
            with self.lock:
                summary.verify_seconds += h.get("verify_seconds", 0.0)
        elif t == "result":
            rows = self.rows(vi, h, p, state)
            self.writer.add(rows)
            if getattr(self.ctx, "confirm", None) is not None:   # equiv's confirm compares them in the run
                self.ctx.confirm.saw(rows)
            with self.lock:
                summary.ran += 1
                summary.infer_seconds += h.get("seconds", 0.0)
                summary.infer_each.append(h.get("seconds", 0.0))

    @staticmethod
    def new_state() -> dict:
        """A job's frame state: the providers that ran its nodes and its placement JSON (frame fills them)."""
        return {"providers": [], "placement": None}

    def error(self, msg: str) -> None:
        with self.lock:
            self.summary.errors.append(msg)

    def does_not_start(self, exc: DoesNotStart) -> None:
        """This host's runtime cannot start on its CPU: a result, noted and recorded in the hosts table."""
        self.summary.does_not_start = exc.reason
        self.summary.notes.append(str(exc))
        partwrite.append("hosts", [not_started_row(self.spec.name, self.spec.kind, exc.reason, self.host.describe())],
                         root=self.ctx.root, ledger=True)

    def cannot_run(self, vi, message: str, requirement: bool = False) -> None:
        """This host's runtime cannot run variant `vi` (an "unsupported" error frame; `requirement`: a "requirement"
        one, its session requirement could not be applied): a result, noted once."""
        why = _reason(message)
        if requirement:   # the worker could not make the session with the variant's required entries
            why = f"session requirement {entries_text(requirements_of(vi))} not applied: {why}"
        with self.lock:
            if vi.variant_id not in self.summary.cannot_run:
                self.summary.cannot_run[vi.variant_id] = why
                self.summary.notes.append(f"host {self.spec.name} cannot run variant {vi.name}: {why}")


@contextmanager
def host_outcome(state, rows):
    """What every executor of a host does around its work (a local run's or a cluster's; `state`: the host's
    scheduling.HostRunState, `rows`: its HostRows): a failure becomes the host's one error line (the other hosts
    go on), a runtime that cannot start its result; its rows are flushed, its progress bar closed and its
    seconds counted."""
    t0 = time.monotonic()
    try:
        yield
    except DoesNotStart as exc:  # a result for this host, not a failure
        rows.does_not_start(exc)
    except Exception as exc:  # keep the other hosts going; report this one
        rows.error(failure(rows.spec.name, exc))
    finally:
        rows.writer.flush()
        state.close_bar()
        rows.summary.seconds = time.monotonic() - t0


def _reason(message: str, limit: int = 360) -> str:
    """onnxruntime's error in one short line: its status and message, without the wrappers before them."""
    text = " ".join(re.sub(r"^.*?\[ONNXRuntimeError\] : \d+ : ", "", message, count=1).split())
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


def failure(host: str, exc: Exception) -> str:
    """One error line for a host that failed: a UserError as it reads (prefixed with the host), else the type."""
    if isinstance(exc, UserError):
        return summary_message(exc) if str(exc).startswith("host ") else f"host {host}: {summary_message(exc)}"
    return f"host {host}: {type(exc).__name__}: {exc}"


def summary_message(exc: UserError) -> str:
    """A UserError's message for a run summary, its flag_mark(param) marks kept: str(RunFailed) shows the parameters'
    names, the CLI their flags (a command prints summary errors through args._render)."""
    return str(exc) if isinstance(exc, ParameterError) else Exception.__str__(exc)
