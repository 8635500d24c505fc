#!/usr/bin/env python3
"""Benchmark where users wait (issue 17); prints a table and writes results/bench/speed.json.

Every figure is a ratio of two commands measured side by side in this one run,
interleaved round by round (medians and minima over --rounds), each command a
fresh `python -m quantbench` process timed from start to exit:

1. fresh   `equiv --hosts pi,x86` on the demo detector's variants (calibrated once
           here), fresh results folder each round: this tree against the baseline
           tree (--base, default d467302, extracted with `git archive`), both with
           the default --jobs (the usable cores). Target: <= 0.65.
2. cores   the same fresh run pinned to 4 cores against 2 (`taskset -c`). Target:
           <= 0.6. Needs a machine with 4 usable cores; recorded as not measurable
           otherwise.
3. cached  `equiv --hosts pi,x86` again on the fresh run's results, against
           `equiv --no-run` on the same results. Targets: < 2 s and <= 1.2x. In the
           same rounds, the baseline tree's cached `equiv` on its own fresh results
           (ratio_base: this tree against the code before, side by side).
4. tables  cached `equiv` after 100 simulated runs against the same rows in one
           part. The simulation appends the real outputs rows of the fresh run and
           99 copies under other session keys (as 99 other session settings would),
           each copy as --parts-per-run parts (a slow host writes a part every ~2 s),
           calling the runner's automatic compaction after each simulated run, as
           `quantbench run` does. Target: <= 1.3x. The baseline tree on the same
           rows without compaction (it has none) against one part gives today's
           figure.

Both trees are byte-compiled before the rounds (`compileall`), as an installed package runs after its first
start; PYTHONDONTWRITEBYTECODE keeps the rounds from writing any. (Without it, the extracted baseline and every
module edited since its last run were compiled from source in every round: a cost of code size, not of the run.)

Usage: python scripts/bench_speed.py [--parts fresh,cores,cached,tables] [--rounds 3] [--limit N]
       [--hosts pi,x86] [--base d467302] [--out results/bench/speed.json]
--limit N runs N eval images only (a quick check of the script, not a figure).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchtree import base_tree, byte_compile, qb, ratio, summarize, uptime  # noqa: E402


def calibrate_demo(work: Path) -> Path:
    vdir = work / "variants"
    if not (vdir / "index.json").exists():
        qb(ROOT, ["calibrate", "--out", vdir], work)
    return vdir


def equiv_args(hosts, vdir, results, limit, extra=()):
    a = ["equiv", "--hosts", hosts, "--variants", vdir, "--results", results, "--no-progress", *extra]
    return a + (["--limit", limit] if limit else [])


def part_fresh(args, work, vdir, base, out):
    new, old, lines = [], [], []
    for r in range(args.rounds):
        order = [("new", ROOT, new), ("base", base, old)]
        if r % 2:
            order.reverse()
        for name, tree, acc in order:
            res = work / f"fresh-{name}-{r}"
            wall, line = qb(tree, equiv_args(args.hosts, vdir, res, args.limit), work)
            acc.append(wall)
            lines.append(f"{name} round {r}: {wall:.1f} s ({line})")
            print(f"  fresh {name:4s} round {r}: {wall:6.1f} s   {line}", flush=True)
    a, b = summarize(new), summarize(old)
    out["fresh"] = {"command": " ".join(map(str, equiv_args(args.hosts, "VARIANTS", "FRESH", args.limit))),
                    "new_seconds": a, "base_seconds": b, "ratio": ratio(a, b), "target": 0.65,
                    "cores": len(os.sched_getaffinity(0)), "uptime_after": uptime()}
    return work / f"fresh-new-{args.rounds - 1}"


def part_cores(args, work, vdir, out):
    cores = len(os.sched_getaffinity(0))
    if cores < 4:
        out["cores"] = {"measured": False, "why": f"this machine has {cores} usable cores; the figure needs 4",
                        "target": 0.6}
        print(f"  cores: not measurable here ({cores} usable cores)")
        return
    four, two = [], []
    for r in range(args.rounds):
        for name, cpus, acc in ([("4", "0-3", four), ("2", "0-1", two)][::(-1 if r % 2 else 1)]):
            wall, _ = qb(ROOT, equiv_args(args.hosts, vdir, work / f"cores-{name}-{r}", args.limit), work, taskset=cpus)
            acc.append(wall)
            print(f"  cores {name} round {r}: {wall:6.1f} s", flush=True)
    a, b = summarize(four), summarize(two)
    out["cores"] = {"measured": True, "four_seconds": a, "two_seconds": b, "ratio": ratio(a, b), "target": 0.6}


def part_cached(args, work, vdir, results, base, out):
    cached, norun, based = [], [], []
    base_results = work / f"fresh-base-{args.rounds - 1}"  # the fresh part's last baseline folder, else made here
    qb(ROOT, equiv_args(args.hosts, vdir, results, args.limit), work)  # warm: every cache in place
    qb(base, equiv_args(args.hosts, vdir, base_results, args.limit), work)  # the baseline's own, warm too
    runs = [("cached", ROOT, results, [], cached), ("no-run", ROOT, results, ["--no-run"], norun),
            ("base", base, base_results, [], based)]
    for r in range(args.rounds):
        for name, tree, res, extra, acc in runs[r % 3:] + runs[:r % 3]:
            wall, line = qb(tree, equiv_args(args.hosts, vdir, res, args.limit, extra), work)
            acc.append(wall)
            print(f"  {name:7s} round {r}: {wall:6.2f} s   {line}", flush=True)
    a, b, c = summarize(cached), summarize(norun), summarize(based)
    out["cached"] = {"command": " ".join(map(str, equiv_args(args.hosts, "VARIANTS", "RESULTS", args.limit))),
                     "cached_seconds": a, "no_run_seconds": b, "ratio": ratio(a, b),
                     "base_cached_seconds": c, "ratio_base": ratio(a, c),
                     "targets": {"seconds": 2.0, "ratio": 1.2}, "uptime_after": uptime()}


def _simulate(results: Path, dest: Path, runs: int, parts_per_run: int, compact: bool) -> int:
    """dest/tables: results' tables, outputs re-written as `runs` simulated runs of parts_per_run parts."""
    import hashlib

    import pyarrow as pa

    from quantbench.store import compaction, partread, partwrite

    src = results / "tables"
    shutil.copytree(src, dest / "tables", ignore=shutil.ignore_patterns("outputs"))
    out = dest / "tables"
    rows = partread.read("outputs", src)
    n = rows.num_rows
    for k in range(runs):
        t = rows
        if k:
            sk = pa.array([f"sim{k:03d}-" + s for s in rows.column("session_key").to_pylist()])
            rk = pa.array([hashlib.sha256(f"{r}|sim{k}".encode()).hexdigest() for r in rows.column("run_key").to_pylist()])
            t = t.set_column(t.schema.get_field_index("session_key"), "session_key", sk)
            t = t.set_column(t.schema.get_field_index("run_key"), "run_key", rk)
        size = -(-n // parts_per_run)
        for i in range(0, n, size):
            partwrite.append("outputs", t.slice(i, size), root=out)
        if compact:
            compaction.maybe_compact("outputs", out)
    return len(partread.parts("outputs", out))


def _one_part(results: Path, many: Path, dest: Path) -> None:
    from quantbench.store import partread, partwrite

    shutil.copytree(results / "tables", dest / "tables", ignore=shutil.ignore_patterns("outputs"))
    rows = partread.read("outputs", many / "tables")
    partwrite.append_chunks("outputs", [rows.slice(i, 2048) for i in range(0, rows.num_rows, 2048)], root=dest / "tables")


def part_tables(args, work, vdir, base, results, out):
    runs = args.runs
    many = work / "t-many"
    flat = work / "t-flat"
    one = work / "t-one"
    for d in (many, flat, one):
        shutil.rmtree(d, ignore_errors=True)
    t0 = time.perf_counter()
    n_many = _simulate(results, many, runs, args.parts_per_run, compact=True)
    n_flat = _simulate(results, flat, runs, args.parts_per_run, compact=False)
    _one_part(results, many, one)
    print(f"  simulated {runs} runs in {time.perf_counter() - t0:.0f} s: {n_flat} parts uncompacted, "
          f"{n_many} with automatic compaction", flush=True)
    env = {"QUANTBENCH_COMPACT_PARTS": "0"}  # measure reads, never a compaction inside the timed command
    series = {("new", "many"): [], ("new", "one"): [], ("base", "flat"): [], ("base", "one"): []}
    for d in (many, one, flat):
        qb(ROOT, equiv_args(args.hosts, vdir, d, args.limit), work, env)  # warm caches (page cache, ledger)
    for r in range(args.rounds):
        keys = list(series)
        if r % 2:
            keys.reverse()
        for code, layout in keys:
            tree = ROOT if code == "new" else base
            d = {"many": many, "one": one, "flat": flat}[layout]
            wall, _ = qb(tree, equiv_args(args.hosts, vdir, d, args.limit), work, env)
            series[(code, layout)].append(wall)
            print(f"  tables {code:4s} {layout:4s} round {r}: {wall:6.2f} s", flush=True)
    s = {f"{c}_{l}": summarize(v) for (c, l), v in series.items()}
    out["tables"] = {"runs": runs, "parts_per_run": args.parts_per_run, "parts_uncompacted": n_flat,
                     "parts_with_compaction": n_many, "seconds": s,
                     "ratio_new": ratio(s["new_many"], s["new_one"]),
                     "ratio_base": ratio(s["base_flat"], s["base_one"]), "target": 1.3,
                     "command": " ".join(map(str, equiv_args(args.hosts, "VARIANTS", "TABLES", args.limit))),
                     "uptime_after": uptime()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="fresh,cores,cached,tables")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--limit", type=int, default=None, help="eval images (default: all; small = a script check)")
    ap.add_argument("--hosts", default="pi,x86")
    ap.add_argument("--base", default="d467302", help="baseline git revision")
    ap.add_argument("--runs", type=int, default=100, help="tables: simulated runs")
    ap.add_argument("--parts-per-run", type=int, default=24, help="tables: parts per simulated run")
    ap.add_argument("--work", default=None, help="work folder (default: a temporary one, removed)")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench" / "speed.json"))
    args = ap.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    tmp = None
    if args.work:
        work = Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.mkdtemp(prefix="qb-speed-")
        work = Path(tmp)
    out = {"benchmark": "speed (issue 17)", "command": "python scripts/bench_speed.py " + " ".join(sys.argv[1:]),
           "hosts": args.hosts, "limit": args.limit, "rounds": args.rounds, "base": args.base,
           "uptime_before": uptime(), "usable_cores": len(os.sched_getaffinity(0))}
    print(out["uptime_before"])
    try:
        base = base_tree(args.base, work / "base")
        for tree in (ROOT, base):
            byte_compile(tree)
        out["bytecode"] = "both trees compiled before the rounds (compileall)"
        vdir = calibrate_demo(work)
        results = None
        if "fresh" in parts:
            results = part_fresh(args, work, vdir, base, out)
        if "cores" in parts:
            part_cores(args, work, vdir, out)
        if results is None and ("cached" in parts or "tables" in parts):
            results = work / "fresh-new-only"
            qb(ROOT, equiv_args(args.hosts, vdir, results, args.limit), work)
        if "cached" in parts:
            part_cached(args, work, vdir, results, base, out)
        if "tables" in parts:
            part_tables(args, work, vdir, base, results, out)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    out["uptime_after"] = uptime()
    out["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print()
    print(f"{'figure':<44} {'new':>9} {'baseline':>9} {'ratio (median / min)':>22} target")
    if "fresh" in out:
        f = out["fresh"]
        print(f"{'fresh equiv ' + args.hosts + ' vs base':<44} {f['new_seconds']['median']:>8.1f}s "
              f"{f['base_seconds']['median']:>8.1f}s {f['ratio']['median']:>11.3f} / {f['ratio']['min']:<8.3f} <= 0.65")
    if "cores" in out:
        c = out["cores"]
        if c.get("measured"):
            print(f"{'fresh equiv, 4 cores vs 2':<44} {c['four_seconds']['median']:>8.1f}s "
                  f"{c['two_seconds']['median']:>8.1f}s {c['ratio']['median']:>11.3f} / {c['ratio']['min']:<8.3f} <= 0.6")
        else:
            print(f"{'fresh equiv, 4 cores vs 2':<44} {'-':>9} {'-':>9} {'not measurable':>22} ({c['why']})")
    if "cached" in out:
        c = out["cached"]
        print(f"{'cached equiv vs --no-run':<44} {c['cached_seconds']['median']:>8.2f}s "
              f"{c['no_run_seconds']['median']:>8.2f}s {c['ratio']['median']:>11.3f} / {c['ratio']['min']:<8.3f} "
              f"< 2 s, <= 1.2")
        print(f"{'cached equiv vs base':<44} {c['cached_seconds']['median']:>8.2f}s "
              f"{c['base_cached_seconds']['median']:>8.2f}s {c['ratio_base']['median']:>11.3f} / "
              f"{c['ratio_base']['min']:<8.3f} no slower")
    if "tables" in out:
        t = out["tables"]
        s = t["seconds"]
        print(f"{'cached equiv, %d runs vs one part (new)' % t['runs']:<44} {s['new_many']['median']:>8.2f}s "
              f"{s['new_one']['median']:>8.2f}s {t['ratio_new']['median']:>11.3f} / {t['ratio_new']['min']:<8.3f} <= 1.3")
        print(f"{'same, baseline code, no compaction':<44} {s['base_flat']['median']:>8.2f}s "
              f"{s['base_one']['median']:>8.2f}s {t['ratio_base']['median']:>11.3f} / {t['ratio_base']['min']:<8.3f} (today)")
    print(out["uptime_after"])
    from quantbench.fsutil import atomic_write_json

    atomic_write_json(args.out, out)
    print(f"wrote {os.path.relpath(args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
