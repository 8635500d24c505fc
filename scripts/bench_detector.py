#!/usr/bin/env python3
"""Latency of the bundled fp32 litter-detr-tiny on one native onnxruntime thread.

Prints a table and writes results/bench/litter-detr-tiny.json. Each timed run is
one image (batch 1) through a session with intra_op_num_threads=1; after --warmup
untimed runs, --runs single runs are timed over the eval images in turn. The
minimum is the figure for an unloaded core (on a shared machine every other
statistic measures the neighbours); the median and p90 are given beside it.

Usage: python scripts/bench_detector.py [--runs 500] [--warmup 50]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantbench.inputs.assets import DEMO_DETECTOR, MODELS_DIR  # noqa: E402
from quantbench.inputs.sidecarfile import load_sidecar  # noqa: E402
from quantbench.inputs.fixtures import build_fixtures  # noqa: E402
from quantbench.fsutil import atomic_write_json, sha256_file  # noqa: E402
from quantbench.inputs.preprocess import input_spec  # noqa: E402

OUT = Path("results/bench/litter-detr-tiny.json")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=500, help="timed single-image runs")
    ap.add_argument("--warmup", type=int, default=50, help="untimed runs first")
    args = ap.parse_args()

    import onnxruntime as ort

    path = MODELS_DIR / f"{DEMO_DETECTOR}.onnx"
    spec = input_spec(load_sidecar(path))
    fixtures = build_fixtures(spec, split="eval")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feeds = [{spec["name"]: fx.array} for fx in fixtures]
    for i in range(args.warmup):
        sess.run(None, feeds[i % len(feeds)])
    ms = []
    for i in range(args.runs):
        t0 = time.perf_counter()
        sess.run(None, feeds[i % len(feeds)])
        ms.append((time.perf_counter() - t0) * 1000)
    ms = np.asarray(ms)
    result = {
        "model": DEMO_DETECTOR, "model_sha256": sha256_file(path),
        "size_bytes": path.stat().st_size, "threads": 1, "runs": args.runs, "warmup": args.warmup,
        "min_ms": round(float(ms.min()), 3), "median_ms": round(float(np.median(ms)), 3),
        "p90_ms": round(float(np.percentile(ms, 90)), 3),
        "onnxruntime": ort.__version__, "machine": platform.machine(), "processor": _cpu_name(),
    }
    print(f"{'model':<18} {'size MB':>8} {'min ms':>8} {'median ms':>10} {'p90 ms':>8}")
    print(f"{DEMO_DETECTOR:<18} {result['size_bytes'] / 1e6:>8.2f} {result['min_ms']:>8.3f} "
          f"{result['median_ms']:>10.3f} {result['p90_ms']:>8.3f}")
    atomic_write_json(OUT, result)
    print(f"wrote {OUT}")
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
