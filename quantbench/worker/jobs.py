"""The worker's request loop, and its entry: `python jobs.py` (started by path beside its sibling sources) or sent
as source after them (hosts.process.BOOTSTRAP). It reads a whole request before it writes anything (so the parent
never deadlocks on full pipes) and answers with frames ending in {"type": "done"}. A run answers a "session" frame
(its "reused" is true when the worker kept the session from an earlier job of the same model bytes and session
options), one "result" frame per fixture (written by a helper thread within about 20 ms of the result: a killed
worker loses at most that much finished work) and a "verified" frame with the input hashing time; a failure is an
"error" frame naming host, variant and fixture, after which the job stops and the results already sent stand. While
a fingerprint or run job runs, a helper thread (InputWatch, ended with the job) ends the worker if its input's other
end closes: the parent is gone.

A fork ({"type": "fork", "socket": PATH}, same machine only) answers {"type": "forked",
"pid"}: the worker forks, and the child (its own session, every import and, under
qemu-user, every translated block of the parent already in place) connects twice to the
Unix socket PATH, first the protocol stream then its stderr, and serves requests there
until "end" or end of input. The parent ignores SIGCHLD from then on (the kernel reaps
its children). Worker processes run without the helper threads of numpy's BLAS and
onnxruntime's telemetry, so a fork between jobs copies the only thread there is.

Test-only hook (never set in use; costs nothing when unset): with the environment variables
QUANTBENCH_TEST_PAUSE_AFTER=K and QUANTBENCH_TEST_PAUSE_FILE=PATH, a worker process that
has run K fixtures (K result frames) writes and flushes those results, creates
PATH.paused.PID and PATH.paused, each holding its pid, then waits until PATH exists before it goes on. Tests use it
to act on a worker at a known point of a run (kill it after exactly K results), so that
they do not depend on how fast the machine is.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback

#: the worker's sources in load order, each importing only the standard library, numpy, onnxruntime and the ones
#: before it: (module, path relative to this file). A host without quantbench gets them by path or as source.
SOURCES = (("quantbench.tensorcode", "../tensorcode.py"), ("quantbench.worker.protocol", "protocol.py"),
           ("quantbench.worker.session", "session.py"), ("quantbench.worker.fingerprint", "fingerprint.py"))


def install_sources(sources=None) -> None:
    """Make the worker's modules importable by their own names where quantbench is not installed (an emulated root,
    an ssh host, a commissioning kit): `sources` [(module, source bytes)] in SOURCES' order (None: the files beside
    this one), each run once as that module."""
    import types

    if sources is None:
        here = os.path.dirname(os.path.abspath(__file__))
        sources = []
        for module, path in SOURCES:
            with open(os.path.join(here, path), "rb") as fh:
                sources.append((module, fh.read()))
    for package in ("quantbench", "quantbench.worker"):
        if package not in sys.modules:
            sys.modules[package] = types.ModuleType(package)
            sys.modules[package].__path__ = []
    for module, code in sources:
        loaded = types.ModuleType(module)
        sys.modules[module] = loaded   # a dataclass among them looks its module up there
        exec(compile(code, module.rsplit(".", 1)[-1] + ".py", "exec"), loaded.__dict__)


if __name__ == "__main__" or "_SOURCES" in globals():   # a worker process, or a kit or probe running this file
    if __name__ == "__main__":   # no helper threads to lose in a fork (see "fork" above)
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    install_sources(globals().get("_SOURCES"))

import numpy as np  # noqa: E402  (after the sources are in place and the thread settings made)

from quantbench.tensorcode import canonical, tensor_from_bytes, tensor_sha256  # noqa: E402
from quantbench.worker.fingerprint import collect_fingerprint, fingerprint_id  # noqa: E402
from quantbench.worker.protocol import JobError, read_frame, write_frame  # noqa: E402
from quantbench.worker.session import (REQUIRED, available_providers, check_providers, make_session,  # noqa: E402
                                       normalize_session, provider_problems, read_placement, unsupported)


def _test_pause_from_env():
    """(K, PATH) of the test-only pause hook (see the module docstring), or None."""
    k, path = os.environ.get("QUANTBENCH_TEST_PAUSE_AFTER"), os.environ.get("QUANTBENCH_TEST_PAUSE_FILE")
    if not k or not path:
        return None
    return [int(k), path]


_TEST_PAUSE = _test_pause_from_env()


def _model_source(job, payload):
    model = job["model"]
    if "path" in model:
        with open(model["path"], "rb") as fh:
            data = fh.read()
    else:
        data = payload[model["offset"]:model["offset"] + model["nbytes"]]
    want = model.get("sha256")
    if want and hashlib.sha256(data).hexdigest() != want:
        raise JobError("model", "model bytes SHA-256 mismatch (expected %s...)" % want[:12])
    return bytes(data)


_STORES = {}


_VERIFIED = set()


def _store(path: str):
    """A read-only map of an input store file (local hosts: the parent writes every input once per run)."""
    m = _STORES.get(path)
    if m is None:
        import mmap

        with open(path, "rb") as fh:
            m = _STORES[path] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    return m


def _input_item(fx, view, store):
    """(fixture header, array, cache key or None, expected SHA-256) of one input, not yet verified."""
    want = fx.get("sha256") or fx["fixture_id"]
    path = fx.get("file") or store
    try:
        if path:
            src = memoryview(_store(path))
            key = (path, fx["offset"], fx["nbytes"], fx["dtype"], tuple(fx["shape"]), want)
        else:
            src, key = view, None
        if fx["offset"] + fx["nbytes"] > len(src):
            raise ValueError("bytes %d-%d are past the end of the %s (%d bytes)"
                             % (fx["offset"], fx["offset"] + fx["nbytes"], "input store" if path else "request",
                                len(src)))
        arr = tensor_from_bytes(src[fx["offset"]:fx["offset"] + fx["nbytes"]], fx["dtype"], fx["shape"])
    except (OSError, ValueError, TypeError) as exc:
        raise JobError("input", "cannot read the input tensor: %s" % (exc,), fx.get("fixture_id"))
    return fx, arr, key, want


def _verify(fx, arr, key, want) -> None:
    if key is not None and key in _VERIFIED:  # the store is immutable: verified once per worker
        return
    got = tensor_sha256(arr)
    if got != want:
        raise JobError("input", "input tensor SHA-256 mismatch: expected %s, got %s; inputs must be "
                       "byte-identical on every host" % (want, got), fx["fixture_id"])
    if key is not None:
        _VERIFIED.add(key)


def _inputs(job, payload):
    """The job's (fixture header, array) pairs, every input verified first (the fingerprint probe)."""
    view = memoryview(payload)  # zero-copy slices
    items = [_input_item(fx, view, job.get("store")) for fx in job["fixtures"]]
    for item in items:
        _verify(*item)
    return [(fx, arr) for fx, arr, _, _ in items]


