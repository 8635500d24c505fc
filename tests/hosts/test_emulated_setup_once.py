"""An emulated host's prefix on first use: two `hosts setup pi4` started at once on a home without the pi4 prefix
build it once; the second waits for the first (the build gate holds the builder until it does, no timing) and then
says there is nothing to do. The home borrows this machine's qemu tools, arm64 root and wheels (links), so only the
prefix is built (a few seconds of qemu)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cache_helpers import wait_for
from quantbench import fsutil
from quantbench.hosts import emulated as E
from setup_required import missing_setup

pytestmark = pytest.mark.slow


def test_two_setups_of_one_prefix_at_once_build_it_once(tmp_path):
    ok, msg = E.ready("pi4")
    if not ok:
        missing_setup(f"pi4 not set up: {msg}")
    home, gate = tmp_path / "home", tmp_path / "gate"
    home.mkdir()
    gate.mkdir()
    for part in ("tools", "arm64-root", "wheels"):  # what the prefix is made from, as this machine has it
        (home / part).symlink_to(E.home() / part)
    env = dict(os.environ, QUANTBENCH_HOME=str(home), **{fsutil.BUILD_GATE: str(gate)})
    setup = [sys.executable, "-m", "quantbench", "hosts", "setup", "pi4"]
    start = lambda: subprocess.Popen(setup, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # noqa: E731
                                     text=True, cwd=tmp_path)
    first = start()
    wait_for(gate, "building.pi4.*", 1, [first])
    second = start()
    wait_for(gate, "waiting.pi4.*", 1, [first, second])
    (gate / "go.pi4").touch()
    (out1, err1), (out2, err2) = first.communicate(timeout=900), second.communicate(timeout=900)
    assert (first.returncode, second.returncode) == (0, 0), (err1, err2)
    assert out1.splitlines()[0].startswith(f"pi4: prefix {home / 'prefixes' / 'pi4'} for qemu ")
    assert out2.strip() == "nothing to do: already set up"
    assert len(list(gate.glob("building.*"))) == 1  # the prefix, and nothing else, was built
    assert sorted(p.name for p in (home / "prefixes").iterdir()) == [".pi4.lock", "pi4", "pi4.json"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTBENCH_HOME", str(home))
        assert E.ready("pi4")[0]
