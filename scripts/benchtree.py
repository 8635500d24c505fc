"""What the benchmarks share to measure this tree against a baseline revision, side by side.

A baseline is revision REV's quantbench package extracted with `git archive` into a folder (no checkout
touched); `qb` runs `python -m quantbench ...` from either tree (PYTHONPATH first, so the package that runs
is the tree's own) and returns its wall time. Used by scripts/bench_speed.py and scripts/bench_calibration.py.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def base_tree(rev: str, dest: Path) -> Path:
    """Revision `rev`'s quantbench package, extracted from git into `dest` (no checkout touched)."""
    dest.mkdir(parents=True, exist_ok=True)
    arch = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "quantbench"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=arch, check=True)
    return dest


def byte_compile(tree: Path) -> None:
    """The tree's quantbench package compiled to bytecode (what every start after the first finds)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(tree / "quantbench")], check=True,
                   capture_output=True)


def qb(tree: Path, args: list, cwd: Path, env_extra=None, taskset: str | None = None) -> tuple[float, str]:
    """Run `python -m quantbench ARGS` from `tree`; (wall seconds, first line of its output)."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1", **(env_extra or {}))
    cmd = [sys.executable, "-m", "quantbench", *map(str, args)]
    if taskset:
        cmd = ["taskset", "-c", taskset, *cmd]
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=str(cwd), env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return wall, "\n".join(p.stdout.strip().splitlines()[:1])


def summarize(xs: list) -> dict:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "all": [round(x, 3) for x in xs]}


def ratio(a: dict, b: dict) -> dict:
    return {"median": round(a["median"] / b["median"], 3), "min": round(a["min"] / b["min"], 3)}
