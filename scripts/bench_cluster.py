#!/usr/bin/env python3
"""Benchmark the cluster executor (`--cluster`, issue 26); prints a table and writes results/bench/cluster.json.

One figure, measured side by side in this one run, interleaved round by round (medians over --rounds), each
command a fresh `python -m quantbench` process timed from start to exit, each with a fresh results folder:

  local    `equiv --hosts pi,x86` on the demo (the bundled fp32 models, --limit images per stratum), the local
           scheduler (default --jobs: the usable cores).
  cold     the same with `--cluster ADDRESS`: a distributed.LocalCluster of one worker process with 2 threads
           (one machine, as `dask worker --nthreads 2` runs it) on this machine, started anew for the round
           before the clock starts (a real cluster is up already), so its emulated workers start cold (one
           started, one forked from it); pi runs there, x86 here.
  warm     the same again on that round's cluster (its emulated workers are kept from `cold`).

Target: cold / local <= 1.15 on 2 cores (the cluster's processes share the client's cores here, so this is
the executor's overhead, not a speed-up). The scaling model (docs/benchmarks.md) takes the emulated
seconds per inference from the local run.

Usage: python scripts/bench_cluster.py [--rounds 3] [--limit 4] [--out results/bench/cluster.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from benchtree import uptime  # noqa: E402  (scripts/, beside this file: the one copy)


def timed(cmd: list[str], cwd: Path) -> float:
    """Wall seconds of one command (it must succeed)."""
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return seconds


def equiv(work: Path, name: str, limit: int, cluster: str | None) -> float:
    cmd = [sys.executable, "-m", "quantbench", "equiv", "--hosts", "pi,x86", "--limit", str(limit), "--no-progress",
           "-q", "--results", str(work / name)]
    if cluster:
        cmd += ["--cluster", cluster]
    seconds = timed(cmd, work)
    shutil.rmtree(work / name, ignore_errors=True)
    return seconds


def one_round(work: Path, i: int, limit: int) -> dict:
    from distributed import LocalCluster

    out = {}
    order = ["local", "cluster"] if i % 2 == 0 else ["cluster", "local"]
    for what in order:
        if what == "local":
            out["local"] = equiv(work, f"local-{i}", limit, None)
            continue
        with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=None,
                          local_directory=str(work / "dask")) as lc:
            out["cold"] = equiv(work, f"cold-{i}", limit, lc.scheduler_address)
            out["warm"] = equiv(work, f"warm-{i}", limit, lc.scheduler_address)
    out["load_after"] = os.getloadavg()[0]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--out", default=str(ROOT / "results" / "bench" / "cluster.json"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    started, before = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), uptime()
    rounds = []
    try:
        for i in range(args.rounds):
            rounds.append(one_round(work, i, args.limit))
            print(f"round {i + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in rounds[-1].items()), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in rounds) for k in ("local", "cold", "warm")}
    ratios = {k: [round(r[k] / r["local"], 3) for r in rounds] for k in ("cold", "warm")}
    result = {
        "started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": f"equiv --hosts pi,x86 --limit {args.limit} (demo fp32 models)", "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)), "uptime_before_after": [before],
        "cluster": "distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=True): one machine, as `dask worker --nthreads 2` runs it",
        "rounds": [{k: round(v, 3) for k, v in r.items()} for r in rounds],
        "median_seconds": {k: round(v, 3) for k, v in med.items()},
        "ratio_cold_over_local": {"median": round(statistics.median(ratios["cold"]), 3), "each": ratios["cold"]},
        "ratio_warm_over_local": {"median": round(statistics.median(ratios["warm"]), 3), "each": ratios["warm"]},
        "target": "cold / local <= 1.15",
    }
    result["met"] = result["ratio_cold_over_local"]["median"] <= 1.15
    result["uptime_before_after"].append(uptime())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    rows = [("run", "median s", "ratio to local (each round)")]
    rows.append(("local scheduler", f"{med['local']:.1f}", "1"))
    rows.append(("cluster, cold workers", f"{med['cold']:.1f}", ", ".join(map(str, ratios["cold"]))))
    rows.append(("cluster, warm workers", f"{med['warm']:.1f}", ", ".join(map(str, ratios["warm"]))))
    width = [max(len(r[c]) for r in rows) for c in range(3)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, width)))
    print(f"cold/local median {result['ratio_cold_over_local']['median']} (target <= 1.15: "
          f"{'met' if result['met'] else 'NOT met'}); written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
