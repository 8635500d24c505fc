"""One worker of one host, through its client: open -> fingerprint -> run -> close.

("Session" is onnxruntime's alone: the options a worker builds its InferenceSession with, worker.SessionOptions;
the client's process connection is process.WorkerConnection.)

The one client of the worker protocol (quantbench/worker/) for every
caller: the runner's workers, the explain commands' workers, `hosts check`.
Like Polygraphy's runners (activate / infer / deactivate), a WorkerClient is a
context manager; the host kind it wraps (local, emulated, ssh) owns how its
worker starts and how a dead worker is explained (`died_message`), so no caller
branches on the kind or translates a dead connection itself.
"""

from __future__ import annotations

from quantbench.errors import UserError
from quantbench import tensorcode
from quantbench.hosts.keys import fixture_entry, model_entry, probe_job, request_header
from quantbench.hosts.process import DoesNotStart, WorkerDied
from quantbench.hosts.registry import make_host


class JobFailed(UserError):
    """A worker's error frame for one job: which host, at which stage (the worker's JobError: "session",
    "unsupported", "run", "model", ...) and onnxruntime's words. A caller that can make a result of it (a remedy
    onnxruntime cannot build) catches it; anyone else sees one line like any UserError."""

    def __init__(self, host: str, stage: str, message: str):
        UserError.__init__(self, f"host {host}: worker {stage} error: {message}")
        self.host, self.stage, self.detail = host, stage, message

    @property
    def cannot_run(self) -> bool:
        """onnxruntime on that host cannot make this session (as asked, or with the variant's required entries) or
        has no kernel for it: a result about the host, not a failure of the caller's job."""
        return self.stage in ("session", "unsupported", "requirement")

    @property
    def why(self) -> str:
        """onnxruntime's words, on one line, without the worker's lead-in."""
        return " ".join(self.detail.split()).removeprefix("could not create the session: ")


