"""Benchmark: quantbench's Percentile calibration vs onnxruntime's stock quantize_static.

Each measurement runs in its own process; peak RSS is the child's ru_maxrss
(os.wait4), wall time is the child's calibration + quantization (imports and
interpreter start excluded, the same for both). Both sides read the same
images lazily (one decoded tensor at a time) and produce the same QDQ model
(U8S8, per-channel, Percentile 99.999); the stock side keeps every
intermediate output, so it is killed when its RSS passes --stock-limit-gib.

    python scripts/bench_calibration.py                      # bundled detector, 8/48/200 images
    python scripts/bench_calibration.py --model quantbench/data/models/litter-cnn.onnx

Targets: ours@200 <= 1.25 x ours@8; ours@48 <= 0.5 x stock@48 (peak RSS);
ours wall <= 1.5 x stock wall wherever stock finishes.
Writes results/bench/calibration.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def calibration_images(n: int) -> list[Path]:
    """The first n non-eval images of the bundled corpus (cycled if the pool is smaller)."""
    from quantbench.assets import CORPUS_IMAGES, CORPUS_LABELS

    coco = json.loads(CORPUS_LABELS.read_text())
    pool = sorted(im["file_name"] for im in coco["images"] if im.get("split") != "eval")
    return [CORPUS_IMAGES / pool[i % len(pool)] for i in range(n)]


def spec_for(model_path: Path) -> dict:
    from quantbench.assets import load_sidecar
    from quantbench.modelio import load_model
    from quantbench.preprocess import input_spec

    m = load_model(model_path)
    inits = {i.name for i in m.graph.initializer}
    inp = next(i for i in m.graph.input if i.name not in inits)
    shape = [d.dim_value if d.HasField("dim_value") else None for d in inp.type.tensor_type.shape.dim]
    return input_spec(load_sidecar(model_path), shape, inp.name)


def child(kind: str, n: int, model: Path, out: Path, chunk_size: int) -> dict:
    from quantbench.quantize.calibration import ImageInputs

    paths = calibration_images(n)
    spec = spec_for(model)
    inputs = ImageInputs(paths, spec)
    if kind == "ours":
        from quantbench.quantize.calibration import compute_ranges
        from quantbench.quantize.variants import make_static

        import onnxruntime.quantization  # noqa: F401  (imports outside the timed region, as for stock)

        t = time.perf_counter()
        ranges = compute_ranges(model, inputs, ["percentile"], chunk_size=chunk_size)
        make_static(model, out, ranges=ranges["percentile"], method="percentile")
        wall = time.perf_counter() - t
    else:
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

        class Reader:
            def __init__(self):
                self.it = iter(inputs)

            def get_next(self):
                return next(self.it, None)

        t = time.perf_counter()
        with tempfile.TemporaryDirectory() as td:
            src = Path(td) / "model.onnx"  # quantize_static writes a shape-inferred copy beside its input
            src.write_bytes(model.read_bytes())
            quantize_static(str(src), str(out), Reader(), calibrate_method=CalibrationMethod.Percentile,
                            quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        wall = time.perf_counter() - t
    return {"wall_s": wall}


def measure(kind: str, n: int, model: Path, chunk_size: int, limit_gib: float | None, workdir: Path) -> dict:
    out = workdir / f"{kind}-{n}.onnx"
    res_file = workdir / f"{kind}-{n}.json"
    cmd = [sys.executable, __file__, "--child", kind, "--n", str(n), "--model", str(model),
           "--chunk-size", str(chunk_size), "--child-out", str(out), "--child-result", str(res_file)]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=str(ROOT))
    killed = False
    peak_seen = 0
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        try:
            with open(f"/proc/{proc.pid}/status") as fh:
                rss = next(int(l.split()[1]) for l in fh if l.startswith("VmRSS:")) * 1024
            peak_seen = max(peak_seen, rss)
            if limit_gib and rss > limit_gib * 2**30:
                proc.kill()
                killed = True
        except (OSError, StopIteration):
            pass
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    row = {"impl": kind, "images": n, "peak_rss_mib": round(ru.ru_maxrss / 1024, 1)}
    if killed:
        row.update(status=f"killed at {limit_gib:g} GiB RSS", wall_s=None)
    elif proc.returncode != 0:
        last = [l for l in err.strip().splitlines() if l.strip()][-1:] or ["?"]
        row.update(status=f"failed (exit {proc.returncode}): {last[0][:200]}", wall_s=None)
    else:
        row.update(status="ok", wall_s=round(json.loads(res_file.read_text())["wall_s"], 2))
        from quantbench.fsutil import sha256_file

        row["model_sha256"] = sha256_file(out)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="float ONNX model with sidecar (default: bundled litter-detr-tiny)")
    ap.add_argument("--sizes", default="8,48,200", help="calibration set sizes")
    ap.add_argument("--chunk-size", type=int, default=8, help="quantbench chunk size")
    ap.add_argument("--stock-limit-gib", type=float, default=8.0, help="kill a stock run whose RSS passes this")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench" / "calibration.json"))
    ap.add_argument("--child", choices=["ours", "stock"], help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--child-result", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        res = child(args.child, args.n, Path(args.model), Path(args.child_out), args.chunk_size)
        Path(args.child_result).write_text(json.dumps(res))
        return 0

    from quantbench.assets import demo_model
    from quantbench.fsutil import atomic_write_json

    model = Path(args.model) if args.model else demo_model()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="qb-bench-") as td:
        for n in sizes:
            for kind in ("ours", "stock"):
                row = measure(kind, n, model, args.chunk_size, args.stock_limit_gib if kind == "stock" else None, Path(td))
                rows.append(row)
                print(f"  {kind:5s} {n:4d} images: peak RSS {row['peak_rss_mib']:8.1f} MiB, "
                      f"wall {row['wall_s'] if row['wall_s'] is not None else '-'} s, {row['status']}", flush=True)

    def get(kind, n):
        return next((r for r in rows if r["impl"] == kind and r["images"] == n), None)

    for n in sizes:
        o, s = get("ours", n), get("stock", n)
        if o and s and o["status"] == s["status"] == "ok":
            o["identical_to_stock"] = s["identical_to_ours"] = o["model_sha256"] == s["model_sha256"]
    targets = []
    lo, hi = min(sizes), max(sizes)
    o_lo, o_hi = get("ours", lo), get("ours", hi)
    if o_lo and o_hi:
        targets.append({"target": f"ours peak RSS @{hi} <= 1.25 x ours @{lo}",
                        "ratio": round(o_hi["peak_rss_mib"] / o_lo["peak_rss_mib"], 3), "limit": 1.25})
    if 48 in sizes:
        o, s = get("ours", 48), get("stock", 48)
        # a killed stock run used at least its kill threshold; its ru_maxrss is a lower bound
        targets.append({"target": "ours peak RSS @48 <= 0.5 x stock @48",
                        "ratio": round(o["peak_rss_mib"] / s["peak_rss_mib"], 3), "limit": 0.5,
                        "stock_status": s["status"]})
    for n in sizes:
        o, s = get("ours", n), get("stock", n)
        if s["status"] == "ok" and o["status"] == "ok":
            targets.append({"target": f"ours wall @{n} <= 1.5 x stock wall @{n}",
                            "ratio": round(o["wall_s"] / s["wall_s"], 3), "limit": 1.5})
    for t in targets:
        t["met"] = t["ratio"] <= t["limit"]

    print()
    print(f"model: {model.name}   chunk size {args.chunk_size}   Percentile 99.999, U8S8 per-channel QDQ")
    print(f"{'images':>6}  {'ours RSS MiB':>12}  {'stock RSS MiB':>13}  {'ours s':>7}  {'stock s':>7}  identical  stock status")
    for n in sizes:
        o, s = get("ours", n), get("stock", n)
        fmt = lambda v: "-" if v is None else f"{v:.1f}"
        print(f"{n:>6}  {o['peak_rss_mib']:>12.1f}  {s['peak_rss_mib']:>13.1f}  {fmt(o['wall_s']):>7}  "
              f"{fmt(s['wall_s']):>7}  {str(o.get('identical_to_stock', '-')):>9}  {s['status']}")
    print()
    for t in targets:
        print(f"{'MET ' if t['met'] else 'MISS'}  {t['target']}: {t['ratio']}")
    import numpy
    import onnxruntime

    result = {
        "benchmark": "calibration",
        "command": "python scripts/bench_calibration.py " + " ".join(a for a in sys.argv[1:]),
        "model": model.name,
        "method": "percentile 99.999, U8S8, per-channel, QDQ",
        "chunk_size": args.chunk_size,
        "stock_limit_gib": args.stock_limit_gib,
        "rows": rows,
        "targets": targets,
        "machine": {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
                    "onnxruntime": onnxruntime.__version__, "numpy": numpy.__version__,
                    "note": "shared 2-core machine; wall times include other users' load"},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write_json(args.out, result)
    print(f"\nwrote {os.path.relpath(args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
