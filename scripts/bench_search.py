#!/usr/bin/env python3
"""Benchmark the ship search against its peers; prints a table and writes results/bench/search.json.

For each model (the bundled demo detector and real third-party models, tests/real_models.py: `nudenet-320n`, a
YOLOv8n CNN detector, and `vit-s-focus`, a 97 MB ViT-S): a fresh folder, `quantbench calibrate --methods minmax` as a
user runs it, then in the same run, on the same fixtures (a `--limit` of the eval split) and budget (decision flips
against fp32 per host):

- search: quantbench.explain.search.search over the fleet (`--hosts`), its answer written as a variant;
- top-k: onnxruntime's own recipe, the k nodes with the largest qdq_loss_debug error kept in float on the variant
  as calibrated, for the smallest k that meets the budget on the fleet (explain.search.shortest_prefix);
- NNCF: `nncf.quantize_with_accuracy_control` (ONNX backend, `pip install -e '.[bench,plots]'`: plots for the
  sample photographs) on the same prepared float
  model (prepared.onnx, what every candidate is built from), the same calibration images, the fixtures as its
  validation set and, as its metric, the share of fp32's decisions kept (1 - flips against fp32 over them, with
  quantbench's decoder and comparison) and `max_drop` the same budget; it validates on this machine only (the
  `x86` host's session);
- all float: the fp32 model, the baseline (no answer).

Then each answer (the peers' published into the variants folder beside the search's) gets a fresh `quantbench
equiv --gate decision` over the fleet in a new results folder: its flips per host against fp32 on that host. Per
row: evaluations (fleet evaluations; NNCF: its validation runs, one machine each), wall seconds, share of the
multiply-accumulate nodes' weights and MACs in int8 (read from each answer's graph: explain.int8share; a node
on 16-bit activations keeps its weights in int8, not its MACs), size
against fp32, the fresh equiv's flips per host. A host this machine cannot run is left out, saying so.

Usage: python scripts/bench_search.py [--models demo,nudenet-320n,vit-s-focus] [--hosts pi,x86,x86-avx2,x86-sse4]
       [--limit 12] [--eval-tiles N] [--budget 0] [--max-evaluations 150] [--max-seconds 1200] [--recipes search,topk,nncf]
       [--nncf-model-type auto|none] [--out JSON]
       (per model: --limit and the search's bounds as `model:value`, e.g. --limit 12,vit-s-focus:2)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from quantbench.analysis.decisions import compare  # noqa: E402
from quantbench.analysis.decode import decode, spec_for_variant  # noqa: E402
from quantbench.explain.int8share import int8_nodes, int8_share, int8_weight_nodes  # noqa: E402
from quantbench.explain.search import SearchParams, Stopped, open_walk, search, shortest_prefix  # noqa: E402
from quantbench.explain.search.space import error_feeds, error_ranking  # noqa: E402
from quantbench.fsutil import atomic_write_json  # noqa: E402
from quantbench.hosts import emulated as EM  # noqa: E402
from quantbench.hosts.registry import parse_hosts  # noqa: E402
from quantbench.runs.runner import plan_run  # noqa: E402
from quantbench.worker import DEFAULT_SESSION, make_session  # noqa: E402
from quantbench.inputs.modelio import semantic_sha256  # noqa: E402
from quantbench.inputs.variantdir import Variant, latest_variants, load_variants, write_index  # noqa: E402
from quantbench.textfmt import text_table  # noqa: E402

OUT = ROOT / "results" / "bench" / "search.json"
QB = [sys.executable, "-m", "quantbench"]


def _layout(key: str, folder: Path, eval_tiles: int | None = None) -> list[str]:
    """The calibrate arguments of model `key` laid out in `folder` (the demo: none); `eval_tiles`: its eval split
    cut to that many tiles instead of its spec's."""
    if key == "demo":
        return []
    import real_models as R

    spec = R.spec_named(key)
    if eval_tiles:
        spec = dataclasses.replace(spec, eval_tiles=eval_tiles)
    files = R.write_workdir(spec, R.fetch(spec), folder)
    rel = {k: str(Path(v).relative_to(folder)) for k, v in files.items() if k in ("model", "labels", "images")}
    return ["--model", rel["model"], "--labels", rel["labels"], "--images", rel["images"], *spec.calibrate_args]


