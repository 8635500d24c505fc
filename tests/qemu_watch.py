"""The fast subset's guard: a watch over this pytest process's tree for qemu-user (and Dask programs) started while an
unmarked test runs. conftest.py fails such a test; this module holds the watch so it can be tested on its own."""

import os
import threading


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


#: the processes an unmarked test may not start: qemu-user, and a Dask cluster's scheduler or workers started as
#: programs (`dask scheduler`, `dask-worker`); a cluster made in the test's own process is caught by _ClusterWatch
EMULATION_COMMS = ("qemu-", "dask", "dask-scheduler", "dask-worker")


#: what qemu-user is asked when it only answers a question (hosts.emulated asks `--version` before every run)
QUERY_ARGS = ({"--version"}, {"-version"}, {"-h"}, {"-help"}, {"--help"}, {"-cpu", "help"})


def _cmdline(pid: str) -> list[str]:
    """A process's argv ([] when it is gone, or exited and not yet reaped)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return []


def emulates(comm: str, argv: list[str]) -> bool:
    """Whether a process the watch sees runs emulation or a cluster: a qemu-user process answering a question
    (`--version`) emulates nothing, and one whose argv can no longer be read has exited (an emulation lives long
    enough to be seen while it runs)."""
    if not comm.startswith("qemu-"):
        return True
    return bool(argv) and set(argv[1:]) not in QUERY_ARGS


class QemuWatch:
    """Polls /proc for qemu processes that descend from this pytest process and started after the watch did."""

    def __init__(self, interval: float = 0.2):
        self.interval, self.seen, self._stop = interval, [], threading.Event()
        self._since, self._me = _boot_ticks_now() - _CLK_TCK, os.getpid()
        self._thread = threading.Thread(target=self._loop, name="qemu-watch", daemon=True)

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
            if comm.startswith(EMULATION_COMMS) and start >= self._since and self._descends(stats, pid) \
                    and emulates(comm, _cmdline(str(pid))):
                self.seen.append(f"{comm} (pid {pid})")

    def _loop(self) -> None:
        while not self._stop.is_set() and not self.seen:
            self._scan()
            self._stop.wait(self.interval)


