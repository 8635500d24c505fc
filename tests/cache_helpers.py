"""Shared by the tests of caches: a cache entry builder over fsutil.build_once (for tests/fsutil/ and the
processes they start), the wait for the build gate's marks (fsutil.gate_mark), and a QUANTBENCH_HOME of a test's
own (`home`: the fingerprint and tensor caches' tests)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from quantbench import fsutil


def wait_for(gate: Path, pattern: str, count: int, procs=(), timeout: float = 900) -> None:
    """Until `count` marks matching `pattern` are in the gate folder; a process of `procs` that ends first, or
    the timeout, fails the test with what it said."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(list(gate.glob(pattern))) >= count:
            return
        for p in procs:
            if p.poll() is not None:
                _out, err = p.communicate()
                pytest.fail(f"{p.args} ended (exit {p.returncode}) before {count} x {pattern}: {(err or '')[-2000:]}")
        time.sleep(0.05)
    pytest.fail(f"{gate}: {count} x {pattern} never appeared ({sorted(p.name for p in gate.iterdir())})")


def folder_builder(entry: Path, log: list):
    """ensure(): build_once of a folder entry with a stamp beside it; `log` gets each temporary folder built."""
    stamp = entry.parent / f"{entry.name}.json"

    def done():
        return json.loads(stamp.read_text()) if stamp.exists() and entry.is_dir() else None

    def build(tmp: Path):
        log.append(tmp)
        (tmp / "data").write_text("built")
        return {"built_in": tmp.name}

    def publish(record):
        stamp.write_text(json.dumps(record))
        return record

    return lambda: fsutil.build_once(entry, done, build, publish)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A QUANTBENCH_HOME of the test's own, its fingerprint cache on (whatever the environment says)."""
    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("QUANTBENCH_FINGERPRINT_CACHE", raising=False)
    return tmp_path / "home"