class WorkerClient:
    """A started, fingerprinted worker of `spec` (a quantbench.hosts.registry.HostSpec).

    `session` is the normalised session the fingerprint is taken under; `label`
    names the host in errors (the explain commands' NAME+KEY=VALUE); `host`: the host object of
    `spec` when the caller made it already (registry.make_host; made here otherwise).
    """

    def __init__(self, spec, session: dict | None = None, require_providers: bool = False, label: str | None = None,
                 host=None):
        self.host = host if host is not None else make_host(spec)
        if not self.host.runs_workers:
            raise UserError(f"host {label or spec.name}: an imported host cannot run new jobs; "
                            "name a local, emulated or ssh host")
        self.spec, self.session, self.require_providers = spec, dict(session or {}), require_providers
        self.label = label or spec.name
        self.client = None
        self.fingerprint: dict | None = None
        self.fingerprint_id = ""
        self.providers: list = []
        self.provider_problems: list = []
        self.frame: dict | None = None  # the whole fingerprint frame (info, timings)

    # -- lifecycle

    def open(self) -> "WorkerClient":
        """Start the worker (unless forked) and fingerprint it; a worker that dies on the way is one UserError
        (DoesNotStart when its runtime cannot start on the host's CPU)."""
        try:
            if self.client is None:  # (a forked worker is already running)
                self.client = self.host.start()  # sending the worker's source can already meet a dead connection
            model, fixtures, parts = probe_job()
            for h, _ in self.run_job(parts, model=model, fixtures=fixtures, kind="fingerprint"):
                if h.get("type") == "fingerprint":
                    self.frame = h
                elif h.get("type") == "error":
                    raise UserError(f"host {self.label}: {h.get('message')}")
        except WorkerDied as exc:
            self.kill()
            reason = self.host.start_failure(exc)
            if reason:
                raise DoesNotStart(self.label, reason) from None
            raise UserError(self.host.died_message(exc)) from None
        except BaseException:
            self.kill()
            raise
        if self.frame is None:
            self.kill()
            raise UserError(f"host {self.label}: the worker sent no fingerprint")
        self.fingerprint, self.fingerprint_id = self.frame["fingerprint"], self.frame["fingerprint_id"]
        problem = self.host.fingerprint_problem(self.fingerprint)
        if problem:
            self.kill()
            raise UserError(f"host {self.label}: {problem}")
        self.providers = self.fingerprint["identity"].get("resolved_providers", [])
        return self

    def fork(self) -> "WorkerClient":
        """Another worker of this host forked from this idle one (WorkerConnection.fork: it starts warm);
        open() then fingerprints it like a started one."""
        child = WorkerClient(self.spec, self.session, self.require_providers, self.label, host=self.host)
        try:
            child.client = self.client.fork()
        except WorkerDied as exc:
            raise UserError(self.host.died_message(exc)) from None
        return child

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def kill(self) -> None:
        if self.client is not None:
            self.client.kill()

    def __enter__(self) -> "WorkerClient":
        return self.open() if self.fingerprint is None else self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- jobs

    def run_job(self, parts, *, model: dict, fixtures: list, kind: str = "run", session: dict | None = None,
                require_providers: bool | None = None, **fields):
        """One request to this worker (keys.request_header: `model`, `fixtures` and `fields` as it takes them;
        the session and fallback are this session's unless given), its frames as they come. The one way
        every caller (the runner's tasks, the explain commands, the fingerprint) talks to a worker; a dead
        worker raises WorkerDied (the caller knows which job it was)."""
        header = request_header(kind, self.spec.name, self.session if session is None else session,
                                self.require_providers if require_providers is None else require_providers, model, fixtures,
                                **fields)
        return self.client.request(header, parts)

    def frames(self, parts, **request):
        """The worker's frames for one request (run_job); an error frame or a dead worker is one UserError."""
        try:
            answers = self.run_job(parts, **request)
            for h, p in answers:
                if h.get("type") == "error":
                    for _ in answers:   # read up to its "done": the next request must not read this one's end
                        pass
                    raise JobFailed(self.label, str(h.get("stage")), str(h.get("message")))
                yield h, p
        except WorkerDied as exc:
            raise UserError(self.host.died_message(exc)) from None

    def run(self, model: bytes, fixtures, session: dict | None = None, output_names=None,
            return_tensors=False, repeat: int = 1) -> list[dict]:
        """One result per fixture (per repeat): {"fixture_id", "repeat", "outputs": {name: {sha256, dtype, shape, array?}}}."""
        parts, entries, off = [model], [], len(model)
        for fx in fixtures:
            b = tensorcode.tensor_bytes(fx.array)
            entries.append(fixture_entry(fx.fixture_id, fx.input_name, fx.array, off, len(b)))
            parts.append(b)
            off += len(b)
        extra = {"output_names": list(output_names)} if output_names else {}
        request = dict(model=model_entry(model), fixtures=entries, session=session or None,
                       return_tensors=return_tensors, repeat=int(repeat), **extra)
        results = []
        self.provider_problems = []  # of this run: what it did not honour of its provider request (worker)
        for h, p in self.frames(parts, **request):
            for problem in h.get("provider_problems") or []:
                if problem not in self.provider_problems:
                    self.provider_problems.append(problem)
            if h.get("type") != "result":
                continue
            outs = {}
            for o in h["outputs"]:
                d = {"sha256": o["sha256"], "dtype": o["dtype"], "shape": o["shape"]}
                if "offset" in o:
                    d["array"] = tensorcode.tensor_from_bytes(p[o["offset"]:o["offset"] + o["nbytes"]], o["dtype"],
                                                     o["shape"]).copy()
                outs[o["name"]] = d
            results.append({"fixture_id": h["fixture_id"], "repeat": h.get("repeat", 0), "outputs": outs,
                            "seconds": h.get("seconds")})
        return results
