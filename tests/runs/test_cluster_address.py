"""`--cluster ADDRESS` that is not a Dask scheduler is one line within the connect timeout, before any work:
a port that accepts and never answers (distributed waited without end), a port that greets first as another
server does (an ssh banner: distributed read it as a 2.82 EiB message, numpy's MemoryError), a refused port
(distributed added "Exception ignored ... TimeoutError" after the error). The servers listen on 127.0.0.1 only,
in this test's own thread, and stop with it."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

from cli_helpers import digest, one_line
from quantbench.runs.cluster import CONNECT_SECONDS

pytest.importorskip("distributed")


@pytest.fixture(autouse=True)
def _pi_set_up():
    """The run names pi, a host the cluster takes (x86 stays here and needs no cluster)."""
    from quantbench.hosts import emulated as E
    from setup_required import missing_setup

    ok, msg = E.ready("pi")
    if not ok:
        missing_setup(f"pi not set up: {msg}")


class _Server:
    """A 127.0.0.1 listener that accepts and then sends `greeting` (nothing: it never answers)."""

    def __init__(self, greeting: bytes = b""):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.greeting, self.held, self.stop = greeting, [], threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            self.held.append(conn)
            if self.greeting:
                conn.sendall(self.greeting)

    def close(self):
        self.stop.set()
        self.thread.join(10)
        for c in self.held:
            c.close()
        self.sock.close()


@pytest.fixture
def server(request):
    srv = _Server(request.param)
    yield srv
    srv.close()


#: `python -m quantbench` with the connect timeout (cluster.CONNECT_SECONDS, 10 s) set first: a port that never
#: answers is waited out whatever the timeout, so the test sets a short one
_WITH_TIMEOUT = ("import sys; from quantbench.runs import cluster; cluster.CONNECT_SECONDS = float(sys.argv.pop(1)); "
                 "sys.argv[0] = 'quantbench'; from quantbench.__main__ import entry; raise SystemExit(entry())")


def _run_on(cluster: str, cwd, connect_seconds: float | None = None) -> tuple[int, str]:
    before = digest(cwd)
    start = [sys.executable, "-m", "quantbench"] if connect_seconds is None else \
        [sys.executable, "-c", _WITH_TIMEOUT, str(connect_seconds)]
    proc = subprocess.run([*start, "run", "--hosts", "pi", "--limit", "1", "--no-progress", "--cluster", cluster],
                          cwd=cwd, capture_output=True, text=True, timeout=300)
    assert digest(cwd) == before, "something was written"
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("server", [b""], indirect=True)
def test_a_port_that_never_answers_is_one_line_after_the_timeout(workdir, server):
    rc, err = _run_on(f"tcp://127.0.0.1:{server.port}", workdir, connect_seconds=0.5)
    assert rc == 2
    assert one_line(err, "run") == (f"quantbench run: error: cluster tcp://127.0.0.1:{server.port}: cannot reach the "
                                    "scheduler (no answer within 0.5 s)")
    assert CONNECT_SECONDS == 10  # what a user's run waits


@pytest.mark.parametrize("server", [b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n"], indirect=True)
def test_a_port_that_greets_as_ssh_is_not_a_scheduler(workdir, server):
    rc, err = _run_on(f"tcp://127.0.0.1:{server.port}", workdir)
    assert rc == 2
    assert one_line(err, "run") == (f"quantbench run: error: cluster tcp://127.0.0.1:{server.port}: not a Dask "
                                    "scheduler (it greets with 'SSH-2.0-')")


def test_a_refused_port_is_one_line_and_nothing_more(workdir):
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]   # bound, then closed: nothing listens there
    rc, err = _run_on(f"tcp://127.0.0.1:{port}", workdir)
    assert rc == 2
    assert one_line(err, "run") == (f"quantbench run: error: cluster tcp://127.0.0.1:{port}: cannot reach the "
                                    "scheduler (Connection refused)")