class _Verifier:
    """Maps and hashes a job's inputs in order on a helper thread, ahead of the runs.

    hashlib releases the GIL on large buffers and onnxruntime releases it in session
    creation and run, so with the worker's one compute thread the hashing happens on
    another core while the session is built and the first fixtures run (SHA-256 of a
    128x128 input costs about as much as a third of the demo classifier's inference
    on this project's slowest machine). run_job calls wait(i + 1) before running
    fixture i and then reads items[i]: no input runs unverified, and a mismatch stops
    the job at that fixture, every earlier result already sent.
    """

    def __init__(self, job, payload):
        import threading

        self.job, self.payload = job, payload
        self.items, self.done, self.error, self.seconds, self.cancelled = [], 0, None, 0.0, False
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="verify-inputs", daemon=True)
        self.thread.start()

    def _run(self):
        t0 = time.perf_counter()
        view, store = memoryview(self.payload), self.job.get("store")
        for i, fx in enumerate(self.job["fixtures"]):
            if self.cancelled:
                return
            try:
                item = _input_item(fx, view, store)
                _verify(*item)
            except Exception as exc:  # re-raised in the job's thread by wait()
                with self.cond:
                    self.error = exc
                    self.cond.notify_all()
                return
            self.items.append(item)
            with self.cond:
                self.done = i + 1
                self.seconds = time.perf_counter() - t0
                self.cond.notify_all()

    def wait(self, n: int) -> None:
        """Return once the first n inputs are verified; raise the mismatch that prevents it."""
        if self.done >= n:  # read without the lock: it only grows
            return
        with self.cond:
            while self.done < n and self.error is None:
                self.cond.wait()
            if self.done < n:
                raise self.error

    def cancel(self) -> None:
        """Stop hashing (the job failed): a dead job's verifier must not slow the next one."""
        self.cancelled = True