def _shares(path, space) -> dict:
    """The int8 share of weights and MACs of the model at `path`, over the search space's multiply-accumulate
    nodes (their weights and MACs as the search counts them), read from the model's own graph."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    flags = int8_nodes(model)
    return {**int8_share(flags, space.weights, space.macs, int8_weight_nodes(model)), "float_nodes": sorted(n for n in space.weights
                                                                                if not flags.get(n))}


def publish(base, path: Path, name: str, made_by: dict, float_nodes: list) -> Path:
    """The model at `path` published as variant `name` in `base`'s folder (its recipe the base's, the calibration
    ranges' keys dropped, `made_by` saying which tool made it), so a fresh equiv runs it with the recorded inputs."""
    folder = Path(base.path).parent
    dest = folder / f"{name}.onnx"
    shutil.copyfile(path, dest)
    recipe = {k: v for k, v in (base.recipe or {}).items() if k not in ("ranges_file", "ranges_sha256",
                                                                       "calibrated_tensors", "search")}
    recipe.update(variant=name, semantic_sha256=semantic_sha256(dest), exclude_nodes=float_nodes, made_by=made_by)
    (folder / f"{name}.recipe.json").write_text(json.dumps(recipe, indent=1, sort_keys=True) + "\n")
    variants = [v for v in load_variants(folder) if v.name != name]
    write_index(folder, variants + [Variant(name=name, path=dest, model=base.model)])
    return dest


def _row(recipe: str, path, space, fp32_size: int, evaluations: int, seconds: float, **extra) -> dict:
    shares = _shares(path, space) if path else {"weights": None, "macs": None, "float_nodes": None}
    return {"recipe": recipe, "evaluations": evaluations, "seconds": round(seconds, 1),
            "int8_weights": shares["weights"], "int8_macs": shares["macs"],
            "size_vs_fp32": round(Path(path).stat().st_size / fp32_size, 3) if path else None,
            "kept_in_float": shares["float_nodes"], "file": str(path) if path else None, **extra}


def _topk(walk, base, fixtures, params) -> tuple[str, object, bool]:
    """(what, the answer's path or None, meets): onnxruntime's top-k recipe on the variant as calibrated."""
    choice = walk.space.base_choice()
    built = walk.space.build(choice, ())
    loss = error_ranking(walk.space, built.path, error_feeds(base, fixtures, params.error_images)[0])
    order = sorted(loss, key=lambda n: (-loss[n], n))
    try:
        k = shortest_prefix(walk, choice, order)
    except Stopped as stop:
        return f"top-k by qdq_loss_debug: {stop.reason}", None, False
    if k is None:
        return f"top-k by qdq_loss_debug: no k meets the budget (all {len(order)} measured nodes in float miss it)", \
            None, False
    return f"top-k by qdq_loss_debug (k={k})", walk.space.build(choice, tuple(order[:k])).path, True


def _baselines(base, fp32, hosts, fixtures, spec, params, state, answers: Path, run: bool) -> tuple[list, object]:
    """The top-k row (`run` False: not run, saying so), and the search space (its nodes' weights and MACs count
    every row's share)."""
    with open_walk(base, fp32.path, hosts, fixtures, spec, params, state) as walk:
        size = Path(fp32.path).stat().st_size
        t0, spent = time.monotonic(), walk.evaluations
        what, path, meets = _topk(walk, base, fixtures, params) if run else ("top-k: not run (--recipes)", None, None)
        if path is not None:
            path = Path(shutil.copyfile(path, answers / "topk.onnx"))
        rows = [_row(what, path, walk.space, size, walk.evaluations - spent, time.monotonic() - t0, meets=meets,
                     variant="topk" if path else None)]
        space = walk.space
    return rows, space


