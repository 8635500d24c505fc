"""The fast subset's guard (tests/qemu_watch.py) fails an unmarked test for emulation it starts, and for nothing
else: every `quantbench run` naming an emulated host asks its qemu binary for `--version` first, and a guard that
counted that query failed whichever unmarked test's poll happened to see it (a flaky CI)."""

import subprocess
import time

import pytest

from qemu_watch import QemuWatch, emulates
from setup_required import missing_setup


@pytest.mark.parametrize("argv", [["qemu-aarch64", "--version"], ["/opt/qemu/bin/qemu-aarch64", "-cpu", "help"],
                                  ["qemu-x86_64", "-h"], []])
def test_a_qemu_query_or_a_gone_process_is_not_emulation(argv):
    assert not emulates("qemu-aarch64", argv)


def test_a_qemu_running_a_program_or_a_dask_program_is():
    assert emulates("qemu-aarch64", ["qemu-aarch64", "-cpu", "cortex-a72", "-L", "/p", "/usr/bin/python3", "w.py"])
    assert emulates("dask-worker", [])


def _qemu(arch: str):
    from quantbench.hosts.emulated import qemu_binary

    qemu, _ = qemu_binary(arch)
    if qemu is None:
        missing_setup(f"qemu-{arch} not found: run `bash scripts/setup.sh`")
    return str(qemu)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def test_the_version_query_every_emulated_run_makes_is_not_seen_as_emulation():
    with QemuWatch(interval=3600) as watch:   # scanned by hand below, not by the poll
        proc = subprocess.Popen([_qemu("aarch64"), "--version"], stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while _state(proc.pid) != "Z" and time.monotonic() < deadline:   # exited, not reaped: still in /proc
                time.sleep(0.05)
            watch._scan()
        finally:
            proc.wait()
    assert watch.seen == []


@pytest.mark.slow
def test_a_running_emulation_is_seen():
    from quantbench.hosts.emulated import ready, python_command

    ok, msg = ready("pi")
    if not ok:
        missing_setup(f"pi not set up: {msg}")
    argv, env = python_command("pi")
    with QemuWatch(interval=3600) as watch:
        proc = subprocess.Popen(argv + ["-c", "import sys; sys.stdin.read()"], env=env, stdin=subprocess.PIPE)
        try:
            watch._scan()
        finally:
            proc.stdin.close()
            proc.wait(300)
    assert {seen.split(" (")[0] for seen in watch.seen} == {"qemu-aarch64"}
