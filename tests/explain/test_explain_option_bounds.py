"""The explain commands' counts and lists, refused in one line (exit 2) before any host runs, nothing written:
noise's --threads over the cores a host runs on (100000 never finished, growing 30 MB/s), latency's --runs and
--warmup over their documented bounds (1e8 runs: 1.7 GB and past 120 s), empty --variants / --factors /
--remedies (they measured nothing and printed an empty table, remedy 'none' closes the gap), and remedy --out
inside a variants folder (files its index.json does not list)."""

from __future__ import annotations

import os

import pytest

from calib_helpers import make_corpus, tiny_model
from cli_helpers import digest, one_line
from quantbench.cli import main
from quantbench.hosts.deploy import usable_cores


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """A calibrate run of the tiny model (fp32 and static-minmax), its labels."""
    import contextlib

    d = tmp_path_factory.mktemp("explain-bounds")
    with contextlib.chdir(d):
        labels, _ = make_corpus(d / "corpus", n_litter=6, n_negative=6, n_eval=2)
        model = tiny_model(d / "models" / "tiny.onnx")
        assert main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2",
                     "--no-pre-process", "--methods", "minmax", "--no-progress"]) == 0
    return d


def _refused(calibrated, monkeypatch, capsys, command, *argv) -> str:
    monkeypatch.chdir(calibrated)
    capsys.readouterr()
    before = digest(calibrated)
    rc = main([command, *argv, "--no-progress"])
    line = one_line(capsys.readouterr().err, command)
    assert rc == 2, line
    assert digest(calibrated) == before, "something was written"
    return line


def _most_threads() -> int:
    """The largest --threads noise takes here: the usable cores (under taskset too), but never below the 2 the
    threads factor compares 1 thread against."""
    return max(2, usable_cores())


@pytest.mark.parametrize("threads", [_most_threads() + 1, 100000])
def test_noise_threads_over_the_cores_are_refused(calibrated, monkeypatch, capsys, threads):
    line = _refused(calibrated, monkeypatch, capsys, "noise", "--variant", "static-minmax", "--hosts", "x86",
                    "--threads", str(threads), "--decode", "threshold-map")
    cores, most = usable_cores(), _most_threads()
    assert f"--threads {threads}: more than the {cores} cores host x86 runs on; use at most {most}" in line, line


@pytest.fixture
def one_core():
    """This thread (and what it starts) may use one core only, as under `taskset -c 0`; restored afterwards."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    yield
    os.sched_setaffinity(0, before)


def test_noise_threads_on_one_core_advise_the_two_the_factor_takes(calibrated, monkeypatch, capsys, one_core):
    """On one core noise takes 2 threads (the factor needs N >= 2); the refusal of 3 must advise 2, not the 1
    that --threads refuses as below 2."""
    line = _refused(calibrated, monkeypatch, capsys, "noise", "--variant", "static-minmax", "--hosts", "x86",
                    "--threads", "3", "--decode", "threshold-map")
    assert "--threads 3: more than the 1 cores host x86 runs on; use at most 2" in line, line


def test_noise_threads_below_two_are_refused(calibrated, monkeypatch, capsys):
    line = _refused(calibrated, monkeypatch, capsys, "noise", "--variant", "static-minmax", "--hosts", "x86",
                    "--threads", "1", "--decode", "threshold-map")
    assert "--threads 1: must be at least 2" in line, line


@pytest.mark.parametrize("command, argv, words", [
    ("noise", ["--variant", "static-minmax", "--hosts", "x86", "--factors", "", "--decode", "threshold-map"],
     "--factors: name at least one factor of repeat, threads"),
    ("noise", ["--variant", "static-minmax", "--hosts", "x86", "--factors", " , ", "--decode", "threshold-map"],
     "--factors: name at least one factor"),
    ("latency", ["--variants", ""], "--variants '': name at least one variant, or 'all'"),
    ("latency", ["--variants", ",", "--runs", "10"], "--variants ',': name at least one variant"),
    ("latency", ["--runs", "100000000"], "--runs 100000000: must be a whole number from 10 to 1000"),
    ("latency", ["--warmup", "1000000000"], "--warmup 1000000000: must be a whole number from 1 to 100"),
    ("latency", ["--repeats", "1000"], "--repeats 1000: must be a whole number from 3 to 20"),
    ("remedy", ["--variant", "static-minmax", "--hosts", "x86,x86+session.set_denormal_as_zero=1",
                "--remedies", "", "--decode", "threshold-map"], "--remedies: name at least one remedy of"),
    ("remedy", ["--variant", "static-minmax", "--hosts", "x86,x86+session.set_denormal_as_zero=1",
                "--out", "results/variants/tiny", "--decode", "threshold-map"],
     "--out results/variants/tiny: is inside the variants folder"),
    ("remedy", ["--variant", "static-minmax", "--hosts", "x86,x86+session.set_denormal_as_zero=1",
                "--out", "results/variants/tiny/sub", "--decode", "threshold-map"],
     "--out results/variants/tiny/sub: is inside the variants folder"),
    ("remedy", ["--variant", "static-minmax", "--hosts", "x86,x86+session.set_denormal_as_zero=1",
                "--out", "results/variants", "--decode", "threshold-map"],
     "--out results/variants: is inside the variants folder"),
])
def test_an_empty_list_or_an_unbounded_count_is_refused(calibrated, monkeypatch, capsys, command, argv, words):
    line = _refused(calibrated, monkeypatch, capsys, command, *argv)
    assert words in line, line


def test_the_default_noise_threads_fit_the_cores(calibrated):
    from quantbench.explain.noise import DEFAULT_THREADS, check_threads
    from quantbench.hosts.registry import parse_hosts

    assert check_threads(None, parse_hosts("x86")) == max(2, min(DEFAULT_THREADS, usable_cores()))
    assert check_threads(None, parse_hosts("pi")) == DEFAULT_THREADS   # the Pi 5 preset deploys 4 threads
