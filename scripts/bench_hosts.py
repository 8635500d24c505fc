#!/usr/bin/env python3
"""Benchmark the hosts stage; prints a table and writes results/bench/hosts.json.

1. Local harness overhead: `quantbench run`'s local host (subprocess worker, input
   hash checks, output hashing, transfer, Parquet appends) against a bare
   onnxruntime loop over the same inputs with the same session options (one
   intra-op and one inter-op thread, sequential, ORT_ENABLE_ALL), over all 600
   corpus images by default, two ways:
   - in-run ratio: each harness run's wall time over the time the
     same run spent in session creation and session.run, both measured inside the
     worker. The two sides share the run's CPU and moment, so the machine's speed
     swings cancel: on this shared VM each vCPU runs the same inference 2.5-3x
     slower for seconds at a time, independently of the other (`vcpus` below);
   - side by side: the harness against the bare loop in this process, alternating,
     `--rounds` rounds (median, paired median, best of rounds). On such a machine
     these carry the 3x swings.
   What the in-run ratio cannot see is the harness slowing session.run itself by
   keeping the other core busy (input SHA-256 checks, result handling): `contention`
   measures that directly, session.run in alternating windows with a SHA-256 load
   on the other vCPU stopped and running (SIGSTOP/SIGCONT), both pinned. The
   headline ratio is in-run ratio x contention. A cross-check: session.run's fastest 2 %
   of calls over all rounds, in the worker and in the bare loop (the swings only
   ever slow a call down). Both sides include session creation; the
   worker's fixed start-up (interpreter + imports + fingerprint) is reported
   separately, and so is the first run's one-off cost of storing the fixtures and
   models tables (a rerun on the same fixtures skips it). Target: ratio <= 1.10.
2. Emulated `pi` seconds per inference for both demo models (worker-reported
   session.run time under qemu; not a device latency).
3. Two emulated hosts (pi, pi4) run together vs one after the other, fresh tables
   each time. Target: together / sequential <= 0.65.

Usage: python scripts/bench_hosts.py [--fixtures N] [--split all|eval|...] [--emulated-fixtures N] [--rounds R]
       [--parts local,pi,parallel]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantbench.inputs.assets import DEMO_CLASSIFIER, DEMO_DETECTOR, MODELS_DIR  # noqa: E402
from quantbench.fsutil import atomic_write_json  # noqa: E402
from quantbench.worker import make_session, normalize_session  # noqa: E402


def demo_variants(paths=None):
    from quantbench.inputs.variantdir import fp32_variant

    if paths:
        return [fp32_variant(p) for p in paths]
    out = []
    for name in (DEMO_CLASSIFIER, DEMO_DETECTOR):
        p = MODELS_DIR / f"{name}.onnx"
        if p.exists():
            out.append(fp32_variant(p))
    return out


def fixtures_for(v, limit, split="eval"):
    from quantbench.inputs.fixtures import fixtures_for_variants

    fx, _ = fixtures_for_variants([v], split=split, limit=limit)
    return fx


def bare_session(path):
    """(session, input name) with exactly the worker's default session options, built by its own code."""
    sess = make_session(str(path), normalize_session(None))[0]
    return sess, sess.get_inputs()[0].name


def bare_loop(v, fxs, each=None) -> float:
    t0 = time.perf_counter()
    sess, name = bare_session(v.path)
    if each is None:
        for fx in fxs:
            sess.run(None, {name: fx.array})
    else:  # timing each call costs two clock reads; only the per-inference comparison asks for it
        for fx in fxs:
            t = time.perf_counter()
            sess.run(None, {name: fx.array})
            each.append(time.perf_counter() - t)
    return time.perf_counter() - t0


def harness(v, fxs, host="x86"):
    from quantbench.runs.runner import run_hosts

    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        s = run_hosts([host], [v], fxs, progress=False, tables_root=Path(d) / "tables", jobs=1)
        wall = time.perf_counter() - t0
    h = s.hosts[0]
    assert h.ran == len(fxs) and not h.errors
    h.wall_seconds = wall  # the whole call: tables of fixtures and models, worker start-up, the run
    return h