def _output_frame(job, fx_ids, outputs, names, want_tensors, seconds, rep):
    entries, payload, offset = [], [], 0
    for name, arr in zip(names, outputs):
        arr = canonical(arr)
        entry = {"name": name, "dtype": arr.dtype.str, "shape": [int(d) for d in arr.shape],
                 "sha256": tensor_sha256(arr)}
        if want_tensors is True or (isinstance(want_tensors, list) and name in want_tensors):
            raw = arr.tobytes()
            entry["offset"], entry["nbytes"] = offset, len(raw)
            payload.append(raw)
            offset += len(raw)
        entries.append(entry)
    return {"type": "result", "fixture_id": fx_ids, "outputs": entries, "seconds": seconds, "repeat": rep,
            "variant": job.get("variant", "")}, payload


class _Sender:
    """Hashes, encodes and writes result frames on a helper thread, so the compute thread only runs.

    On this project's slowest machines the per-result Python work (canonical bytes, SHA-256,
    JSON, the pipe write) costs about a third of a small model's inference. Here the compute
    thread only appends the outputs to a deque (no lock, no wake-up); every PERIOD the sender
    wakes, writes whatever has accumulated while the next session.run (which releases the GIL)
    goes on, and flushes. Frames leave in order; the parent sees every result within about
    PERIOD of it being ready, and a killed worker loses at most that much work (the resumed run
    redoes it). At most BACKLOG results wait, so a slow reader holds back the runs, not memory.
    """

    PERIOD = 0.02
    BACKLOG = 256

    def __init__(self, out, job, names, want_tensors):
        import collections
        import threading

        self.out, self.job, self.names, self.want_tensors = out, job, names, want_tensors
        self.pending = collections.deque()
        self.error = None
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._run, name="send-results", daemon=True)
        self.thread.start()

    def put(self, fx_id, outputs, seconds, rep, extra=None) -> None:
        """Queue one result; `extra`: fields for its header (the placement, with a session's first result)."""
        while len(self.pending) >= self.BACKLOG and self.error is None:
            time.sleep(self.PERIOD / 4)
        if self.error is not None:
            raise self.error
        self.pending.append((fx_id, outputs, seconds, rep, extra))

    def _drain(self) -> None:
        wrote = False
        while self.pending:
            fx_id, outputs, seconds, rep, extra = self.pending.popleft()
            header, parts = _output_frame(self.job, fx_id, outputs, self.names, self.want_tensors, seconds, rep)
            header.update(extra or {})
            write_frame(self.out, header, parts, flush=False)
            wrote = True
        if wrote:
            self.out.flush()

    def _run(self):
        try:
            while not self.closing.wait(self.PERIOD):
                self._drain()
            self._drain()
        except Exception as exc:  # the parent went away: the compute thread raises it at its next put
            self.error = exc

    def close(self) -> None:
        """Write and flush everything pending (results before any error frame), then stop."""
        self.closing.set()
        self.thread.join()
        if self.error is not None:
            raise self.error

    def sync(self) -> None:
        """Write and flush everything pending, then go on sending (the test pause hook only)."""
        import threading

        self.close()
        self.closing.clear()
        self.thread = threading.Thread(target=self._run, name="send-results", daemon=True)
        self.thread.start()


def _test_pause(sender) -> None:
    """The test-only pause hook, called after each result while it is armed (see the module docstring)."""
    _TEST_PAUSE[0] -= 1
    if _TEST_PAUSE[0] != 0:
        return
    path = _TEST_PAUSE[1]
    sender.sync()  # the K results are with the parent before anything else happens
    pid = str(os.getpid())
    for done in (path + ".paused." + pid, path + ".paused"):
        with open(done + ".tmp" + pid, "w") as fh:
            fh.write(pid)
        os.replace(done + ".tmp" + pid, done)
    while not os.path.exists(path):
        time.sleep(0.01)


#: the session kept for later jobs: (model SHA-256, session options JSON) -> [session, providers, readback,
#: placement (read_placement's, once its first run was profiled; None before)]
_SESSIONS = {}


