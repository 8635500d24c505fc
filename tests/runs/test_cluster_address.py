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


def _run_on(cluster: str, cwd) -> tuple[int, str]:
    before = digest(cwd)
    proc = subprocess.run([sys.executable, "-m", "quantbench", "run", "--hosts", "pi", "--limit", "1", "--no-progress",
                           "--cluster", cluster], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert digest(cwd) == before, "something was written"
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("server", [b""], indirect=True)
def test_a_port_that_never_answers_is_one_line_after_the_timeout(workdir, server):
    rc, err = _run_on(f"tcp://127.0.0.1:{server.port}", workdir)
    assert rc == 2
    assert one_line(err, "run") == (f"quantbench run: error: cluster tcp://127.0.0.1:{server.port}: cannot reach the "
                                    "scheduler (no answer within 10 s)")


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
