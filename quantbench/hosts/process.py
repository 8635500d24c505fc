"""The process transport of the worker protocol: a worker is a process (local python, qemu-user, the OpenSSH
client) this machine starts; `WorkerConnection` speaks the worker's framed protocol over its pipes, `ProcessHost`
is the base of every host kind that starts one (local, emulated, ssh), `WorkerDied` says a worker ended.

The worker always runs in a subprocess, so a crash in onnxruntime (or qemu) cannot take
the workbench down.
"""

from __future__ import annotations

import hashlib

import collections
import io
import os
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from quantbench.errors import UserError
from quantbench.worker import jobs as worker_entry
from quantbench.worker.protocol import read_frame, write_frame

#: the worker's entry, started by path beside its sibling sources (quantbench.worker)
WORKER_PATH = Path(worker_entry.__file__).resolve()
#: `hosts exec TIER`: the variables a whole-process CPUID mask changed, with their values before it (JSON; null:
#: unset). A worker that does not run the masked copy (a qemu guest, another runtime) takes the mask off.
UNMASKED_ENV = "QUANTBENCH_CPUID_UNMASKED"


#: what a host that receives the worker as source runs: reads the worker's sources (their count, then each one's
#: module name and length before its bytes) from its input, then runs the last, the entry, with the others in its
#: globals (jobs.install_sources) on the rest of the input (ssh hosts)
BOOTSTRAP = (
    "import sys;b=sys.stdin.buffer;n=int(b.readline());"
    "s=[(b.readline().decode('ascii').strip(),b.read(int(b.readline()))) for _ in range(n)];"
    "exec(compile(s[-1][1],'quantbench-worker.py','exec'),{'__name__':'__main__','_SOURCES':s[:-1]})"
)


def worker_preamble() -> bytes:
    """What BOOTSTRAP reads: the number of sources, then each one's module name, length and bytes."""
    sources = worker_source()
    return f"{len(sources)}\n".encode("ascii") + b"".join(
        f"{module}\n{len(src)}\n".encode("ascii") + src for module, src in sources)


def without_process_mask(env: dict) -> dict:
    """`env` with a whole-process CPUID mask (quantbench.hosts.masked.process_env) taken off, as it was before:
    a qemu guest must see qemu's CPU model and its own packages, another runtime's onnxruntime the real CPU
    (it has no patched copy, so its fingerprint would read the mask while its kernels see this CPU)."""
    raw = env.get(UNMASKED_ENV)
    if not raw:
        return env
    import json

    out = {k: v for k, v in env.items() if not k.startswith("QUANTBENCH_CPUID_")}
    for key, value in json.loads(raw).items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def worker_source() -> list[tuple[str, bytes]]:
    """[(module, source)] of the code a worker runs, in load order, its entry (jobs.py) last: what a host that
    receives the worker as source gets, and what a kit carries."""
    here = WORKER_PATH.parent
    return [(module, (here / path).read_bytes()) for module, path in worker_entry.SOURCES] + \
        [("quantbench.worker.jobs", WORKER_PATH.read_bytes())]


def worker_code_sha256() -> str:
    """The hash of the code a worker runs (its sources in load order, as worker_source sends them): what
    a cached fingerprint and a cluster worker's version check compare."""
    h = hashlib.sha256()
    for _module, part in worker_source():
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


class WorkerDied(Exception):
    """The worker process ended without finishing its request (killed, crashed, unreachable)."""

    def __init__(self, message: str, returncode=None, stderr: str = ""):
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr


class DoesNotStart(UserError):
    """A host's runtime cannot start on its CPU (its worker died of an illegal instruction before answering):
    a result for that host (`reason`), not a failed run."""

    def __init__(self, host: str, reason: str):
        super().__init__(f"host {host}: {reason}")
        self.reason = reason


