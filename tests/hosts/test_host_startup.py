"""Host start-up (quantbench/hosts/startup.py), which the explain commands and the search share: every host's
worker started at once, results in the hosts' order, and a host that fails to start leaves none of the others'
workers running (a worker left behind would hold a process and its memory until the command exits)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from quantbench.errors import UserError
from quantbench.hosts.registry import parse_hosts
from quantbench.hosts.startup import parallel, start_workers


def _children() -> set[str]:
    """This process's child processes (their ids), as the kernel lists them per thread."""
    return {pid for f in Path(f"/proc/{os.getpid()}/task").glob("*/children") for pid in f.read_text().split()}


def test_parallel_answers_in_order_and_raises_once_every_item_ran():
    ran = []

    def tenfold(x):
        ran.append(x)
        if x == 2:
            raise ValueError("two")
        return x * 10

    assert parallel(tenfold, [3, 1]) == [30, 10]
    ran.clear()
    with pytest.raises(ValueError, match="two"):
        parallel(tenfold, [1, 2, 3])
    assert sorted(ran) == [1, 2, 3]


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the child processes from /proc")
def test_a_host_that_fails_to_start_leaves_no_worker_of_the_others_running():
    """x86 starts; the same host asked for an execution provider this onnxruntime lacks (providers required) fails
    its fingerprint: start_workers raises that host's one line and closes x86's worker before it does."""
    before = _children()
    with pytest.raises(UserError, match="NoSuchExecutionProvider"):
        start_workers(parse_hosts("x86,x86+providers=NoSuchExecutionProvider"), require_providers=True)
    assert _children() <= before
    workers = start_workers(parse_hosts("x86"), require_providers=True)
    try:
        assert len(_children() - before) == 1   # the check sees a worker that is running
    finally:
        for w in workers:
            w.close()
    assert _children() <= before
