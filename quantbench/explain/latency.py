"""Latency and memory on real hosts (local, ssh): never under emulation.

Protocol (as the SKU study asks for latency): warm-up runs first, then `repeats`
blocks of `runs` timed inferences; each block gives a median, the reported
latency is the median of those medians and the spread is max - min of them.
Timing is the worker's own clock around ``session.run`` on one fixture, so the
protocol framing is not timed. Peak RSS is the worker process's high-water mark
(VmHWM) for a local host, read after the runs (a fresh worker per variant); over
ssh it is not measured. The int8 speed-up is fp32 median / int8 median on the
same host: > 1 faster, < 1 slower; "same" when the two differ by less than the
sum of their spreads.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from quantbench.errors import ParameterError, UserError
from quantbench.fsutil import canonical_json
from quantbench.hosts.registry import make_host
from quantbench.hosts.startup import open_worker
from quantbench.inputs.modelio import load_model, semantic_sha256
from quantbench.textfmt import text_table


@dataclass
class LatencyRow:
    host: str
    fingerprint_id: str
    variant_id: str
    variant: str
    session_options: str
    warmup: int
    runs: int
    repeats: int
    median_ms: float
    spread_ms: float
    peak_rss_mb: float | None
    speedup_vs_fp32: float | None = None
    sign: str = ""

    def row(self) -> dict:
        return asdict(self)


def check_host(host) -> None:
    """Refuse a host (a hosts.registry.HostRequest) whose times are no device latency; the host says why."""
    why = make_host(host.spec).latency_refusal()
    if why:
        raise UserError(f"host {host.label}: {why}")


def _vm_hwm_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


#: the most runs a measurement takes (docs/explain.md): every run is one result the worker sends and the command
#: keeps, so `--runs 100000000` ran past 120 s at 1.7 GB, `--warmup 1000000000` grew during the warm-up
MAX_WARMUP, MAX_RUNS, MAX_REPEATS = 100, 1000, 20


def check_counts(warmup, runs, repeats) -> None:
    """Warm-up runs, timed runs per repeat and repeats each a whole number within its bounds (before any host
    runs)."""
    for name, value, low, high, why in (
            ("runs", runs, 10, MAX_RUNS, "timed runs per repeat"),
            ("repeats", repeats, 3, MAX_REPEATS, "the spread of the median needs at least 3"),
            ("warmup", warmup, 1, MAX_WARMUP, "untimed warm-up runs")):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ParameterError(name, f"must be a whole number from {low} to {high} ({why})", value)


def measure(model_path, host, fixture, warmup: int = 3, runs: int = 10, repeats: int = 3,
            variant_name: str = "", require_providers: bool = False, variant_id: str | None = None) -> LatencyRow:
    """One variant on one host; `host` is a hosts.registry.HostRequest; `variant_id` its semantic hash when the
    caller has it (a run plan), else the model is parsed for it."""
    from pathlib import Path

    check_host(host)
    check_counts(warmup, runs, repeats)
    model = Path(model_path).read_bytes()
    w = open_worker(host, require_providers)
    try:
        res = w.run(model, [fixture], host.session, return_tensors=False, repeat=warmup + runs * repeats)
        rss = _vm_hwm_mb(w.client.pid) if w.host.local_pid_memory else None
    finally:
        w.close()
    secs = [r["seconds"] for r in sorted(res, key=lambda r: r["repeat"])][warmup:]
    medians = [statistics.median(secs[i * runs:(i + 1) * runs]) * 1000.0 for i in range(repeats)]
    vid = variant_id or semantic_sha256(load_model(model_path, check=False))
    return LatencyRow(host.label, w.fingerprint_id, vid,
                      variant_name or Path(model_path).stem, canonical_json(host.session), warmup, runs, repeats,
                      statistics.median(medians), max(medians) - min(medians), rss)


def with_speedups(rows: list[LatencyRow], fp32_name: str = "fp32") -> list[LatencyRow]:
    """Fill speedup_vs_fp32 and sign from the fp32 row of the same host."""
    base = {r.host: r for r in rows if r.variant == fp32_name}
    for r in rows:
        b = base.get(r.host)
        if b is None or r is b:
            continue
        r.speedup_vs_fp32 = b.median_ms / r.median_ms if r.median_ms > 0 else None
        if abs(b.median_ms - r.median_ms) <= b.spread_ms + r.spread_ms:
            r.sign = "same"
        else:
            r.sign = "faster" if r.median_ms < b.median_ms else "slower"
    return rows


def table(rows: list[LatencyRow]) -> str:
    head = ("host", "variant", "median ms", "spread ms", "peak RSS MiB", "speed-up vs fp32", "sign")
    return text_table(head, [(r.host, r.variant, f"{r.median_ms:.3f}", f"{r.spread_ms:.3f}",
                              None if r.peak_rss_mb is None else f"{r.peak_rss_mb:.1f}",
                              None if r.speedup_vs_fp32 is None else f"{r.speedup_vs_fp32:.2f}x", r.sign or None)
                             for r in rows])