def _grow_pipe(stream, size: int = 1 << 20) -> None:
    """Raise a pipe's capacity (Linux F_SETPIPE_SZ): megabytes of input tensors then cross in a few
    context switches instead of hundreds, which matters on a loaded machine."""
    try:
        import fcntl

        fcntl.fcntl(stream.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), size)
    except (OSError, ValueError, ImportError):
        pass


class _ForkedProcess:
    """A worker forked by another worker (not a child of this process), seen through the Popen calls
    WorkerConnection makes: its two socket connections stand for the pipes, a pidfd for the process
    (signalled and waited on without a pid reuse race). Its exit status goes to its parent worker,
    so returncode is only known when this side killed it."""

    def __init__(self, pid: int, pidfd: int, conn, err):
        self.pid = pid
        self.pidfd = pidfd
        self.returncode = None
        self._conn, self._err = conn, err
        self.stdin = conn.makefile("wb")
        self.stdout = conn.makefile("rb", buffering=0)
        self.stderr = err.makefile("rb")

    def poll(self):
        """None while it runs (like Popen.poll); once it ended, -9 if this side killed it, else None still."""
        return self.returncode if self.ended() else None

    def ended(self, timeout: float | None = 0) -> bool:
        import select

        return self.pidfd < 0 or bool(select.select([self.pidfd], [], [], timeout)[0])

    def wait(self, timeout=None):
        if not self.ended(timeout):
            raise subprocess.TimeoutExpired(f"forked worker {self.pid}", timeout)
        return self.returncode

    def kill(self) -> None:
        import signal

        if not self.ended():
            signal_kill(self.pidfd)
            self.returncode = -signal.SIGKILL

    def close(self) -> None:
        for s in (self._conn, self._err):
            s.close()
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


_SPAWNER: list = []
_SPAWNED: list = []   # the processes the spawner thread started (it is stopped only when none still runs)
_SPAWNER_LOCK = threading.Lock()


def spawn(argv: list[str], **popen_args) -> subprocess.Popen:
    """subprocess.Popen of a worker, always from the main thread or from one thread that lives as long as this
    process: a worker asks the kernel to kill it when its parent dies (worker.die_with_parent), and the kernel
    counts the *thread* that started it, so a worker started by a short-lived thread (a pool opening sessions)
    would die with that thread."""
    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(argv, **popen_args)
    from concurrent.futures import ThreadPoolExecutor

    with _SPAWNER_LOCK:
        if not _SPAWNER:
            _SPAWNER.append(ThreadPoolExecutor(1, thread_name_prefix="worker-spawner"))
        proc = _SPAWNER[0].submit(subprocess.Popen, argv, **popen_args).result()
        _SPAWNED.append(proc)
    return proc


def stop_spawner() -> bool:
    """Shut the spawner thread down once no worker it started still runs (a library caller's process keeps no
    quantbench thread after a call; the next spawn starts another); whether it was stopped."""
    with _SPAWNER_LOCK:
        if not _SPAWNER or any(p.poll() is None for p in _SPAWNED):
            return False
        _SPAWNER.pop().shutdown(wait=True)
        _SPAWNED.clear()
        return True