def _cached_session(data, session, sha256=None, scratch=None):
    """([session, resolved providers, readback, placement], reused): the last job's session when this job has
    the same model bytes and options (the runner splits a variant's fixtures into several jobs), else a new one
    (its first run profiled: placement None until then). One session at most is kept, and it is dropped
    before another is built: a worker never holds two. `sha256`: the model bytes' hash, already checked by
    _model_source."""
    key = (sha256 or hashlib.sha256(data).hexdigest(), json.dumps(session, sort_keys=True))
    hit = _SESSIONS.get(key)
    if hit is not None:
        return hit, True
    _drop_sessions()
    made = list(make_session(data, session, profile=True, scratch=scratch)) + [None]
    _SESSIONS[key] = made
    return made, False


def _drop_sessions() -> None:
    """Drop the kept session; one whose profiled run never happened ends its profiling first, so onnxruntime
    leaves no profile file behind (read_placement removes it)."""
    for old in _SESSIONS.values():
        if old[3] is None:
            try:
                read_placement(old[0])
            except Exception:
                pass
    _SESSIONS.clear()


def _check_tensor_outputs(sess) -> None:
    """Refuse outputs that are not numeric tensors: a ZipMap's list of dicts (or a string tensor) has no
    tensor bytes, only object pointers, which must never be hashed. Same wording as quantize/intake.py."""
    for o in sess.get_outputs():
        if not o.type.startswith("tensor(") or o.type == "tensor(string)":
            raise JobError("session", "output %r is %s, not a numeric tensor; quantbench hashes tensors only: export "
                           "the classifier without ZipMap (skl2onnx: options={'zipmap': False}) and with integer "
                           "class labels" % (o.name, o.type))


def run_job(job, payload, out) -> None:
    """Run every fixture of `job`, streaming one result frame per fixture (per repeat)."""
    host, variant = job.get("host", ""), job.get("variant", "")
    session = normalize_session(job.get("session"))
    data = _model_source(job, payload)
    verifier = _Verifier(job, payload)
    try:
        t1 = time.perf_counter()
        try:
            made, reused = _cached_session(data, session, job["model"].get("sha256"), job.get("scratch"))
        except Exception as exc:  # with the variant's required entries: the host cannot apply them (a result)
            if session.get(REQUIRED):
                raise JobError("requirement", "could not create the session with its required entries %s: %s: %s" % (
                    ", ".join("%s=%s" % kv for kv in sorted(session[REQUIRED].items())), type(exc).__name__, exc))
            raise JobError("unsupported" if unsupported(exc, False) else "session",
                           "could not create the session: %s: %s" % (type(exc).__name__, exc))
        sess, resolved, readback, placement = made
        require = bool(job.get("require_providers"))
        problem = check_providers(session["providers"], require, placement)
        if problem:
            raise JobError("providers", problem)
        names = [o.name for o in sess.get_outputs()]
        _check_tensor_outputs(sess)
        if job.get("output_names"):
            unknown = [n for n in job["output_names"] if n not in names]
            if unknown:
                raise JobError("session", "model has no output(s) %s (outputs: %s)" % (unknown, names))
            names = list(job["output_names"])
        t2 = time.perf_counter()
        write_frame(out, {"type": "session", "providers": resolved, "session_readback": readback,
                          "outputs": names, "host": host, "variant": variant, "session_seconds": t2 - t1,
                          "reused": reused, "placement": placement,
                          "provider_problems": provider_problems(session["providers"], available_providers(),
                                                                 placement)})
        sender = _Sender(out, job, names, job.get("return_tensors", True))
        placed = None if placement is not None else (made, session["providers"], require)
        try:
            _run_fixtures(sess, names, len(job["fixtures"]), verifier, sender, session["batch"],
                          int(job.get("repeat", 1)), placed)
        finally:
            sender.close()  # every finished result goes out before an error frame
        write_frame(out, {"type": "verified", "fixtures": verifier.done, "verify_seconds": verifier.seconds})
    finally:
        verifier.cancel()


def _placed(placed) -> dict:
    """After a new session's first (profiled) run: its placement, kept with the session and sent with the first
    result; the job's refusal when its providers are required and did not all run."""
    made, requested, require = placed
    made[3] = read_placement(made[0])
    problem = check_providers(requested, require, made[3])
    if problem:
        raise JobError("providers", problem)
    return {"placement": made[3], "provider_problems": provider_problems(requested, available_providers(), made[3])}


