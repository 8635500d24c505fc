#!/usr/bin/env python3
"""Latency and memory of fp32 vs int8 on real hosts; prints a table and writes results/bench/latency.json.

For each demo model present (litter-cnn, litter-detr-tiny) and each host (local by
default; ssh hosts from the hosts file with --hosts): fp32 and a static QDQ U8S8
MinMax int8 variant (calibrated here on --calib train images of the bundled
corpus), on one eval fixture. Protocol (quantbench.explain.latency): --warmup
untimed runs, then --repeats blocks of --runs timed runs; the median of the block
medians, their spread (max - min), the worker's peak RSS (local hosts), and the
int8 speed-up over fp32 with its sign. Emulated hosts are refused: emulation time
is not a device latency.

Usage: python scripts/bench_latency.py [--hosts x86] [--runs 10] [--repeats 3] [--warmup 3] [--calib 8]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantbench.inputs.assets import CORPUS_LABELS, DEMO_CLASSIFIER, DEMO_DETECTOR, MODELS_DIR  # noqa: E402
from quantbench.fsutil import atomic_write_json  # noqa: E402

OUT = Path("results/bench/latency.json")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="x86", help="comma-separated local or ssh hosts")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--calib", type=int, default=8, help="calibration images for the int8 variant")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    from quantbench.inputs.fixtures import fixtures_for_variants
    from quantbench.explain.latency import check_host, measure, table, with_speedups
    from quantbench.hosts.registry import parse_hosts
    from quantbench.quantize import variants as QV
    from quantbench.quantize import intake
    from quantbench.inputs.variantdir import fp32_variant

    hosts = parse_hosts(args.hosts, {"intra_op_num_threads": args.threads})
    for h in hosts:
        check_host(h)
    models = [MODELS_DIR / f"{n}.onnx" for n in (DEMO_CLASSIFIER, DEMO_DETECTOR) if (MODELS_DIR / f"{n}.onnx").exists()]
    if not models:
        print("no bundled demo model found in", MODELS_DIR, file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="qb-bench-latency-") as tmp:
        tmp = Path(tmp)
        for path in models:
            fp32 = fp32_variant(path)
            calib, _ = fixtures_for_variants([fp32], CORPUS_LABELS, None, "train", args.calib)
            evalfx, _ = fixtures_for_variants([fp32], CORPUS_LABELS, None, "eval", 1)
            prepared = tmp / f"{path.stem}.prepared.onnx"
            intake.prepare(path, prepared)
            int8 = QV.make_static(prepared, tmp / f"{path.stem}.static.onnx",
                                  inputs=[{fx.input_name: fx.array} for fx in calib], method="minmax",
                                  name="static-minmax")
            for name, p in (("fp32", path), ("static-minmax", int8.path)):
                for h in hosts:
                    r = measure(p, h, evalfx[0], args.warmup, args.runs, args.repeats, name)
                    r.variant = name
                    rows.append((path.stem, r))
                    print(f"{path.stem} {name} on {h.label}: {r.median_ms:.3f} ms", file=sys.stderr)
    by_model: dict = {}
    for model, r in rows:
        by_model.setdefault(model, []).append(r)
    for rs in by_model.values():
        with_speedups(rs)
    for model, rs in by_model.items():
        print(f"\n{model}")
        print(table(rs))
    atomic_write_json(OUT, {
        "protocol": {"warmup": args.warmup, "runs": args.runs, "repeats": args.repeats, "threads": args.threads,
                     "timing": "worker-side perf_counter around session.run, one eval fixture",
                     "peak_rss": "worker process VmHWM (local hosts only)",
                     "int8": f"static QDQ U8S8 MinMax per-channel, {args.calib} train images"},
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "results": [dict(r.row(), model=model) for model, r in rows],
    })
    print(f"\nwrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
