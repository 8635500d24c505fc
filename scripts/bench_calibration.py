"""Benchmark: quantbench's Percentile calibration vs onnxruntime's stock quantize_static.

Each measurement runs in its own process; peak RSS is measured from outside it: the parent polls the
child's VmRSS (/proc/<pid>/status, every 10 ms) and reads the kernel's high-water mark of the child
from os.wait4 (ru_maxrss; quantbench no longer resets it), and the row's peak is the larger of the two
(both recorded: peak_polled_mib, ru_maxrss_mib). Wall time is the child's calibration + quantization (imports and
interpreter start excluded, the same for both). Both sides read the same
images lazily (one decoded tensor at a time) and produce the same QDQ model
(U8S8, per-channel, Percentile 99.999); the stock side keeps every
intermediate output, so it is killed when its RSS passes --stock-limit-gib.

    python scripts/bench_calibration.py                      # bundled detector, 8/48/200 images
    python scripts/bench_calibration.py --model quantbench/data/models/litter-cnn.onnx
    python scripts/bench_calibration.py --model 320n.onnx --sample-tiles \
        --input '{"name": "images", "shape": [1,3,320,320], "scale": 0.00392156862745098}' \
        --out results/bench/calibration-yolov8n.json              # a real detector (nudenet 3.4.2's 320n.onnx)

Ours runs with the default memory budget (--max-memory: a quarter of the available memory) and
the chunk size derived from it, unless --chunk-size / --max-memory are given; the plan it chose
(one pass, or two passes holding k images) is recorded per row. --sample-tiles calibrates on
tiles of scikit-learn's two sample photos (load_sample_images) at the model's input size,
shifted and mirrored, instead of the bundled corpus.

--base REV also measures the calibration of revision REV's quantbench (its package extracted with
`git archive`, as scripts/bench_speed.py does; the same child code, imported from that tree) at each
size, between ours and stock in the same run: "base" rows, and the ratios ours / base of wall and peak
RSS (the code before a change against after, side by side). With --rounds R, ours and base are measured
R times at each size, interleaved round by round (the order alternating), and the ratios are of the medians
(and of the minima); a third part then times the whole command, `quantbench calibrate --methods percentile`
(interpreter start, imports, set selection, calibration, writing), from this tree and from REV's, interleaved
the same way (both trees byte-compiled first, as in bench_speed): "cli" in the JSON, ratio this / base.

Targets: ours@max <= 1.25 x ours@min; ours@48 <= 0.5 x stock@48 and ours@max <= 0.1 x stock@48
(peak RSS); ours wall <= 1.0 x stock wall wherever stock finishes.
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

from benchtree import base_tree, byte_compile, qb, ratio, summarize, uptime  # noqa: E402


def sample_tiles(n: int, size: tuple[int, int], folder: Path) -> list[Path]:
    """n distinct PNG tiles (h x w) cut from scikit-learn's sample photos: shifted windows, mirrored
    every other time; written once into `folder`. The parent writes them before any measurement, so
    a measured child does not import scikit-learn (~140 MiB of RSS that is not calibration's)."""
    h, w = size
    paths = [folder / f"tile-{h}x{w}-{i:04d}.png" for i in range(n)]
    if all(p.exists() for p in paths):
        return paths
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i, p in enumerate(paths):
        if not p.exists():
            img = photos[i % len(photos)]
            H, W = img.shape[:2]
            th, tw = min(h, H), min(w, W)
            k = i // len(photos)
            y = (k * 37) % (H - th + 1)
            x = (k * 53) % (W - tw + 1)
            tile = np.ascontiguousarray(img[y:y + th, x:x + tw])
            if k % 2:
                tile = np.ascontiguousarray(tile[:, ::-1])
            Image.fromarray(tile).save(p)
        out.append(p)
    return out


def calibration_images(n: int, tiles: Path | None = None, size=None) -> list[Path]:
    """The first n non-eval images of the bundled corpus (cycled if the pool is smaller), or n sample tiles."""
    assets = tree_module("quantbench.inputs.assets", "quantbench.assets")
    CORPUS_IMAGES, CORPUS_LABELS = assets.CORPUS_IMAGES, assets.CORPUS_LABELS

    if tiles is not None:
        return sample_tiles(n, size, tiles)

    coco = json.loads(CORPUS_LABELS.read_text())
    pool = sorted(im["file_name"] for im in coco["images"] if im.get("split") != "eval")
    return [CORPUS_IMAGES / pool[i % len(pool)] for i in range(n)]


def tree_module(*names: str):
    """The first of the modules `names` that the running quantbench package holds (this tree's layout
    first, then older ones: a --base tree). Chosen by file, never by a failed import: the editable install
    resolves a subpackage the base tree lacks to this tree's, which would time this tree's code as the base."""
    import importlib

    import quantbench

    pkg = Path(quantbench.__file__).parent
    name = next((n for n in names if pkg.joinpath(*n.split(".")[1:]).with_suffix(".py").is_file()), None)
    if name is None:
        raise SystemExit(f"{pkg} holds none of {', '.join(names)}")
    mod = importlib.import_module(name)
    if not Path(mod.__file__).resolve().is_relative_to(pkg.resolve()):
        raise SystemExit(f"{name} came from {mod.__file__}, not from {pkg}")
    return mod


def spec_for(model_path: Path, input_block: dict | None = None) -> dict:
    load_sidecar = tree_module("quantbench.inputs.sidecarfile", "quantbench.inputs.assets",
                               "quantbench.recipe").load_sidecar
    load_model = tree_module("quantbench.inputs.modelio", "quantbench.modelio").load_model
    input_spec = tree_module("quantbench.inputs.preprocess", "quantbench.preprocess").input_spec

    m = load_model(model_path)
    inits = {i.name for i in m.graph.initializer}
    inp = next(i for i in m.graph.input if i.name not in inits)
    shape = [d.dim_value if d.HasField("dim_value") else None for d in inp.type.tensor_type.shape.dim]
    sidecar = {"input": input_block} if input_block else load_sidecar(model_path)
    return input_spec(sidecar, shape, inp.name)


def child(kind: str, n: int, model: Path, out: Path, chunk_size, args) -> dict:
    from quantbench.quantize.calibration import ImageInputs

    spec = spec_for(model, json.loads(args.input) if args.input else None)
    tiles = Path(args.tiles_dir) if args.sample_tiles else None
    shape = spec["shape"]
    h, w = (shape[2], shape[3]) if spec.get("layout", "NCHW") == "NCHW" else (shape[1], shape[2])
    paths = calibration_images(n, tiles, (h, w))
    inputs = ImageInputs(paths, spec)
    plan: dict = {}
    if kind in ("ours", "base"):  # base: the same code path, imported from the --base tree (measure: --tree)
        from quantbench.quantize.calibration import compute_ranges
        from quantbench.quantize.ort_api import load_with_shape_infer
        from quantbench.quantize.variants import make_static

        import onnxruntime.quantization  # noqa: F401  (imports outside the timed region, as for stock)

        t = time.perf_counter()
        m = load_with_shape_infer(model)  # once, as the calibrate command does (stock also infers once)
        ranges = compute_ranges(model, inputs, ["percentile"], chunk_size=chunk_size, max_memory=args.max_memory,
                                threads=args.threads, model=m, plan=plan)
        make_static(model, out, ranges=ranges["percentile"], method="percentile", model=m)
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
    import quantbench

    return {"wall_s": wall, "plan": plan, "package": str(Path(quantbench.__file__).parent)}


def measure(kind: str, n: int, model: Path, args, limit_gib: float | None, workdir: Path,
            tree: Path | None = None) -> dict:
    out = workdir / f"{kind}-{n}.onnx"
    res_file = workdir / f"{kind}-{n}.json"
    cmd = [sys.executable, __file__, "--child", kind, "--n", str(n), "--model", str(model),
           "--child-out", str(out), "--child-result", str(res_file), "--tiles-dir", str(workdir / "tiles")]
    if tree is not None:
        cmd += ["--tree", str(tree)]
    for flag, value in (("--chunk-size", args.chunk_size), ("--max-memory", args.max_memory),
                        ("--threads", args.threads), ("--input", args.input)):
        if value is not None:
            cmd += [flag, str(value)]
    if args.sample_tiles:
        cmd.append("--sample-tiles")
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
        time.sleep(0.01)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    polled, kernel = peak_seen / 2**20, ru.ru_maxrss / 1024
    row = {"impl": kind, "images": n, "peak_rss_mib": round(max(polled, kernel), 1),
           "peak_polled_mib": round(polled, 1), "ru_maxrss_mib": round(kernel, 1)}
    if killed:
        row.update(status=f"killed at {limit_gib:g} GiB RSS", wall_s=None)
    elif proc.returncode != 0:
        last = [l for l in err.strip().splitlines() if l.strip()][-1:] or ["?"]
        row.update(status=f"failed (exit {proc.returncode}): {last[0][:200]}", wall_s=None)
    else:
        res = json.loads(res_file.read_text())
        row.update(status="ok", wall_s=round(res["wall_s"], 2), package=res.get("package"))
        if res.get("plan"):
            row["plan"] = res["plan"]
        from quantbench.fsutil import sha256_file

        row["model_sha256"] = sha256_file(out)
    return row


def interleaved(base: str | None, rounds: int) -> list:
    """The measurements at one size: ours and base `rounds` times, the order alternating, then stock once."""
    if not base:
        return ["ours", "stock"]
    pairs = [("ours", "base") if r % 2 == 0 else ("base", "ours") for r in range(rounds)]
    return [k for pair in pairs for k in pair] + ["stock"]


def walls(rows: list, kind: str, n: int) -> list:
    return [r["wall_s"] for r in rows if r["impl"] == kind and r["images"] == n and r["status"] == "ok"]


CLI_ARGS = ["calibrate", "--methods", "percentile", "--no-progress"]


def cli_part(tree: Path, rounds: int, work: Path) -> dict:
    """`quantbench calibrate` end to end from this tree and from the base tree, interleaved round by round,
    each round in a fresh folder (nothing reused between rounds or trees)."""
    for t in (ROOT, tree):
        byte_compile(t)
    series = {"new": [], "base": []}
    for r in range(rounds):
        order = [("new", ROOT), ("base", tree)] if r % 2 == 0 else [("base", tree), ("new", ROOT)]
        for code, t in order:
            cwd = work / f"cli-{code}-{r}"
            cwd.mkdir()
            wall, _ = qb(t, [*CLI_ARGS, "--out", cwd / "variants"], cwd)
            series[code].append(wall)
            print(f"  calibrate {code:4s} round {r}: {wall:6.2f} s", flush=True)
    a, b = summarize(series["new"]), summarize(series["base"])
    return {"command": " ".join(CLI_ARGS + ["--out", "VARIANTS"]), "new_seconds": a, "base_seconds": b,
            "ratio": ratio(a, b), "uptime_after": uptime()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="float ONNX model with sidecar (default: bundled litter-detr-tiny)")
    ap.add_argument("--sizes", default="8,48,200", help="calibration set sizes")
    ap.add_argument("--chunk-size", type=int, default=None, help="force a quantbench chunk size (default: derived)")
    ap.add_argument("--max-memory", default=None, help="quantbench memory budget (default: its own default)")
    ap.add_argument("--threads", type=int, default=None, help="quantbench histogram threads (default: its own)")
    ap.add_argument("--input", default=None, help="input block JSON for a model without a sidecar")
    ap.add_argument("--sample-tiles", action="store_true", help="calibrate on tiles of scikit-learn's sample photos")
    ap.add_argument("--tiles-dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--stock-limit-gib", type=float, default=8.0, help="kill a stock run whose RSS passes this")
    ap.add_argument("--base", default=None, metavar="REV",
                    help="also measure revision REV's calibration, side by side (ours / base ratios)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="with --base: interleaved rounds of ours and base at each size, and of the whole command")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench" / "calibration.json"))
    ap.add_argument("--child", choices=["ours", "base", "stock"], help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--child-result", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        if args.tree:  # the --base tree's quantbench, ahead of this one
            sys.path.insert(0, args.tree)
        res = child(args.child, args.n, Path(args.model), Path(args.child_out), args.chunk_size, args)
        Path(args.child_result).write_text(json.dumps(res))
        return 0

    from quantbench.inputs.assets import demo_model
    from quantbench.fsutil import atomic_write_json

    model = Path(args.model) if args.model else demo_model()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="qb-bench-") as td:
        if args.sample_tiles:  # written here, outside the measured children
            spec = spec_for(model, json.loads(args.input) if args.input else None)
            hw = spec["shape"][2:4] if spec.get("layout", "NCHW") == "NCHW" else spec["shape"][1:3]
            sample_tiles(max(sizes), tuple(hw), Path(td) / "tiles")
        tree = base_tree(args.base, Path(td) / "base") if args.base else None
        for n in sizes:
            for kind in interleaved(args.base, args.rounds):
                row = measure(kind, n, model, args, args.stock_limit_gib if kind == "stock" else None, Path(td),
                              tree if kind == "base" else None)
                rows.append(row)
                print(f"  {kind:5s} {n:4d} images: peak RSS {row['peak_rss_mib']:8.1f} MiB, "
                      f"wall {row['wall_s'] if row['wall_s'] is not None else '-'} s, {row['status']}", flush=True)
        cli = cli_part(tree, args.rounds, Path(td)) if args.base else None

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
        if hi > 48:
            targets.append({"target": f"ours peak RSS @{hi} <= 0.1 x stock @48 (default budget)",
                            "ratio": round(o_hi["peak_rss_mib"] / s["peak_rss_mib"], 3), "limit": 0.1,
                            "stock_status": s["status"]})
    for n in sizes:
        o, s = get("ours", n), get("stock", n)
        if s["status"] == "ok" and o["status"] == "ok":
            targets.append({"target": f"ours wall @{n} <= 1.0 x stock wall @{n}",
                            "ratio": round(o["wall_s"] / s["wall_s"], 3), "limit": 1.0})
    for n in sizes if args.base else ():
        o, b = get("ours", n), get("base", n)
        if b["status"] == o["status"] == "ok":
            o["identical_to_base"] = o["model_sha256"] == b["model_sha256"]
        if b["status"] == o["status"] == "ok" and args.rounds == 1:
            targets.append({"target": f"ours wall @{n} <= 1.0 x base ({args.base}) wall @{n}",
                            "ratio": round(o["wall_s"] / b["wall_s"], 3), "limit": 1.0})
            targets.append({"target": f"ours peak RSS @{n} <= 1.0 x base ({args.base}) peak RSS @{n}",
                            "ratio": round(o["peak_rss_mib"] / b["peak_rss_mib"], 3), "limit": 1.0})
    for n in sizes if args.base and args.rounds > 1 else ():
        o, b = walls(rows, "ours", n), walls(rows, "base", n)
        if o and b:
            r = ratio(summarize(o), summarize(b))
            targets.append({"target": f"ours wall @{n} <= 1.05 x base ({args.base}) wall @{n}, "
                                      f"median of {args.rounds} interleaved rounds", "ratio": r["median"],
                            "ratio_min": r["min"], "limit": 1.05})
    if cli:
        targets.append({"target": f"quantbench calibrate <= 1.05 x base ({args.base}), median of {args.rounds} "
                                  f"interleaved rounds", "ratio": cli["ratio"]["median"],
                        "ratio_min": cli["ratio"]["min"], "limit": 1.05})
    for t in targets:
        t["met"] = t["ratio"] <= t["limit"]

    print()
    plans = sorted({f"{r['images']}: {r['plan']['mode']} x{r['plan']['chunk']}" for r in rows if r.get("plan")})
    print(f"model: {model.name}   plan {'; '.join(plans) or '-'}   Percentile 99.999, U8S8 per-channel QDQ")
    print(f"{'images':>6}  {'ours RSS MiB':>12}  {'stock RSS MiB':>13}  {'ours s':>7}  {'stock s':>7}  identical  stock status")
    fmt = lambda v: "-" if v is None else f"{v:.1f}"
    for n in sizes:
        o, s = get("ours", n), get("stock", n)
        print(f"{n:>6}  {o['peak_rss_mib']:>12.1f}  {s['peak_rss_mib']:>13.1f}  {fmt(o['wall_s']):>7}  "
              f"{fmt(s['wall_s']):>7}  {str(o.get('identical_to_stock', '-')):>9}  {s['status']}")
    for n in sizes if args.base else ():
        b = get("base", n)
        print(f"{n:>6}  base {args.base}: RSS {b['peak_rss_mib']:.1f} MiB, {fmt(b['wall_s'])} s, {b['status']}; "
              f"ours identical to base: {get('ours', n).get('identical_to_base', '-')}")
    if cli:
        print(f"quantbench calibrate: this tree {cli['new_seconds']['median']:.2f} s, base {args.base} "
              f"{cli['base_seconds']['median']:.2f} s (medians of {args.rounds}); this / base "
              f"{cli['ratio']['median']:.3f} (min {cli['ratio']['min']:.3f})")
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
        "max_memory": args.max_memory,
        "threads": args.threads,
        "images": "sklearn sample-photo tiles" if args.sample_tiles else "bundled corpus (non-eval)",
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        "stock_limit_gib": args.stock_limit_gib,
        "base": args.base,
        "rounds": args.rounds,
        "rows": rows,
        "cli": cli,
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
