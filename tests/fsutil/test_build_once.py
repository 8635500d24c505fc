"""fsutil.build_once: a cache entry built on first use is built once, by one builder, while the others wait and
then use it; a failed build leaves nothing behind and the old entry as it was. Two builders are made to overlap
for certain with the build gate (fsutil.gate_mark), never by timing."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cache_helpers import folder_builder, wait_for
from quantbench import fsutil


def test_two_threads_on_a_cold_entry_build_it_once_and_both_use_it(tmp_path, monkeypatch):
    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv(fsutil.BUILD_GATE, str(gate))
    entry, log, results = tmp_path / "cache" / "entry", [], {}
    ensure = folder_builder(entry, log)
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, ensure())) for i in range(2)]
    for th in threads:
        th.start()
    wait_for(gate, "building.entry.*", 1)
    wait_for(gate, "waiting.entry.*", 1)  # the second found the lock held while the first is mid-build
    (gate / "go.entry").touch()
    for th in threads:
        th.join(60)
    assert sorted(built for _, built in results.values()) == [False, True]
    assert results[0][0] == results[1][0] and len(log) == 1
    assert (entry / "data").read_text() == "built"
    assert sorted(p.name for p in entry.parent.iterdir()) == [".entry.lock", "entry", "entry.json"]  # no temporary


def test_two_processes_on_a_cold_entry_build_it_once(tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    entry = tmp_path / "cache" / "entry"
    script = (f"import sys; sys.path.insert(0, {str(Path(__file__).parents[1])!r}); import cache_helpers as h; "
              f"from pathlib import Path; rec, built = h.folder_builder(Path({str(entry)!r}), [])(); "
              "print('built' if built else 'used', rec['built_in'])")
    env = dict(os.environ, **{fsutil.BUILD_GATE: str(gate)})
    first = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    wait_for(gate, "building.entry.*", 1)
    second = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    wait_for(gate, "waiting.entry.*", 1)
    (gate / "go.entry").touch()
    outs = [p.communicate(timeout=60)[0].split() for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0]
    assert [o[0] for o in outs] == ["built", "used"] and outs[0][1] == outs[1][1]  # the second used the first's
    assert len(list(gate.glob("building.entry.*"))) == 1
    assert sorted(p.name for p in entry.parent.iterdir()) == [".entry.lock", "entry", "entry.json"]


def test_a_failed_build_leaves_no_temporary_and_the_old_entry(tmp_path):
    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / "old").write_text("old")

    def build(tmp: Path):
        (tmp / "half").write_text("half")
        raise RuntimeError("the build broke")

    with pytest.raises(RuntimeError, match="the build broke"):
        fsutil.build_once(entry, lambda: None, build)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".entry.lock", "entry"]
    assert [p.name for p in entry.iterdir()] == ["old"]


def test_the_temporary_of_a_killed_builder_goes_with_the_next_build(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = fsutil.owner_tag().split("@")[1]
    left = tmp_path / f".entry.{dead.stdout.strip()}@{host}.abc123.tmp"  # what a SIGKILLed builder leaves
    (left / "half").mkdir(parents=True)
    live = fsutil.temp_beside(tmp_path / "entry")  # a live builder's (this process) is never touched
    fsutil.build_once(tmp_path / "entry", lambda: None, lambda tmp: (tmp / "data").write_text("built"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".entry.lock", "entry", live.name])


def test_a_file_entry_is_renamed_into_place_whole(tmp_path):
    entry = tmp_path / "tool.so"
    made, built = fsutil.build_once(entry, lambda: entry if entry.exists() else None,
                                    lambda tmp: tmp.write_bytes(b"ELF") and entry, folder=False)
    assert built and made == entry and entry.read_bytes() == b"ELF"
    assert fsutil.build_once(entry, lambda: entry if entry.exists() else None, lambda tmp: 1 / 0,
                             folder=False) == (entry, False)  # in place: not built again
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tool.so.lock", "tool.so"]