def _local_decisions(model_bytes: bytes, fixtures, spec, names) -> dict:
    """{fixture id: Decoded} of one model run here under the workers' default session (the `x86` host's)."""
    sess = make_session(model_bytes, json.loads(json.dumps(DEFAULT_SESSION)))[0]
    return {fx.fixture_id: decode(spec, dict(zip(names, sess.run(names, {fx.input_name: fx.array}))))
            for fx in fixtures}


def nncf_answer(base, fp32, fixtures, spec, budget: int, out: Path, model_type: str = "auto") -> dict:
    """NNCF's accuracy-aware quantization of the prepared float model: calibrated on the calibration set's images,
    validated on `fixtures` with 1 - (decision flips against fp32) / (fp32's decisions) as its metric (per fixture
    too, which its ranking of quantizer groups reads) and `budget` flips over those decisions as its absolute
    max_drop (the same budget; NNCF divides by the initial metric, so it is kept above 0). `model_type` "auto":
    NNCF's TRANSFORMER type (SmoothQuant, attention MatMuls left float) where the graph has a Softmax, as NNCF
    advises for transformers; "none": its defaults. Writes `out`; returns what it
    cost (validation runs, seconds) and its settings."""
    import nncf
    import onnx

    names = list(spec.outputs.values())
    ref = _local_decisions(Path(fp32.path).read_bytes(), fixtures, spec, names)
    served = sum(d.total for d in ref.values()) or len(ref)   # NNCF divides by the initial metric: keep it > 0
    runs = []

    def validate(model, items) -> tuple[float, list]:
        runs.append(1)
        got = _local_decisions(model.SerializeToString(), list(items), spec, names)
        per = [-len(compare(spec, ref[f], d).flips) / served for f, d in got.items()]
        return 1.0 + sum(per), per

    feeds = error_feeds(base, fixtures, 10 ** 6)[0]
    prepared = onnx.load(str(Path(base.path).parent / "prepared.onnx"))
    transformer = model_type == "auto" and any(n.op_type == "Softmax" for n in prepared.graph.node)
    kw = {"model_type": nncf.ModelType.TRANSFORMER} if transformer else {}
    t0 = time.monotonic()
    q = nncf.quantize_with_accuracy_control(
        prepared, nncf.Dataset(feeds), nncf.Dataset(fixtures, lambda fx: {fx.input_name: fx.array}), validate,
        max_drop=budget / served, drop_type=nncf.DropType.ABSOLUTE, subset_size=len(feeds), **kw)
    seconds = time.monotonic() - t0
    onnx.save(q, str(out))
    return {"validations": len(runs), "seconds": seconds, "calibration_images": len(feeds),
            "settings": {"nncf": nncf.__version__, "metric": "1 - flips / fp32's decisions", "served": served,
                         "max_drop": budget / served, "drop_type": "ABSOLUTE",
                         "model_type": "TRANSFORMER" if transformer else None, "validated_on": "x86 (this machine)"}}


def _nncf_row(base, fp32, fixtures, spec, args, space, answers: Path) -> dict:
    size = Path(fp32.path).stat().st_size
    if "nncf" not in args.recipes:
        return _row("NNCF quantize_with_accuracy_control: not run (--recipes)", None, space, size, 0, 0.0)
    t0 = time.monotonic()
    try:
        got = nncf_answer(base, fp32, fixtures, spec, args.budget, answers / "nncf.onnx", args.nncf_model_type)
    except ImportError as exc:
        return _row(f"NNCF: not installed ({exc}; pip install -e '.[bench]')", None, space, size, 0, 0.0)
    except Exception as exc:   # NNCF refuses the model: the row says so and the bench goes on
        return _row(f"NNCF failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", None, space, size, 0,
                    time.monotonic() - t0)
    return _row("NNCF quantize_with_accuracy_control", answers / "nncf.onnx", space, size, got["validations"],
                got["seconds"], nncf=got["settings"], variant="nncf-accuracy-control")

