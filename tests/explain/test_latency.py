"""Latency protocol on the local host; emulated and imported hosts are refused."""

import math

import pytest

from explain_helpers import fixture, saturating_inputs, saturating_matmul, static_qdq


def test_latency_rows_and_speedup_sign(workdir):
    from quantbench.explain.latency import measure, table, with_speedups
    from quantbench.hosts.registry import parse_hosts

    fp32 = saturating_matmul(workdir / "fp32.onnx")
    int8 = static_qdq(fp32, workdir, "int8")
    fx = fixture(saturating_inputs(count=1)[0])
    [host] = parse_hosts("x86")
    rows = [measure(fp32, host, fx, variant_name="fp32"), measure(int8, host, fx, variant_name="int8")]
    with_speedups(rows)
    f, q = rows
    assert f.runs == 10 and f.repeats == 3 and f.warmup == 3
    # no wall-clock bound: how long a run takes says nothing about correctness, only about the machine
    assert math.isfinite(f.median_ms) and f.median_ms > 0 and f.spread_ms >= 0
    assert f.peak_rss_mb and f.peak_rss_mb > 10  # the worker process imported onnxruntime
    assert f.speedup_vs_fp32 is None and q.speedup_vs_fp32 == pytest.approx(f.median_ms / q.median_ms)
    assert q.sign in ("faster", "slower", "same")
    assert "int8" in table(rows)


def test_emulated_and_imported_hosts_are_refused(workdir):
    from quantbench.errors import UserError
    from quantbench.explain.latency import check_host, measure
    from quantbench.hosts.registry import HostRequest, HostSpec

    emu = HostRequest("pi", HostSpec("pi", "emulated", {"preset": "pi"}), {})
    with pytest.raises(UserError, match="not a device latency"):
        check_host(emu)
    with pytest.raises(UserError, match="imported"):
        check_host(HostRequest("airgap", HostSpec("airgap", "imported", {"file": "x"}), {}))
    [host] = __import__("quantbench.hosts.registry", fromlist=["parse_hosts"]).parse_hosts("x86")
    with pytest.raises(UserError, match="from 10 to 1000"):
        measure(saturating_matmul(workdir / "m.onnx"), host, fixture(saturating_inputs(count=1)[0]), runs=5)


def test_latency_command_refuses_emulated(workdir, capsys):
    from quantbench.cli import main

    assert main(["latency", "--hosts", "pi", "--variants", str(saturating_matmul(workdir / "m.onnx"))]) == 2
    assert "not a device latency" in capsys.readouterr().err
