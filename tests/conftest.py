"""Shared test fixtures.

Markers: `slow` (qemu emulation and other slow tests; `-m "not slow"` is the fast
subset), `ssh` (starts a real sshd on 127.0.0.1). The README's test command runs all.
"""

import os

import pytest


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """Run a test inside an empty working folder (results/, calib_sets/ land here)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# Tests live in subfolders mirroring the package (tests/hosts/, tests/analysis/, ...) and import the shared helpers
# (tests/hosts_helpers.py, tests/ssh_helpers.py, ...) from anywhere: tests/ is on sys.path.
import sys as _sys
from pathlib import Path as _Path

_TESTS = str(_Path(__file__).resolve().parent)
if _TESTS not in _sys.path:
    _sys.path.insert(0, _TESTS)
@pytest.fixture(autouse=True)
def no_plugin_consent():
    """Each test starts, like each command, with no plug-in allowed (quantbench.inputs.plugins keeps consent per process)."""
    from quantbench.inputs import plugins

    plugins.reset_consent()
    yield
    plugins.reset_consent()


# --- the fast subset stays fast: an unmarked test that starts qemu fails ------------------------------------------
# `-m "not slow"` is documented as the subset without emulation. A test that starts a qemu-user process (directly, or
# through the CLI, a worker or a cluster it spawns) must carry `@pytest.mark.slow`; this guard watches the test's own
# process tree while an unmarked test runs and fails the test when a qemu process appears in it. It only ever reports
# a process it saw, so it cannot fail a test that started none (a qemu process too short-lived to be seen costs
# nothing worth marking).

import threading as _threading

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: str):
    """(comm, ppid, starttime in clock ticks) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    comm = raw[raw.index("(") + 1: raw.rindex(")")]
    rest = raw[raw.rindex(")") + 2:].split()
    return comm, int(rest[1]), int(rest[19])


def _boot_ticks_now() -> int:
    with open("/proc/uptime") as fh:
        return int(float(fh.read().split()[0]) * _CLK_TCK)


class _QemuWatch:
    """Polls /proc for qemu processes that descend from this pytest process and started after the watch did."""

    def __init__(self, interval: float = 0.2):
        self.interval, self.seen, self._stop = interval, [], _threading.Event()
        self._since, self._me = _boot_ticks_now() - _CLK_TCK, os.getpid()
        self._thread = _threading.Thread(target=self._loop, name="qemu-watch", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _descends(self, stats: dict, pid: int) -> bool:
        for _ in range(64):
            if pid == self._me:
                return True
            st = stats.get(pid)
            if st is None or pid <= 1:
                return False
            pid = st[1]
        return False

    def _scan(self) -> None:
        stats = {}
        for name in os.listdir("/proc"):
            if name.isdigit() and (st := _proc_stat(name)) is not None:
                stats[int(name)] = st
        for pid, (comm, _ppid, start) in stats.items():
            if comm.startswith("qemu-") and start >= self._since and self._descends(stats, pid):
                self.seen.append(f"{comm} (pid {pid})")

    def _loop(self) -> None:
        while not self._stop.is_set() and not self.seen:
            self._scan()
            self._stop.wait(self.interval)


def _watched(item):
    """The phase runs under a qemu watch unless the test is marked slow (or there is no /proc to watch)."""
    return item.get_closest_marker("slow") is None and os.path.isdir("/proc")


def _fail_if_qemu(item, watch) -> None:
    if watch.seen:
        pytest.fail(f"{item.nodeid} started {watch.seen[0]} but is not marked slow: emulation belongs in the slow "
                    f"set (@pytest.mark.slow), the fast subset (-m 'not slow') runs none", pytrace=False)


def _watched_phase(item):
    """A phase (setup or call) of an unmarked test, run under a qemu watch."""
    if not _watched(item):
        return (yield)
    with _QemuWatch() as watch:
        result = yield
    _fail_if_qemu(item, watch)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _watched_phase(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _watched_phase(item))