def _run_fixtures(sess, names, n, verifier, sender, batch, repeat, placed=None) -> None:
    """The compute loop: only session.run and handing the outputs over (see _Sender). `placed`: (the cached
    session entry, requested providers, required) when this session's first run is profiled (_placed)."""
    for start in range(0, n, batch):
        verifier.wait(min(n, start + batch))
        group = verifier.items[start:start + batch]
        ids = [fx["fixture_id"] for fx, _, _, _ in group]
        if len(group) == 1:
            feed = {group[0][0]["input_name"]: group[0][1]}
        else:
            by_input = {}
            for fx, arr, _, _ in group:
                by_input.setdefault(fx["input_name"], []).append(arr)
            feed = {k: (v[0] if len(v) == 1 else np.concatenate(v, axis=0)) for k, v in by_input.items()}
        for rep in range(repeat):
            t0 = time.perf_counter()
            try:
                outputs = sess.run(names, feed)
            except Exception as exc:
                raise JobError("unsupported" if unsupported(exc, True) else "run", "%s: %s" % (type(exc).__name__, exc),
                               ids[0] if len(ids) == 1 else ids)
            seconds = time.perf_counter() - t0
            extra, placed = (_placed(placed) if placed is not None else None), None
            if len(group) == 1:
                sender.put(ids[0], outputs, seconds, rep, extra)
                if _TEST_PAUSE is not None:
                    _test_pause(sender)
                continue
            for i, fid in enumerate(ids):
                split = []
                for name, arr in zip(names, outputs):
                    if arr.ndim == 0 or arr.shape[0] != len(group):
                        raise JobError("run", "batch %d: output %r has leading dimension %s, cannot split per "
                                       "fixture" % (len(group), name, arr.shape[:1]), fid)
                    split.append(arr[i:i + 1])
                sender.put(fid, split, seconds / len(group), rep, extra if i == 0 else None)
                if _TEST_PAUSE is not None:
                    _test_pause(sender)


def fingerprint_job(job, payload, out) -> None:
    """Fingerprint under the job's session options, resolved with a probe model if one is sent."""
    session = normalize_session(job.get("session"))
    resolved, readback, probe = [], {}, None
    if job.get("model"):
        data = _model_source(job, payload)
        sess, resolved, readback = make_session(data, session)
        problem = check_providers(session["providers"], bool(job.get("require_providers")))
        if problem:
            raise JobError("providers", problem)
        if job.get("fixtures"):
            _check_tensor_outputs(sess)
            fx, arr = _inputs(job, payload)[0]
            outs = sess.run(None, {fx["input_name"]: arr})
            probe = [tensor_sha256(o) for o in outs]
    fp = collect_fingerprint(session, resolved, readback)
    write_frame(out, {"type": "fingerprint", "fingerprint": fp, "fingerprint_id": fingerprint_id(fp),
                      "probe_sha256": probe, "host": job.get("host", "")})


def fork_job(job, out) -> None:
    """Fork this worker (see the module docstring): the child serves the socket job["socket"] and never returns."""
    import signal
    import threading

    for th in threading.enumerate():  # a job's helper threads end with it; a fork copies only this thread
        if th is not threading.current_thread():
            th.join(5)
    if threading.active_count() > 1:
        raise JobError("fork", "helper threads still running: %s" % [t.name for t in threading.enumerate()])
    path = job["socket"]
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # forked workers are reaped by the kernel, never zombies
    out.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os._exit(_serve_forked(path, out))
    write_frame(out, {"type": "forked", "pid": pid, "host": job.get("host", "")})


def _serve_forked(path, out) -> int:
    """The forked child: drop every descriptor of the parent's pipes, serve the socket's two connections."""
    import signal
    import socket

    code = 1
    try:
        os.setsid()  # its own session, like a started worker (one CPU share each under autogroup scheduling)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        err = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        err.connect(path)
        # The parent's stdin, stdout (protocol) and stderr pipes must not stay open here: the runner would
        # never see them end. The same descriptor numbers now name this child's connections.
        os.dup2(err.fileno(), 2)
        os.dup2(err.fileno(), 1)
        os.dup2(conn.fileno(), 0)
        os.dup2(conn.fileno(), out.fileno())
        err.close()
        conn.close()
        code = serve(os.fdopen(os.dup(0), "rb"), out)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            out.flush()
            sys.stderr.flush()
        except Exception:
            pass
    return code