class WorkerConnection:
    """One worker process: send a request frame, iterate the answer frames up to "done"."""

    def __init__(self, argv: list[str], env: dict | None, host: str, preamble: bytes = b"", proc=None):
        self.host = host
        self.argv = list(argv)
        self._stderr = collections.deque(maxlen=200)
        if proc is not None:  # already running: a forked worker (_ForkedProcess)
            self.proc, self._release = proc, proc.close
        else:
            self._release = lambda: None
            try:
                # Own session: under the kernel's autogroup scheduling each worker then gets its own CPU
                # share, so hosts run in parallel really do run in parallel; the parent stops them itself.
                self.proc = spawn(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=env, bufsize=0, start_new_session=True)
            except OSError as exc:
                raise UserError(f"host {host}: cannot start the worker ({argv[0]}: {exc.strerror or exc})") from None
            _grow_pipe(self.proc.stdin)
            _grow_pipe(self.proc.stdout)
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()
        self._stdout = io.BufferedReader(self.proc.stdout, buffer_size=1 << 20)  # fewer syscalls per frame
        if preamble:
            self._send_raw(preamble)

    def _read_stderr(self):
        for line in iter(self.proc.stderr.readline, b""):
            self._stderr.append(line.decode("utf-8", "replace").rstrip())

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr_tail(self, lines: int = 20) -> str:
        return "\n".join(list(self._stderr)[-lines:])

    def _died(self, what: str) -> WorkerDied:
        try:
            rc, ended = self.proc.wait(timeout=10), True
        except subprocess.TimeoutExpired:
            rc, ended = None, False
        self._drain.join(timeout=2)
        tail = self.stderr_tail()
        if rc is not None and rc < 0:
            how = f"was killed by signal {-rc}"
        elif rc is not None:
            how = f"exited with code {rc}"
        elif ended:  # a forked worker: its exit status went to the worker it was forked from
            how = "ended"
        else:
            how = "stopped answering"
        last = tail.strip().splitlines()[-1] if tail.strip() else ""
        return WorkerDied(f"worker {how} {what}" + (f" ({last})" if last else ""), rc, tail)

    def _send_raw(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:  # an unbuffered pipe write is short when the reader goes away mid-write
                n = self.proc.stdin.write(view)
                view = view[n or 0:]
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._died("while receiving its job") from None

    def request(self, header: dict, payload: list[bytes] | bytes = b""):
        """Send one request; yield every answer frame (header, payload) before "done"."""
        try:
            write_frame(self.proc.stdin, header, payload)
        except (BrokenPipeError, OSError):
            raise self._died("while receiving its job") from None
        while True:
            try:
                frame = read_frame(self._stdout)
            except (EOFError, ValueError, OSError):
                frame = None
            if frame is None:
                raise self._died("before finishing")
            if frame[0].get("type") == "done":
                return
            yield frame

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                write_frame(self.proc.stdin, {"type": "end"})
                self.proc.stdin.close()
            except (BrokenPipeError, OSError, ValueError):
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._drain.join(timeout=2)
        for s in (self.proc.stdout, self.proc.stderr, self.proc.stdin):
            try:
                s.close()
            except Exception:
                pass
        self._release()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.close()

    def fork(self, timeout: float = 120.0) -> "WorkerConnection":
        """Another worker, forked from this idle one: it starts warm (imports done, and under qemu-user
        the parent's translated code copied), where a new process pays its whole start-up again.
        Same machine only: the child connects back through a Unix socket in a private folder; a child
        that has not connected within `timeout` seconds is killed."""
        import select
        import shutil
        import socket
        import tempfile

        folder = tempfile.mkdtemp(prefix="quantbench-fork-")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        pidfd, conns = -1, []
        try:
            path = os.path.join(folder, "worker.sock")
            listener.bind(path)
            listener.listen(2)
            pid = None
            for h, _ in self.request({"type": "fork", "socket": path, "host": self.host}):
                if h.get("type") == "forked":
                    pid = int(h["pid"])
                elif h.get("type") == "error":
                    raise UserError(f"host {self.host}: cannot fork a worker: {h.get('message')}")
            if pid is None:
                raise UserError(f"host {self.host}: the worker answered a fork without a process id")
            pidfd = os.pidfd_open(pid)
            while len(conns) < 2:  # the protocol stream, then stderr (the child connects in that order)
                ready = select.select([listener, pidfd], [], [], timeout)[0]
                if listener in ready:
                    conns.append(listener.accept()[0])
                elif ready:
                    raise UserError(f"host {self.host}: the forked worker {pid} ended before it connected")
                else:
                    signal_kill(pidfd)
                    raise UserError(f"host {self.host}: the forked worker {pid} did not connect within {timeout:.0f} s")
            for c in conns:
                try:  # like the pipes' size: megabytes of inputs cross in a few writes
                    c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
                except OSError:
                    pass
            proc = _ForkedProcess(pid, pidfd, conns[0], conns[1])
        except BaseException:
            for c in conns:
                c.close()
            if pidfd >= 0:
                os.close(pidfd)
            raise
        finally:
            listener.close()
            shutil.rmtree(folder, ignore_errors=True)
        return WorkerConnection(self.argv, None, self.host, proc=proc)


def signal_kill(pidfd: int) -> None:
    """SIGKILL the process behind a pidfd (gone already: nothing to do)."""
    import signal

    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass


#: what every host kind's class implements, and what a kind that starts workers adds (ProcessHost)
class AnyHost(Protocol):
    """What every host kind's class offers (an imported file's too): runner, registry, explain and the API ask
    these, never the kind's name."""

    name: str
    kind: str
    model_by_path: bool       # the worker can open the model file by path (same filesystem)
    runs_workers: bool        # results come from workers it starts (False: a file is merged)
    traces_instructions: bool
    local_pid_memory: bool
    caches_fingerprint: bool

    def ready(self) -> tuple[bool, str]: ...

    def describe(self) -> str: ...

    def recorded_session(self) -> dict | None: ...

    def latency_refusal(self) -> str | None: ...


class WorkerHost(AnyHost, Protocol):
    """What a kind that starts workers (runs_workers) adds: how its worker starts and is told apart, what a dead
    one means, its cores and its fingerprint cache's material (ProcessHost's defaults, a kind overriding what
    differs)."""

    uses_local_cores: bool
    runs_on_cluster: bool

    def command(self) -> tuple[list[str], dict | None, bytes]: ...

    def set_up(self) -> bool: ...

    def start(self) -> "WorkerConnection": ...

    def died_message(self, exc: WorkerDied) -> str: ...

    def job_death_message(self, exc: WorkerDied) -> str: ...

    def version_policy(self, remote: str, local: str) -> str | None: ...

    def start_failure(self, exc: WorkerDied) -> str | None: ...

    def fingerprint_cache_parts(self, env: dict) -> dict: ...

    def max_workers(self, fingerprint: dict) -> int: ...

    def close_connection(self) -> None: ...

    def can_fork(self) -> bool: ...

    def reads_input_store(self) -> bool: ...

    def fingerprint_problem(self, fingerprint: dict) -> str | None: ...


def protocol_members(protocol) -> tuple[str, ...]:
    """The attributes and methods `protocol` (AnyHost, WorkerHost) declares itself, in order (what a kind's class
    must have; tests/hosts/test_host_kinds.py checks every kind's)."""
    own = [*protocol.__dict__.get("__annotations__", {}),
           *(n for n, v in protocol.__dict__.items() if callable(v) and not n.startswith("_"))]
    return tuple(own)


@dataclass
class ProcessHost:
    """A host reached by starting a process that runs the worker (local python, qemu, ssh), and the base
    protocol of every host kind (quantbench.hosts.kinds.KINDS names each kind's class).

    A kind's class is built as Class(name=, kind=, options=). Every kind implements the attributes
    model_by_path, runs_workers, traces_instructions, local_pid_memory, caches_fingerprint and the methods
    `ready` (whether it can be used here, and why not), `describe`, `recorded_session` and `latency_refusal`
    (AnyHost). A kind that starts workers (runs_workers) subclasses this class and writes `command` (how
    its worker starts) and whatever else differs from the defaults below: uses_local_cores, runs_on_cluster,
    `died_message`, `job_death_message`, `version_policy`, `start_failure`, `fingerprint_cache_parts`,
    `max_workers`, `close_connection`, `can_fork`, `reads_input_store`, `fingerprint_problem` (WorkerHost). A kind that starts
    none (imported) sets runs_workers False and writes only the first set.
    """

    name: str
    kind: str
    options: dict = field(default_factory=dict)
    #: the worker can open the model file by path (same filesystem)
    model_by_path: bool = True
    #: ready() said yes to whoever made this object (a run checks its hosts once, before it starts): start()
    #: does not ask again
    ready_checked = False
    #: results come from workers this host starts (an imported host merges a file instead)
    runs_workers = True
    #: its workers run on this machine's cores, so each takes one of the runner's slots
    uses_local_cores = True
    #: the worker's local pid is the process running the model, so its peak RSS is the model's (latency)
    local_pid_memory = False
    #: its runs can be traced instruction by instruction (qemu's translation log: explain.evidence)
    traces_instructions = False
    #: hosts.fingerprintcache may remember its fingerprint: everything that can change it is visible on this machine
    caches_fingerprint = False
    #: `--cluster` runs its workers on a cluster's machines (runs/cluster.py): its results do not depend on
    #: which machine runs it (the fingerprint is checked on each)
    runs_on_cluster = False

    def command(self) -> tuple[list[str], dict | None, bytes]:
        """(argv, env or None, bytes to send before the first frame)."""
        raise UserError(f"host {self.name}: kind {self.kind} has no worker command")

    def ready(self) -> tuple[bool, str]:
        return True, "ready"

    def set_up(self) -> bool:
        """Whether command() can be made without building anything first (a kind that builds at first use says)."""
        return True

    def start(self) -> WorkerConnection:
        if not self.ready_checked:
            ok, msg = self.ready()
            if not ok:
                raise UserError(f"host {self.name}: {msg}")
        argv, env, preamble = self.command()
        return WorkerConnection(argv, env, self.name, preamble)

    def describe(self) -> str:
        return self.kind

    def recorded_session(self) -> dict | None:
        """The session this host's results were made under, when the host only holds them (imported); None."""
        return None

    def died_message(self, exc: WorkerDied) -> str:
        """One line for a worker that died before answering (start-up or fingerprint), whichever
        write or read noticed it first."""
        return f"host {self.name}: {exc}"

    def job_death_message(self, exc: WorkerDied) -> str:
        """Why a worker died in the middle of a job (the runner prefixes host, variant and fixture)."""
        return str(exc)

    def version_policy(self, remote: str, local: str) -> str | None:
        """A note when the host's onnxruntime version differs from the local one (None when equal):
        its results still count, but a difference may come from the version."""
        if remote == local:
            return None
        return f"host {self.name} runs onnxruntime {remote} (local: {local}); differences may come from the version"

    def start_failure(self, exc: WorkerDied) -> str | None:
        """Why this host's runtime cannot start on its CPU, when the worker's death says so (a result for the
        host, not a failed run: quantbench.hosts.runtimes.start_failure); None: a failure."""
        return None

    def fingerprint_cache_parts(self, env: dict) -> dict:
        """This kind's own fingerprint-cache key material beyond the parts every kind shares (`env` is
        the worker's environment); asked only when caches_fingerprint."""
        return {}

    def latency_refusal(self) -> str | None:
        """Why a time measured on this host is not a device latency (None: it is)."""
        return None

    def fingerprint_problem(self, fingerprint: dict) -> str | None:
        """Why a worker's fingerprint is not the CPU this host stands for (an emulated preset's features and
        vector lengths); None: nothing to check, or it is."""
        return None

    def max_workers(self, fingerprint: dict) -> int:
        """How many workers this host may run at once: unbounded here (the runner's slots bound local workers)."""
        return 1 << 30

    def close_connection(self) -> None:
        """Release what the host's workers shared once they are all done (nothing, but for ssh)."""

    def can_fork(self) -> bool:
        """Whether a running worker can fork more (WorkerConnection.fork): it runs on this machine, which
        has pidfds (Linux) to watch a process that is not this one's child."""
        return hasattr(os, "pidfd_open")

    def reads_input_store(self) -> bool:
        """Whether its workers read the run's input store (a file under a fresh temporary folder, a path
        no qemu -L prefix holds): on this machine they map it and verify each input once, instead of
        receiving and verifying every input with every job."""
        return True
