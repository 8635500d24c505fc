"""The search's two caches (results/search/evaluations.jsonl, latency.jsonl) are trusted only as this machine
wrote them: each line sealed with the machine's HMAC (the accuracy and equiv caches' seal), every value of its
type and range. An edited, unsealed or ill-typed line is a miss (computed again), never a figure; a cache that is
a symlink, a FIFO or a folder is one line naming it (never followed, never waited on); a huge file is read line
by line in bounded memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from cli_helpers import one_line
from quantbench.analysis.resultcache import seal
from quantbench.cli import main
from quantbench.errors import UserError
from quantbench.explain.search.cache import append_cache, read_cache
from quantbench.explain.search.evaluator import evaluation_row
from quantbench.explain.search.latency import latency_row
from quantbench.fsutil import canonical_json
from search_helpers import result_of

GOOD = {"flips": 4, "note": "", "flipped": ["f1", "f2"], "hashes": {"f1": "h1", "f2": "h2"}}


def _sealed_line(key, values) -> str:
    """A line sealed on this machine whatever its values (what only quantbench itself could write)."""
    return canonical_json({"key": key, **values, "seal": seal(canonical_json({"key": key, **values}).encode())})


def test_a_line_the_search_wrote_is_read_back_as_written(tmp_path):
    path = tmp_path / "evaluations.jsonl"
    append_cache(path, "k", GOOD)
    append_cache(path, "loc", {"first": ["t"], "runs": 3, "evaluations": 6})
    assert read_cache(path, evaluation_row) == {"k": GOOD, "loc": {"first": ["t"], "runs": 3, "evaluations": 6}}


def test_an_edited_or_unsealed_line_is_a_miss(tmp_path):
    """The issue's probes: every "flips": 4 set to 0 with the key kept; a line without a seal; a seal copied
    from another line."""
    path = tmp_path / "evaluations.jsonl"
    append_cache(path, "k", GOOD)
    append_cache(path, "j", {**GOOD, "flips": 2, "flipped": ["f1"]})
    text = path.read_text()
    path.write_text(text.replace('"flips":4', '"flips":0').replace('"flipped":["f1","f2"]', '"flipped":[]'))
    assert read_cache(path, evaluation_row) == {"j": {**GOOD, "flips": 2, "flipped": ["f1"]}}
    path.write_text(canonical_json({"key": "k", **GOOD}) + "\n")
    assert read_cache(path, evaluation_row) == {}
    other = json.loads(text.splitlines()[1])
    path.write_text(canonical_json({"key": "k", **GOOD, "seal": other["seal"]}) + "\n")
    assert read_cache(path, evaluation_row) == {}


@pytest.mark.parametrize("values", [
    {**GOOD, "flips": -1000}, {**GOOD, "flips": None}, {**GOOD, "flips": float("nan")}, {**GOOD, "flips": "4"},
    {**GOOD, "flips": True}, {k: v for k, v in GOOD.items() if k != "note"}, {**GOOD, "hashes": {"f1": 3}},
    {**GOOD, "flipped": "f1"}, {"first": ["t"], "runs": 3, "evaluations": 7}, {"first": ["t"], "runs": -1,
                                                                              "evaluations": -2},
])
def test_an_ill_typed_line_is_a_miss_even_sealed(tmp_path, values):
    path = tmp_path / "evaluations.jsonl"
    path.write_text(_sealed_line("k", values) + "\n")
    assert read_cache(path, evaluation_row) == {}


@pytest.mark.parametrize("values", [
    {"median_ms": 1e9, "spread_ms": -1}, {"median_ms": -5, "spread_ms": 0.1}, {"median_ms": "fast", "spread_ms": 0},
    {"median_ms": float("nan"), "spread_ms": 0}, {"median_ms": float("inf"), "spread_ms": 0}, {"median_ms": 1.0},
])
def test_an_ill_typed_latency_line_is_a_miss(tmp_path, values):
    path = tmp_path / "latency.jsonl"
    path.write_text(_sealed_line("k", values) + "\n")
    append_cache(path, "ok", {"median_ms": 1.5, "spread_ms": 0.0})
    assert read_cache(path, latency_row) == {"ok": {"median_ms": 1.5, "spread_ms": 0.0}}


def test_a_binary_cache_file_is_read_as_misses_and_kept(tmp_path):
    path = tmp_path / "evaluations.jsonl"
    junk = os.urandom(4096).replace(b"\n", b"x") + b"\n\x8b\xff\x00\n"
    path.write_bytes(junk)
    append_cache(path, "k", GOOD)
    assert read_cache(path, evaluation_row) == {"k": GOOD}


def test_a_fifo_a_folder_or_a_symlink_for_the_cache_is_one_line_and_never_waited_on(tmp_path):
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    done = []
    reader = threading.Thread(target=lambda: done.append(_refusal(fifo)), daemon=True)
    reader.start()
    reader.join(10)
    assert done and done[0] == f"{fifo}: is a named pipe (FIFO), expected a search cache file (remove it: the " \
                               "search computes it again) (a regular file)"
    (tmp_path / "dir.jsonl").mkdir()
    assert _refusal(tmp_path / "dir.jsonl").startswith(f"{tmp_path / 'dir.jsonl'}: is a folder, expected a search")
    target = tmp_path / "users-file.txt"
    target.write_text("mine\n")
    (tmp_path / "link.jsonl").symlink_to(target)
    assert _refusal(tmp_path / "link.jsonl").startswith(f"{tmp_path / 'link.jsonl'}: is a symbolic link; ")
    with pytest.raises(UserError, match="is a symbolic link"):
        append_cache(tmp_path / "link.jsonl", "k", GOOD)
    assert target.read_text() == "mine\n"


def _refusal(path) -> str:
    with pytest.raises(UserError) as exc:
        read_cache(path, evaluation_row)
    assert "\n" not in str(exc.value)
    return str(exc.value)


def test_a_huge_cache_file_is_read_line_by_line_in_bounded_memory(tmp_path):
    """A 256 MB evaluations.jsonl of one junk line (sparse: no disk taken) and a good line after it: the good line
    is read, the junk one skipped, and the reading process grows by a quarter of the file at most (a whole read
    held twice the file: 3.0 GB of a 1.5 GB one, which took 7 s to read here; 256 MB is four times the bound)."""
    path = tmp_path / "evaluations.jsonl"
    with open(path, "wb") as fh:
        fh.truncate(256 * 1024 * 1024)
    with open(path, "ab") as fh:
        fh.write(b"\n" + _sealed_line("k", GOOD).encode() + b"\n")
    probe = ("import resource, sys\n"
             "from quantbench.explain.search.cache import read_cache\n"
             "from quantbench.explain.search.evaluator import evaluation_row\n"
             "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
             "got = read_cache(sys.argv[1], evaluation_row)\n"
             "grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
             "print(sorted(got), grown)\n")
    proc = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    keys, grown_kb = proc.stdout.rsplit(" ", 1)
    assert keys == "['k']" and int(grown_kb) < 64 * 1024, proc.stdout


def test_a_torn_last_line_is_cut_off_and_the_next_append_starts_clean(tmp_path):
    path = tmp_path / "evaluations.jsonl"
    append_cache(path, "a", GOOD)
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"key": "b", "fli')
    assert read_cache(path, evaluation_row) == {"a": GOOD}
    assert path.read_bytes() == whole
    append_cache(path, "b", GOOD)
    assert read_cache(path, evaluation_row) == {"a": GOOD, "b": GOOD}


SEARCH = ["search", "--variant", "static-minmax", "--space", "global", "--no-progress"]


@pytest.mark.slow
def test_a_search_over_an_edited_evaluations_file_measures_again(run_dir, capsys):
    """The issue's probe 029: every "flips": 4 set to 0 made the rerun pass the base as calibrated (equiv: 4
    flips). The edited lines are misses: the rerun measures static-minmax's 4 flips on x86-avx2 again."""
    from setup_required import need_tier

    need_tier("x86-avx2")
    main([*SEARCH, "--hosts", "x86-avx2"])
    first = result_of(capsys.readouterr().out)
    assert first["tried"][0]["worst"] == 4
    path = run_dir / "results/search/evaluations.jsonl"
    path.write_text(path.read_text().replace('"flips":4', '"flips":0'))
    main([*SEARCH, "--hosts", "x86-avx2"])
    again = result_of(capsys.readouterr().out)
    assert again["tried"][0]["worst"] == 4 and not again["tried"][0]["passes"]
    assert again["evaluations_run"] >= 1