class InputWatch:
    """While a job runs nothing arrives on the worker's input (the parent waits for "done"), so the input's other
    end closing then, with no request left unread, means the parent is gone: killed, or its connection dropped.
    This helper thread ends the worker at once when that happens: a forked worker (its parent-death signal watches
    the worker it was forked from, which may end first) and a remote one (an ssh host's, a child of the remote's
    sshd) die with the command as a started worker does (die_with_parent), also while busy or paused. A client
    that wrote its later requests and closed its end (they are still to be read) is served as before. It ends
    with the job. `inp`: the worker's buffered input (its peek sees what was read ahead)."""

    def __init__(self, inp):
        import select
        import threading

        self.inp, self.fd, (self.stop_r, self.stop_w) = inp, inp.fileno(), os.pipe()
        self.poll = select.poll()
        # hang-up only (POLLHUP and POLLERR always count): a pipe's writer closing, a socket's peer shutting down
        self.poll.register(self.fd, getattr(select, "POLLRDHUP", 0x2000))
        self.poll.register(self.stop_r, select.POLLIN)  # closed by close()
        self.thread = threading.Thread(target=self._run, name="watch-input", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        events = dict(self.poll.poll())
        if self.stop_r in events:
            return
        try:
            if self.inp.peek(1):  # (hung up: never blocks) requests still to read, the client's last words
                return
        except (OSError, ValueError):
            pass
        try:  # (stderr may be the same dead connection)
            sys.stderr.write("quantbench worker: the input ended in the middle of a job; ending\n")
            sys.stderr.flush()
        finally:
            os._exit(1)

    def close(self) -> None:
        os.close(self.stop_w)
        self.thread.join()
        os.close(self.stop_r)


def _watched(fn, inp, *args) -> None:
    """fn(*args) with its input watched (InputWatch); unwatched when `inp` has no descriptor or no peek."""
    try:
        inp.fileno()
    except (AttributeError, OSError, ValueError):
        return fn(*args)
    if not hasattr(inp, "peek"):
        return fn(*args)
    watch = InputWatch(inp)
    try:
        fn(*args)
    finally:
        watch.close()


def serve(inp, out) -> int:
    """The worker loop: answer requests until "end" or end of input."""
    while True:
        frame = read_frame(inp)
        if frame is None or frame[0].get("type") == "end":
            _drop_sessions()
            return 0
        job, payload = frame
        kind = job.get("type")
        try:
            if kind == "fingerprint":
                _watched(fingerprint_job, inp, job, payload, out)
            elif kind == "run":
                _watched(run_job, inp, job, payload, out)
            elif kind == "fork":  # unwatched: a fork copies only this thread
                fork_job(job, out)
            else:
                raise JobError("protocol", "unknown request type %r" % (kind,))
        except Exception as exc:
            _drop_sessions()  # a failed job's session is built anew (its first run profiled) by the next one
            stage = exc.stage if isinstance(exc, JobError) else "worker"
            fixture = exc.fixture_id if isinstance(exc, JobError) else None
            write_frame(out, {"type": "error", "stage": stage, "message": str(exc) or type(exc).__name__,
                              "host": job.get("host", ""), "variant": job.get("variant", ""),
                              "fixture_id": fixture, "folder": getattr(exc, "folder", None),
                              "traceback": "" if isinstance(exc, JobError) else traceback.format_exc()})
        write_frame(out, {"type": "done"})
        del payload


def die_with_parent(parent: "int | None" = None) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux prctl PR_SET_PDEATHSIG; under qemu-user
    the call reaches the kernel for the qemu process, which is the parent's child), so a parent killed by SIGTERM
    or SIGKILL leaves no worker running (one asked for 100000 threads grew 40 MB/s as an orphan). The kernel
    counts the parent's thread that started this process: the threads that start workers close them before they
    end. `parent`: the pid expected; gone already (this process was adopted) ends it now. Elsewhere: nothing."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        PR_SET_PDEATHSIG = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if (os.getppid() != parent) if parent is not None else os.getppid() == 1:
        os._exit(1)


def main() -> int:
    die_with_parent()
    # The protocol owns the original stdout; anything a library prints goes to stderr.
    proto = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return serve(sys.stdin.buffer, proto)


if __name__ == "__main__":
    sys.exit(main())