def fresh_equiv(files: list, hosts_text: str, limit: int, budget: int) -> dict:
    """A fresh `equiv --gate decision` of `files` (fp32 first) in a new results folder: {variant: {host: flips
    against fp32 on that host}}, plus "served": {host: fp32's decisions}."""
    cmd = QB + ["equiv", "--variants", *map(str, files), "--hosts", hosts_text, "--limit", str(limit), "--gate",
                "decision", "--budget", str(budget), "--results", "fresh-equiv", "--json", "--no-plots",
                "--no-progress"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode not in (0, 1):
        return {"error": (p.stderr or p.stdout).strip()[-600:]}
    out: dict = {"served": {}}
    for c in json.loads(p.stdout)["comparisons"]:
        if c["comparison"] == "own-fp32":
            out.setdefault(c["variant"], {})[c["host"]] = c["flips"]
            out["served"][c["host"]] = c["ref_total"]
    return out


def _search_row(res, space, fp32_size: int, seconds: float) -> dict:
    what = f"search ({res.variant_name})" if res.passed else "search: no answer"
    path = res.written if res.passed else None
    return _row(what, path, space, fp32_size, res.evaluations, seconds, stop=res.stop, nearest=res.nearest,
                choice=(res.chosen or {}).get("choice"), localized=res.localized, variant=res.variant_name
                if res.passed else None, tried=[[r["choice"], len(r["exclude"]), r["stage"], r["worst"], r["screen"]]
                                                for r in res.tried])


def _bench_here(folder: Path, key: str, hosts_text: str, args, limit: int, max_ev: int, max_s: float) -> dict:
    vs = {v.name: v for v in latest_variants()}
    base, fp32 = vs["static-minmax"], vs["fp32"]
    hosts = parse_hosts(hosts_text)
    plan = plan_run([h.spec for h in hosts], [base], limit=limit, check_hosts=False)
    fixtures = plan.fixtures_for[plan.variants[0].variant_id]
    spec = spec_for_variant(base)
    params = SearchParams(budget=args.budget, max_evaluations=max_ev, max_seconds=max_s)
    answers = folder / "answers"
    answers.mkdir()
    size = Path(fp32.path).stat().st_size
    t0 = time.monotonic()
    res = search(base, fp32.path, hosts, fixtures, spec, params, folder / "results" / "search") \
        if "search" in args.recipes else None
    search_s = time.monotonic() - t0
    rows, space = _baselines(base, fp32, hosts, fixtures, spec, params, folder / "results" / "search-topk", answers,
                             "topk" in args.recipes)
    rows = [_search_row(res, space, size, search_s) if res else
            _row("search: not run (--recipes)", None, space, size, 0, 0.0)] + rows
    rows.append(_nncf_row(base, fp32, fixtures, spec, args, space, answers))
    for r in rows[1:]:
        if r["file"]:
            r["file"] = str(publish(base, Path(r["file"]), r["variant"], {"recipe": r["recipe"]}, r["kept_in_float"]))
    files = [fp32.path] + [r["file"] for r in rows if r["file"]]
    flips = fresh_equiv(files, hosts_text, limit, args.budget)
    for r in rows:
        r["flips"] = flips.get(r.get("variant")) if r["file"] else None
        r["meets_everywhere"] = None if r["flips"] is None else max(r["flips"].values()) <= args.budget
    return {"model": key, "hosts": hosts_text, "fixtures": len(fixtures), "budget": args.budget,
            "max_evaluations": max_ev, "max_seconds": max_s, "served": flips.get("served"),
            "equiv_error": flips.get("error"), "rows": rows}


def bench_model(key: str, hosts_text: str, args) -> dict:
    limit, max_ev, max_s = (_for(key, v, cast) for v, cast in ((args.limit, int), (args.max_evaluations, int),
                                                                (args.max_seconds, float)))
    with tempfile.TemporaryDirectory(prefix=f"bench-search-{key}-") as tmp:
        folder = Path(tmp)
        cal = _layout(key, folder, _for(key, args.eval_tiles, int) if args.eval_tiles else None)
        t0 = time.monotonic()
        subprocess.run(QB + ["calibrate", *cal, "--methods", "minmax", "--no-progress"], cwd=folder, check=True,
                       capture_output=True)
        calibrate_s = time.monotonic() - t0
        here = os.getcwd()
        os.chdir(folder)
        try:
            out = _bench_here(folder, key, hosts_text, args, limit, max_ev, max_s)
        finally:
            os.chdir(here)
    return {**out, "calibrate_seconds": round(calibrate_s, 1)}


def _for(key: str, text: str, cast):
    """`12,vit-s-focus:2` -> 2 for vit-s-focus, 12 for any other model."""
    default, per = None, {}
    for part in str(text).split(","):
        name, _, value = part.strip().rpartition(":")
        if name:
            per[name] = cast(value)
        else:
            default = cast(value)
    return per.get(key, default)

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
    ap.add_argument("--models", default="demo,nudenet-320n,vit-s-focus")
    ap.add_argument("--hosts", default="pi,x86,x86-avx2,x86-sse4")
    ap.add_argument("--limit", default="12", help="eval fixtures per model (12,vit-s-focus:2: per model)")
    ap.add_argument("--eval-tiles", default="", help="a real model's eval split cut to N tiles (default: its "
                    "spec's; per model as --limit)")
    ap.add_argument("--budget", type=int, default=0)
    ap.add_argument("--max-evaluations", default="150", help="the search's and top-k's (per model as --limit)")
    ap.add_argument("--max-seconds", default="1200", help="the search's and top-k's (per model as --limit)")
    ap.add_argument("--recipes", default="search,topk,nncf", help="which of search,topk,nncf to run")
    ap.add_argument("--nncf-model-type", choices=("auto", "none"), default="auto",
                    help="auto: NNCF's TRANSFORMER type where the graph has a Softmax; none: NNCF's defaults")
    ap.add_argument("--out", type=Path, default=OUT, help="JSON written (default: results/bench/search.json)")
    args = ap.parse_args()
    args.recipes = {r.strip() for r in args.recipes.split(",") if r.strip()}
    hosts, notes = _hosts(args.hosts)
    for note in notes:
        print(note)
    out = {"hosts": hosts, "notes": notes, "models": []}
    for key in [m.strip() for m in args.models.split(",") if m.strip()]:
        out["models"].append(bench_model(key, hosts, args))
        atomic_write_json(args.out, out)
    table = [(m["model"], r["recipe"], r["evaluations"], r["seconds"], _pct(r["int8_weights"]), _pct(r["int8_macs"]),
              r["size_vs_fp32"], _flips(r["flips"])) for m in out["models"] for r in m["rows"]]
    print(text_table(("model", "recipe", "evaluations", "seconds", "int8 weights", "int8 MACs", "size vs fp32",
                      "flips per host (fresh equiv)"), table))
    for m in out["models"]:
        print(f"{m['model']}: {m['fixtures']} fixtures; search: {m['rows'][0].get('stop', '')}")
        if m.get("equiv_error"):
            print(f"{m['model']}: fresh equiv failed: {m['equiv_error']}")
    print(f"wrote {args.out}")
    return 0


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def _flips(per_host) -> str:
    return "-" if not per_host else ", ".join(f"{h} {n}" for h, n in per_host.items())


if __name__ == "__main__":
    sys.exit(main())