def bench_local(variants, n, rounds, split):
    out = []
    for v in variants:
        fxs = fixtures_for(v, n, split)
        bare, har, bare_each = [], [], []
        for r in range(rounds):  # alternate which side goes first, so neither always follows the other
            if r % 2:
                har.append(harness(v, fxs))
                bare.append(bare_loop(v, fxs, bare_each))
            else:
                bare.append(bare_loop(v, fxs, bare_each))
                har.append(harness(v, fxs))
        b = statistics.median(bare)
        hs = statistics.median(h.run_seconds for h in har)
        best = min(h.run_seconds for h in har) / min(bare)  # least-disturbed rounds on a shared machine
        paired = statistics.median(h.run_seconds / x for h, x in zip(har, bare))  # neighbours in time

        # everything but the worker's fixed start-up: fixture and model tables written into an
        # empty results folder (a rerun skips the fixtures already stored), the run itself
        setup = [h.wall_seconds - h.startup_seconds - h.run_seconds for h in har]
        e2e = statistics.median((h.wall_seconds - h.startup_seconds) / x for h, x in zip(har, bare))

        def med(attr):
            return round(statistics.median(getattr(h, attr) for h in har), 4)

        # the same run's own bare-loop time: session creation + session.run, timed in the worker
        in_run = [h.run_seconds / (h.session_seconds + h.infer_seconds) for h in har]
        cont = contention(v, fxs)
        # session.run itself, worker vs bare, at each side's fastest 2 % of calls over all rounds: the
        # speed swings only slow calls down, and a higher quantile would compare how long each side
        # happened to spend on a fast vCPU
        worker_each = sorted(x for h in har for x in h.infer_each)
        bare_each.sort()
        p2 = {"worker_ms": round(1000 * worker_each[len(worker_each) // 50], 3),
              "bare_ms": round(1000 * bare_each[len(bare_each) // 50], 3)}
        p2["ratio"] = round(p2["worker_ms"] / p2["bare_ms"], 3)

        ratio = statistics.median(in_run) * cont["ratio"]
        out.append({"model": v.model, "fixtures": len(fxs), "rounds": rounds, "bare_seconds": round(b, 4),
                    "harness_seconds": round(hs, 4), "ratio": round(ratio, 3),
                    "ratio_in_run_median": round(statistics.median(in_run), 3),
                    "ratio_in_run_all": [round(x, 3) for x in in_run], "contention": cont,
                    "session_run_p2_worker_vs_bare": p2,
                    "ratio_side_by_side_median": round(hs / b, 3), "ratio_best_of_rounds": round(best, 3),
                    "ratio_paired_median": round(paired, 3),
                    "ratio_first_run_without_startup_paired_median": round(e2e, 3),
                    "first_run_tables_seconds": round(statistics.median(setup), 4),
                    "bare_ms_per_fixture": round(1000 * b / len(fxs), 3),
                    "harness_ms_per_fixture": round(1000 * hs / len(fxs), 3),
                    "worker_breakdown_seconds": {"session_run": med("infer_seconds"),
                                                 "input_sha256_verify": med("verify_seconds"),
                                                 "session_create": med("session_seconds")},
                    "worker_startup_seconds": med("startup_seconds"), "target_ratio": 1.10,
                    "bare_all": [round(x, 4) for x in bare], "harness_all": [round(h.run_seconds, 4) for h in har]})
    return out


def emulated_per_inference(variants, n, preset="pi"):
    from quantbench.hosts.registry import make_host, resolve_hosts
    from quantbench import tensorcode

    host = make_host(resolve_hosts([preset])[0])
    out = []
    client = host.start()
    try:
        for v in variants:
            fxs = fixtures_for(v, n)
            parts, heads, off = [], [], 0
            for fx in fxs:
                raw = tensorcode.tensor_bytes(fx.array)
                a = tensorcode.canonical(fx.array)
                heads.append({"fixture_id": fx.fixture_id, "input_name": fx.input_name, "dtype": a.dtype.str,
                              "shape": list(a.shape), "offset": off, "nbytes": len(raw)})
                parts.append(raw)
                off += len(raw)
            header = {"type": "run", "host": preset, "variant": v.name, "model": {"path": str(Path(v.path).resolve())},
                      "session": {}, "fixtures": heads, "return_tensors": False}
            secs = []
            t0 = time.perf_counter()
            for h, _ in client.request(header, parts):
                if h["type"] == "error":
                    raise SystemExit(f"{preset}: {h['message']}")
                if h["type"] == "result":
                    secs.append(h["seconds"])
            wall = time.perf_counter() - t0
            out.append({"host": preset, "model": v.model, "fixtures": len(secs),
                        "seconds_per_inference_median": round(statistics.median(secs), 4),
                        "seconds_per_inference_min": round(min(secs), 4),
                        "job_wall_seconds": round(wall, 3)})
    finally:
        client.close()
    return out


def emulated_parallel(v, n, hosts=("pi", "pi4")):
    from quantbench.runs.runner import run_hosts

    fxs = fixtures_for(v, n)
    seq = 0.0
    for h in hosts:
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            run_hosts([h], [v], fxs, progress=False, tables_root=Path(d) / "t", jobs=1)
            seq += time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        run_hosts(list(hosts), [v], fxs, progress=False, tables_root=Path(d) / "t", jobs=len(hosts))
        together = time.perf_counter() - t0
    return {"hosts": list(hosts), "model": v.model, "fixtures": len(fxs), "sequential_seconds": round(seq, 2),
            "together_seconds": round(together, 2), "ratio": round(together / seq, 3), "target_ratio": 0.65}


def _sha256_load() -> None:
    import hashlib
    import os

    data = os.urandom(1 << 22)
    while True:
        hashlib.sha256(data).digest()


def contention(v, fxs, windows: int = 60, per_window: int = 30) -> dict:
    """session.run with the other vCPU idle vs hashing (as the worker's input checks do).

    This process runs on vCPU 0 and a SHA-256 loop on vCPU 1, stopped and continued in
    alternate windows of `per_window` inferences; the ratio is the median over adjacent
    (loaded, idle) pairs, which share the moment's speed.
    """
    import multiprocessing as mp
    import os
    import signal

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return {"ratio": 1.0, "skipped": "one CPU"}
    sess, name = bare_session(v.path)
    load = mp.get_context("spawn").Process(target=_sha256_load, daemon=True)
    load.start()
    try:
        os.sched_setaffinity(load.pid, {cpus[1]})
        os.sched_setaffinity(0, {cpus[0]})
        on, off = [], []
        for w in range(2 * windows):
            busy = w % 2 == 0
            os.kill(load.pid, signal.SIGCONT if busy else signal.SIGSTOP)
            t0 = time.perf_counter()
            for k in range(per_window):
                sess.run(None, {name: fxs[(w * per_window + k) % len(fxs)].array})
            (on if busy else off).append(time.perf_counter() - t0)
    finally:
        os.sched_setaffinity(0, cpus)
        os.kill(load.pid, signal.SIGCONT)
        load.terminate()
        load.join()
    pairs = [a / b for a, b in zip(on, off)]
    return {"ratio": round(statistics.median(pairs), 3), "windows": windows, "inferences_per_window": per_window,
            "loaded_ms_median": round(1000 * statistics.median(on) / per_window, 3),
            "idle_ms_median": round(1000 * statistics.median(off) / per_window, 3)}


def vcpu_speeds(v, seconds: float = 6.0) -> dict:
    """The same inference loop on every vCPU at once, pinned: inferences per 0.25 s window.

    Shows whether this machine's speed swings are per vCPU (they are on the VM this
    project was measured on), which decides how the overhead can be measured.
    """
    import multiprocessing as mp
    import os

    cpus = sorted(os.sched_getaffinity(0))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    start = time.time() + 4.0  # after every child has imported onnxruntime and built its session
    procs = [ctx.Process(target=_count_windows, args=(str(v.path), c, start, seconds, q)) for c in cpus]
    for p in procs:
        p.start()
    got = dict(q.get() for _ in procs)
    for p in procs:
        p.join()
    return {f"vcpu{c}": {"per_window": got[c], "ms_per_inference_median": round(250 / statistics.median(got[c]), 3)
                         if statistics.median(got[c]) else None} for c in cpus}


def _count_windows(path, cpu, start, seconds, q):
    import os

    import numpy as np

    os.sched_setaffinity(0, {cpu})
    sess, name = bare_session(path)
    shape = [d if isinstance(d, int) else 1 for d in sess.get_inputs()[0].shape]
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    while time.time() < start:
        time.sleep(0.001)
    counts = []
    for w in range(int(seconds / 0.25)):
        end, k = start + 0.25 * (w + 1), 0
        while time.time() < end:
            sess.run(None, {name: x})
            k += 1
        counts.append(k)
    q.put((cpu, counts))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", type=int, default=600, help="fixtures for the local overhead")
    ap.add_argument("--split", default="all",
                    help="corpus split of those fixtures (all: 600 images, rounds of seconds, which average "
                         "out this machine's second-long swings in speed)")
    ap.add_argument("--emulated-fixtures", type=int, default=6, help="eval fixtures per emulated measurement")
    ap.add_argument("--rounds", type=int, default=9, help="alternating rounds (median) for the local overhead")
    ap.add_argument("--parts", default="local,pi,parallel",
                    help="which measurements: local (overhead), pi (seconds per inference), parallel (two hosts); "
                         "others already in --out are kept")
    ap.add_argument("--model", action="append", help="ONNX model(s) to measure instead of the bundled demo models")
    ap.add_argument("--out", default="results/bench/hosts.json")
    args = ap.parse_args(argv)
    import os
    import platform

    import onnxruntime

    variants = demo_variants(args.model)
    if not variants:
        raise SystemExit(f"no demo models in {MODELS_DIR}")
    parts = {p.strip() for p in args.parts.split(",")}
    out = Path(args.out)
    report = json.loads(out.read_text()) if out.exists() else {}
    report["machine"] = {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                         "onnxruntime": onnxruntime.__version__, "load_average_start": list(os.getloadavg())}
    report["models"] = {v.model: str(v.path) for v in variants}
    if "local" in parts:
        report["vcpus"] = vcpu_speeds(variants[0])
        print("per-vCPU speed, all vCPUs at once (ms per inference, median of 0.25 s windows): " +
              ", ".join(f"{k} {x['ms_per_inference_median']}" for k, x in report["vcpus"].items()))
        report["local_overhead"] = bench_local(variants, args.fixtures, args.rounds, args.split)
        for r in report["local_overhead"]:
            print(f"local overhead {r['model']:<18} ratio {r['ratio']:.3f} = in-run {r['ratio_in_run_median']:.3f} "
                  f"x contention {r['contention']['ratio']:.3f} (target <= 1.10); side by side: bare "
                  f"{r['bare_ms_per_fixture']:.2f} ms/fixture, harness {r['harness_ms_per_fixture']:.2f} ms/fixture, "
                  f"ratio {r['ratio_side_by_side_median']:.3f} (paired rounds "
                  f"{r['ratio_paired_median']:.3f}, best-of-rounds {r['ratio_best_of_rounds']:.3f}); session.run p2 "
                  f"worker/bare {r['session_run_p2_worker_vs_bare']['ratio']:.3f}; "
                  f"worker start-up {r['worker_startup_seconds']:.2f} s; first-run tables {r['first_run_tables_seconds']:.2f} s "
                  f"(ratio with them {r['ratio_first_run_without_startup_paired_median']:.3f}); "
                  f"inside the worker {r['worker_breakdown_seconds']}")
    emu = report.get("emulated", {}) if isinstance(report.get("emulated"), dict) else {}
    if parts & {"pi", "parallel"}:
        from quantbench.hosts.emulated import ready

        missing = [h for h in ("pi", "pi4") if not ready(h)[0]]
        if missing:
            print(f"emulated hosts not ready ({', '.join(missing)}): run `quantbench hosts setup pi pi4`; skipped")
            emu = {"skipped": f"not ready: {', '.join(missing)}"}
        else:
            emu.pop("skipped", None)
            if "pi" in parts:
                emu["pi_seconds_per_inference"] = emulated_per_inference(variants, args.emulated_fixtures)
                for r in emu["pi_seconds_per_inference"]:
                    print(f"emulated pi {r['model']:<18} {r['seconds_per_inference_median']:.3f} s/inference "
                          f"(median of {r['fixtures']})")
            if "parallel" in parts:
                par = emu["two_hosts"] = emulated_parallel(variants[0], args.emulated_fixtures)
                print(f"pi + pi4 together {par['together_seconds']:.1f} s vs one after the other "
                      f"{par['sequential_seconds']:.1f} s: ratio {par['ratio']:.3f} (target <= 0.65)")
        report["emulated"] = emu
    report["machine"]["load_average_end"] = list(os.getloadavg())
    atomic_write_json(args.out, report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
