#!/usr/bin/env python3
"""Benchmark the x86 tiers: native-masked against qemu, side by side in one run; writes results/bench/tiers.json.

1. Per inference: the demo detector (fp32 and static QDQ MinMax) on the same fixtures under
   `x86-avx2:masked` and `x86-avx2:qemu` (and the same for x86-sse4), seconds per session.run as the
   worker times it (median of a round; masked: the mean of a round before and one after qemu's); the outputs
   must be byte-identical. Target: masked >= 50x faster.
2. A whole fresh `quantbench equiv --hosts x86-avx2,x86-sse4` on the demo (after calibrate, which is not
   timed, nor is a warm-up `equiv --hosts x86` that fills the tensor cache, so every round starts alike; a fresh
   results folder each time, fingerprint cache off), masked, qemu, masked again (the masked
   figure is the mean of its two rounds, around the qemu one); the class digests must agree.
   Target: >= 10x faster.
3. The YOLOv8n of the acceptance suite (nudenet 320n) over every x86 tier this machine can show (plus x86
   itself) with 48 eval fixtures: one `equiv` after calibrate. Target: under 3 minutes on 2 cores.

The machine's load average is recorded before and after (other jobs share the cores). The package is
byte-compiled first (bench_speed.byte_compile), as an installed one runs after its first start: a caller
with PYTHONDONTWRITEBYTECODE would otherwise have every `quantbench` round compile it from source.
Usage: python scripts/bench_tiers.py [--parts inference,equiv,nudenet] [--repeat N] [--limit N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from quantbench.inputs.assets import demo_model  # noqa: E402
from quantbench.fsutil import atomic_write_json  # noqa: E402
from quantbench.hosts import cpuprofiles as P  # noqa: E402
from quantbench.hosts import masked as M  # noqa: E402
from quantbench.hosts.registry import resolve_hosts  # noqa: E402
from quantbench.hosts.workerclient import WorkerClient  # noqa: E402
from bench_speed import byte_compile  # noqa: E402  (scripts/, this script's own folder)

OUT = ROOT / "results" / "bench" / "tiers.json"
QB = [sys.executable, "-m", "quantbench"]


def _timed_run(host: str, models: dict, fixtures, repeat: int) -> dict:
    """{variant: {"seconds": median per inference, "hashes": [...]}} on a fresh worker of `host`."""
    out = {}
    with WorkerClient(resolve_hosts([host])[0]) as hs:
        for name, path in models.items():
            rows = hs.run(Path(path).read_bytes(), fixtures, repeat=repeat)
            secs = [r["seconds"] for r in rows if r.get("seconds") is not None]
            hashes = [o["sha256"] for r in rows if r["repeat"] == 0 for o in r["outputs"].values()]
            out[name] = {"seconds": statistics.median(secs), "inferences": len(secs), "hashes": hashes}
    return out


def per_inference(repeat: int) -> list[dict]:
    from tier_helpers import random_fixtures, tier_variants

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models = tier_variants(demo_model(), Path(tmp), [f.array for f in random_fixtures(demo_model(), 4, seed=9)])
        models = {"fp32": models["fp32"], "static-minmax": models["static"]}
        fixtures = random_fixtures(demo_model(), 4)
        for tier in ("x86-avx2", "x86-sse4"):  # masked rounds before and after the qemu one (the load moves)
            before = _timed_run(f"{tier}:masked", models, fixtures, repeat)
            qemu = _timed_run(f"{tier}:qemu", models, fixtures, 1)
            after = _timed_run(f"{tier}:masked", models, fixtures, repeat)
            for v in models:
                m, q = [before[v]["seconds"], after[v]["seconds"]], qemu[v]
                masked_s = statistics.mean(m)
                rows.append({"tier": tier, "variant": v, "masked_ms": round(masked_s * 1e3, 3),
                             "masked_rounds_ms": [round(x * 1e3, 3) for x in m],
                             "qemu_ms": round(q["seconds"] * 1e3, 1), "speedup": round(q["seconds"] / masked_s, 1),
                             "same_outputs": before[v]["hashes"] == q["hashes"] == after[v]["hashes"],
                             "masked_inferences": before[v]["inferences"] + after[v]["inferences"],
                             "qemu_inferences": q["inferences"]})
    return rows


def _qb(args: list, cwd: Path, env: dict) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(QB + args, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"quantbench {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    return time.monotonic() - t0


def _digests(folder: Path) -> dict:
    report = json.loads((folder / "equiv.json").read_text())
    return {v["variant"]: sorted(c["digest"] for c in v["classes"]) for v in report["variants"]}


def _classes(folder: Path) -> dict:
    report = json.loads((folder / "equiv.json").read_text())
    return {v["variant"]: [c["hosts"] for c in v["classes"]] for v in report["variants"]}


def equiv_fresh(limit: int) -> dict:
    env = dict(os.environ, QUANTBENCH_FINGERPRINT_CACHE="0")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        _qb(["calibrate", "--no-progress"], work, env)
        # untimed: decodes the eval images into the tensor cache, so every timed round starts from the same state
        _qb(["equiv", "--hosts", "x86", "--results", "warm-up", "--no-progress", "--no-plots"], work, env)
        out = {"fixtures": limit or "all (the demo's eval split)", "rounds": "masked, qemu, masked"}
        seconds, digests = {"masked": [], "qemu": []}, []
        for i, mech in enumerate(("masked", "qemu", "masked")):
            hosts = f"x86-avx2:{mech},x86-sse4:{mech}"
            limit_args = ["--limit", str(limit)] if limit else []
            seconds[mech].append(round(_qb(["equiv", "--hosts", hosts, *limit_args, "--results", f"r{i}",
                                            "--no-progress", "--no-plots"], work, env), 1))
            digests.append(_digests(work / f"r{i}"))
        out["same_outputs"] = digests[0] == digests[1] == digests[2]
        out["masked_rounds_s"], out["qemu_s"] = seconds["masked"], seconds["qemu"][0]
        out["masked_s"] = round(statistics.median(seconds["masked"]), 1)
        out["speedup"] = round(out["qemu_s"] / out["masked_s"], 1)
    return out


def nudenet_all_tiers(fixtures: int) -> dict:
    import real_models as R

    tiers = [name for name, p in P.PROFILES.items() if M.masked_unavailable(p) is None]
    spec = dataclasses.replace(R.NUDENET, eval_tiles=fixtures)
    env = dict(os.environ, QUANTBENCH_FINGERPRINT_CACHE="0")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        files = R.write_workdir(spec, R.fetch(spec), work)
        rel = {k: str(Path(files[k]).relative_to(work)) for k in ("model", "labels", "images")}
        calib = _qb(["calibrate", "--model", rel["model"], "--labels", rel["labels"], "--images", rel["images"],
                     "--no-progress"], work, env)
        hosts = ",".join(["x86"] + tiers)
        seconds = _qb(["equiv", "--hosts", hosts, "--fixtures", rel["labels"], "--images", rel["images"],
                       "--split", "eval", "--no-progress", "--no-plots"], work, env)
        classes = _classes(work / "results")
    return {"model": spec.key, "fixtures": files["n_eval"], "hosts": ["x86"] + tiers,
            "not_available": {n: M.masked_unavailable(p) for n, p in P.PROFILES.items() if n not in tiers},
            "calibrate_s": round(calib, 1), "equiv_s": round(seconds, 1), "classes": classes}


def _table(result: dict) -> str:
    lines = ["| measurement | masked | qemu | speed-up | same outputs | target |", "|---|---|---|---|---|---|"]
    for r in result.get("inference", []):
        lines.append(f"| {r['tier']} {r['variant']}, per inference | {r['masked_ms']} ms | {r['qemu_ms']} ms | "
                     f"{r['speedup']}x | {r['same_outputs']} | >= 50x |")
    e = result.get("equiv")
    if e:
        lines.append(f"| fresh `equiv --hosts x86-avx2,x86-sse4`, demo, {e['fixtures']} fixtures | {e['masked_s']} s | "
                     f"{e['qemu_s']} s | {e['speedup']}x | {e['same_outputs']} | >= 10x |")
    n = result.get("nudenet")
    if n:
        lines.append(f"| {n['model']} over {len(n['hosts'])} hosts ({', '.join(n['hosts'])}), {n['fixtures']} fixtures, "
                     f"equiv | {n['equiv_s']} s | - | - | - | < 180 s |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="inference,equiv,nudenet")
    ap.add_argument("--repeat", type=int, default=20, help="masked repeats per fixture (qemu runs each once)")
    ap.add_argument("--limit", type=int, default=0, help="demo fixtures of the fresh equiv (0: all, as a user runs it)")
    ap.add_argument("--fixtures", type=int, default=48, help="nudenet eval fixtures")
    args = ap.parse_args()
    parts = args.parts.split(",")
    result = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "loadavg_before": os.getloadavg(),
              "cpus": os.cpu_count(), "note": "2 cores shared with other jobs; load averages recorded"}
    byte_compile(ROOT)
    result["bytecode"] = "quantbench compiled before the rounds (compileall)"
    M.setup_masked(progress=True)
    if "inference" in parts:
        result["inference"] = per_inference(args.repeat)
    if "equiv" in parts:
        result["equiv"] = equiv_fresh(args.limit)
    if "nudenet" in parts:
        result["nudenet"] = nudenet_all_tiers(args.fixtures)
    result["loadavg_after"] = os.getloadavg()
    result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    print(_table(result))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(OUT, result)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