def test_a_forged_latency_file_is_measured_again(run_dir, capsys):
    """The issue's item 7: medians set to -5 were written into the recipe, "fast" was a TypeError."""
    common = [*SEARCH, "--hosts", "x86", "--max-latency-ms", "1e6", "--screen-fixtures", "1"]
    main(common)
    first = result_of(capsys.readouterr().out)
    path = run_dir / "results/search/latency.jsonl"
    for forged in ("-5", '"fast"'):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({**row, "median_ms": json.loads(forged)}) + "\n" for row in lines))
        assert main(common) in (0, 1)
        again = result_of(capsys.readouterr().out)
        timed = [r["latency_ms"]["x86"] for r in again["tried"] if r["latency_ms"]]
        assert timed and all(isinstance(ms, float) and ms > 0 for ms in timed)
        assert again["latency_measurements_run"] >= 1
    assert first["latency_measurements_run"] >= 1


def test_a_fifo_for_the_evaluations_file_is_one_line_not_a_hang(run_dir):
    """A FIFO results/search/evaluations.jsonl hung the search; now one line naming it, exit 2."""
    (run_dir / "results/search").mkdir()
    os.mkfifo(run_dir / "results/search/evaluations.jsonl")
    proc = subprocess.run([sys.executable, "-m", "quantbench", *SEARCH, "--hosts", "x86"], cwd=run_dir,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert one_line(proc.stderr, "search").endswith("results/search/evaluations.jsonl: is a named pipe (FIFO), "
                                                    "expected a search cache file (remove it: the search computes "
                                                    "it again) (a regular file)")
