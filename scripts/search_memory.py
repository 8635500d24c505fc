#!/usr/bin/env python3
"""Peak memory of a ship search on a ~100 MB transformer-like model: the search process and every worker it starts.

Generates a ViT-like classifier (patch embedding, `--blocks` blocks of LayerNorm, single-head attention with Softmax,
an Erf-form Gelu MLP of 768 -> 3072 -> 768; about 24 MB of fp32 weights per block; a near-tie head every int8 form
flips, so the search walks), 8 random images, then runs
`quantbench calibrate --methods minmax` and `quantbench search` as a user would, each as a child process, sampling
the resident set of that process tree (/proc, every 50 ms) and printing the peak of the sum, with the search's stop
line. The design bound: a search stays within 2 GB (candidates written and run one at a time).

Usage: python scripts/search_memory.py [--workdir DIR] [--blocks 4] [--hosts x86] [--max-evaluations 12]
       [--limit 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

D, H, TOKENS, PATCH = 768, 3072, 64, 48


def _block(i: int, x: str, rng) -> tuple[list, list, str]:
    """One pre-norm transformer block on `x` [1, TOKENS, D]: (nodes, initializers, its output)."""
    w = {f"b{i}_{k}": rng.normal(0, 1 / np.sqrt(shape[0]), shape).astype(np.float32)
         for k, shape in (("wq", (D, D)), ("wk", (D, D)), ("wv", (D, D)), ("w1", (D, H)), ("w2", (H, D)))}
    c = {f"b{i}_g": np.ones(D, np.float32), f"b{i}_b": np.zeros(D, np.float32),
         f"b{i}_scale": np.array(1 / np.sqrt(D), np.float32), f"b{i}_sqrt2": np.array(np.sqrt(2), np.float32),
         f"b{i}_one": np.array(1, np.float32), f"b{i}_half": np.array(0.5, np.float32)}
    p = f"b{i}_"
    spec = [("LayerNormalization", [x, p + "g", p + "b"], p + "n", {"axis": -1}),
            ("MatMul", [p + "n", p + "wq"], p + "q", {}), ("MatMul", [p + "n", p + "wk"], p + "k", {}),
            ("MatMul", [p + "n", p + "wv"], p + "v", {}), ("Transpose", [p + "k"], p + "kt", {"perm": [0, 2, 1]}),
            ("MatMul", [p + "q", p + "kt"], p + "s", {}), ("Mul", [p + "s", p + "scale"], p + "ss", {}),
            ("Softmax", [p + "ss"], p + "a", {"axis": -1}), ("MatMul", [p + "a", p + "v"], p + "o", {}),
            ("Add", [x, p + "o"], p + "r", {}), ("MatMul", [p + "r", p + "w1"], p + "h", {}),
            ("Div", [p + "h", p + "sqrt2"], p + "hd", {}), ("Erf", [p + "hd"], p + "he", {}),
            ("Add", [p + "he", p + "one"], p + "h1", {}), ("Mul", [p + "h", p + "h1"], p + "hm", {}),
            ("Mul", [p + "hm", p + "half"], p + "gl", {}), ("MatMul", [p + "gl", p + "w2"], p + "m", {}),
            ("Add", [p + "r", p + "m"], p + "out", {})]
    nodes = [helper.make_node(op, ins, [out], name=f"{p}{j}_{op.lower()}", **attrs)
             for j, (op, ins, out, attrs) in enumerate(spec)]
    inits = [numpy_helper.from_array(v, k) for k, v in {**w, **c}.items()]
    return nodes, inits, p + "out"


def _near_tie_head(rng) -> np.ndarray:
    """[D, 8] head weights whose classes 0 and 1 differ by 0.2 of an int8 step on 32 inputs (class 1 wins in fp32 on
    a non-negative input, every int8 form ties them): the search has a decision to restore, so it walks its space
    (global choices, ranking, prefixes) instead of stopping at the variant as calibrated."""
    step = 1.0 / (D * 64)
    ints = rng.integers(1, 100, D).astype(np.float32)
    ints[0] = 127
    w = np.empty((D, 8), np.float32)
    w[:, 0] = w[:, 1] = ints * step
    w[1:33, 1] += np.float32(0.2 * step)
    w[:, 2:] = -ints[:, None] * step
    return w


def make_model(path: Path, blocks: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(np.array([1, TOKENS, PATCH], np.int64), "shape"),
             numpy_helper.from_array(rng.normal(0, 0.2, (PATCH, D)).astype(np.float32), "embed"),
             numpy_helper.from_array(_near_tie_head(rng), "head")]
    nodes = [helper.make_node("Reshape", ["images", "shape"], ["tok"], name="patches"),
             helper.make_node("MatMul", ["tok", "embed"], ["x0"], name="embed")]
    x = "x0"
    for i in range(blocks):
        n, w, x = _block(i, x, rng)
        nodes += n
        inits += w
    nodes += [helper.make_node("ReduceMean", [x], ["pooled"], axes=[1], keepdims=0, name="pool"),
              helper.make_node("Relu", ["pooled"], ["pos"], name="pos"),
              helper.make_node("MatMul", ["pos", "head"], ["logits"], name="head")]
    g = helper.make_graph(nodes, "vit_like", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 32, 32])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 8])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    (path.with_suffix(".json")).write_text(json.dumps({"decode": {"kind": "classifier-softmax", "logits": "logits"}}))
    return path


def make_corpus(folder: Path, count: int = 8) -> Path:
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    images = []
    for i in range(count):
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / "images" / f"im{i}.png")
        images.append({"id": i + 1, "file_name": f"im{i}.png", "width": 32, "height": 32,
                       "split": "train" if i < count // 2 else "eval"})
    (folder / "labels.json").write_text(json.dumps({"images": images, "annotations": [],
                                                     "categories": [{"id": 1, "name": "x"}]}))
    return folder / "labels.json"


def _tree_rss(root: int) -> int:
    """Bytes resident in `root` and every descendant (from /proc)."""
    children: dict = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            pass
        todo += children.get(pid, [])
    return total


def run_measured(args: list, cwd: Path) -> tuple[int, int, str]:
    """(exit code, peak resident bytes of its process tree, its stdout) of `python -m quantbench args`."""
    proc = subprocess.Popen([sys.executable, "-m", "quantbench", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    peak = [0]

    def sample():
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            time.sleep(0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out = proc.stdout.read()
    proc.wait()
    t.join()
    return proc.returncode, peak[0], out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--hosts", default="x86")
    ap.add_argument("--max-evaluations", type=int, default=12)
    ap.add_argument("--limit", type=int, default=4)
    a = ap.parse_args()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="qb-search-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    model = make_model(work / "vitlike.onnx", a.blocks)
    labels = make_corpus(work / "corpus")
    print(f"model: {model} ({model.stat().st_size / 1e6:.1f} MB)")
    t0 = time.monotonic()
    rc, peak, out = run_measured(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2",
                                  "--methods", "minmax", "--allow-short", "--no-progress"], work)
    print(f"calibrate: exit {rc}, peak RSS {peak / 2**20:.0f} MiB, {time.monotonic() - t0:.0f} s")
    if rc != 0:
        print(out[-3000:])
        return 1
    t0 = time.monotonic()
    rc, peak, out = run_measured(["search", "--variant", "static-minmax", "--hosts", a.hosts, "--limit", str(a.limit),
                                  "--max-evaluations", str(a.max_evaluations), "--no-progress"], work)
    stop = [ln for ln in out.splitlines() if ln.startswith(("stopped:", "done:", "chosen:", "evaluations:"))]
    print(f"search: exit {rc}, peak RSS {peak / 2**20:.0f} MiB (process and workers), "
          f"{time.monotonic() - t0:.0f} s")
    print("\n".join(stop) or out[-3000:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
