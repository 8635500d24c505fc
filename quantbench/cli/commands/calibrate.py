"""`quantbench calibrate`: balanced calibration set -> fp32, dynamic and static-QDQ variants.

With no arguments: the bundled demo detector and corpus. Writes
calib_sets/<name>/ (manifest.parquet, recipe.json), results/variants/<model>/
(<variant>.onnx, <variant>.recipe.json, static: <variant>.ranges.json, then
index.json) and results/variants/latest.json. Each folder is written in a
temporary folder and moved into place, so a failure leaves nothing behind.
"""

from __future__ import annotations

import argparse

from quantbench.analysis.decode import decode_arg
from quantbench.api.calibrate import calibrate
from quantbench.api.calibrate import options as calibrate_options
from quantbench.cli.commands import finite_float
from quantbench.cli.groups import OUTPUT, PluginArgs, session_config
from quantbench.errors import UserError
from quantbench.quantize import variants
from quantbench.quantize.methods import DEFAULT_METHODS, DEFAULT_PERCENTILE, ENTROPY_BINS, VARIANT_METHODS as METHOD_CHOICES
from quantbench.quantize.pipeline import decode_only
from quantbench.inputs.sidecarfile import REQUIREMENTS
from quantbench.textfmt import text_table

JSON_NATIVE = True  # prints its own --json summary
HELP = ("Build a calibration set balanced by your data's strata x lighting and make fp32, dynamic and "
        "static QDQ int8 variants (MinMax, Percentile, Entropy) with memory-bounded, order-independent calibration.")


def _csv(s: str) -> list[str]:
    return [x.strip() for x in str(s or "").split(",") if x.strip()]


def add_arguments(parser) -> None:
    _add_input_arguments(parser)
    _add_other_arguments(parser)


def _add_input_arguments(parser) -> None:
    """The model, its images and labels, and the code it may run (sidecar, plug-ins)."""
    g = parser.add_argument_group("inputs")
    g.add_argument("--model", default="litter-detr-tiny",
                   help="float ONNX model to quantize, with its sidecar JSON (x.onnx -> x.json) giving the input "
                        "preprocessing; a bare name is a bundled model")
    g.add_argument("--images", default=None, help="images folder; if omitted: the bundled corpus, or images/ beside --labels")
    g.add_argument("--labels", default=None,
                   help="labels: COCO JSON (images with optional 'split'; annotations give the object count, or one "
                        "annotation without bbox per image its label) or CSV with 'image' and 'density' (count, or "
                        "empty/objects) or 'label' columns; if omitted: the bundled corpus")
    g.add_argument("--sidecar", default=None, metavar="FILE",
                   help="sidecar JSON (input, classes, decode); if omitted: the JSON beside --model (x.onnx -> x.json)")
    g.add_argument("--fp32", default=None, metavar="FILE",
                   help="the float original of an already-quantized --model: published beside it as fp32, so "
                        "flips count against it (an already-quantized model is never re-quantized)")
    g.add_argument("--preprocess", default=None, metavar="MODULE:FUNCTION",
                   help="preprocessing plug-in fn(rgb HxWx3 uint8, spec) -> input tensor, instead of the input block's "
                        "resize/scale/mean/std (recorded with its file's SHA-256 in every variant's recipe)")
    g.add_argument("--decode", default=None, type=decode_arg, metavar="KIND",
                   help="the model's decoder instead of the sidecar's decode kind: a built-in kind, none, or a "
                        "plug-in module:function (a plug-in is recorded with its file's SHA-256 in every recipe)")
    PluginArgs().add(parser)


def _add_other_arguments(parser) -> None:
    g = parser.add_argument_group("calibration set")
    g.add_argument("--name", default=None, help="calibration set name: calib_sets/<name>/; if omitted: <model>-n<per-cell>-seed<seed>")
    g.add_argument("--per-cell", type=int, default=12,
                   help="images per stratum x lighting cell (objects/empty x dark/bright: 48 images when both strata exist)")
    g.add_argument("--strata", default="auto", choices=["auto", "objects", "label"],
                   help="strata: by object count (empty/objects) or by each image's one label (classifiers); auto: "
                        "label when every image carries exactly one label")
    g.add_argument("--count-bins", default="",
                   help="split object-bearing images by object count at these edges, e.g. '3' -> objects-1-2, objects-3+")
    g.add_argument("--seed", type=int, default=0, help="selection seed")
    g.add_argument("--allow-short", action="store_true",
                   help="accept cells with fewer candidates than --per-cell and record the shortfall in the manifest")
    g.add_argument("--skip-bad", action="store_true",
                   help="skip unreadable images (recorded in the manifest as skipped) instead of stopping")
    g = parser.add_argument_group("variants")
    g.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help=f"variants besides fp32, comma-separated from {', '.join(METHOD_CHOICES)} (entropy is not a "
                        "default: at its default bins it duplicates minmax)")
    g.add_argument("--out", default=None, help="variants folder; if omitted: results/variants/<model>")
    g.add_argument("--percentile", type=finite_float, default=DEFAULT_PERCENTILE,
                   help="Percentile calibration: percentile kept")
    g.add_argument("--entropy-bins", type=int, default=ENTROPY_BINS,
                   help="Entropy calibration: histogram bins (onnxruntime's default 128 leaves the KL search a single "
                        "candidate, i.e. the min/max range; 512 or 2048 let it clip outliers, slower)")
    g.add_argument("--per-channel", action=argparse.BooleanOptionalAction, default=True,
                   help="per-channel weight scales")
    g.add_argument("--activation-type", default="u8", choices=["u8", "s8"], help="static: activation type")
    g.add_argument("--weight-type", default="s8", choices=["u8", "s8"], help="static and dynamic: weight type")
    g.add_argument("--types", default=None,
                   help="static activation+weight pairs, comma-separated (u8s8, s8s8, u8u8); overrides "
                        "--activation-type/--weight-type; non-u8s8 variants get a -<pair> suffix")
    g.add_argument("--reduce-range", action="store_true", help="7-bit weights (onnxruntime reduce_range)")
    g.add_argument("--exclude-nodes", default="", help="node names to leave in float, comma-separated")
    g.add_argument("--exclude-op-types", default="", help="op types to leave in float, comma-separated (e.g. Softmax)")
    g.add_argument("--require-session", dest="session_requirements", action="append", default=[], metavar="KEY=VALUE",
                   help="onnxruntime session config entry every host must set to get the quantized variants' results "
                        "(repeatable), e.g. session.x64quantprecision=1: recorded in their recipes as a deployment "
                        "requirement, applied in every run of them, named in the verdict, report and release record")
    g.add_argument("--pre-process", action=argparse.BooleanOptionalAction, default=True,
                   help="run onnxruntime's quant_pre_process (shape inference + basic optimisation) before "
                        "dynamic and static quantization")
    g = parser.add_argument_group("run")
    g.add_argument("--max-memory", default=None, metavar="SIZE",
                   help="memory budget for held activations, e.g. 2GiB or 512M (default: a quarter of the memory "
                        "available at start); the chunk size follows from it and one image's measured activations "
                        "(results do not depend on it)")
    g.add_argument("--chunk-size", type=int, default=None,
                   help="force this many images' activations held at once, in two passes (default: derived from "
                        "--max-memory; results do not depend on it)")
    g.add_argument("--threads", type=int, default=None,
                   help="histogram binning threads (default: the usable cores, at most 8; results do not depend on it)")
    g.add_argument("--force", action="store_true",
                   help="replace a calibration set or variants folder that holds different files")
    g.add_argument("--decode-only", action="store_true",
                   help="record the decode block of --sidecar (or the sidecar beside --model), with --decode as its "
                        "kind, in the existing variants of --model (or --out), without calibrating or quantizing "
                        "again: their bytes do not depend on it (the input block must be the one they were made with)")


def _options(recipe: dict) -> str:
    m = recipe.get("method")
    if m == "fp32":
        return "as given"
    if m == variants.AS_GIVEN:
        return f"{recipe.get('quant_format')}, not made by quantbench"
    parts = []
    if m == "dynamic":
        parts.append(f"w={recipe['weight_type']}")
    else:
        parts.append(f"{recipe['activation_type']}{recipe['weight_type']}")
        opts = recipe.get("calibration_options", {})
        if "percentile" in opts:
            parts.append(f"p={opts['percentile']:g}")
        if "entropy_bins" in opts:
            parts.append(f"bins={opts['entropy_bins']}")
    parts.append("per-channel" if recipe.get("per_channel") else "per-tensor")
    if recipe.get("reduce_range"):
        parts.append("reduce-range")
    n_ex = len(recipe.get("exclude_nodes", [])) + len(recipe.get("exclude_op_types", []))
    if n_ex:
        parts.append(f"{n_ex} exclusion(s)")
    if recipe.get(REQUIREMENTS):
        parts.append("requires " + ",".join(f"{k}={v}" for k, v in recipe[REQUIREMENTS].items()))
    return " ".join(parts)


def options_from_args(args) -> dict:
    """The flags -> quantbench.api.calibrate's options, the model aside (flag syntax checked here; values are
    validated by the library)."""
    try:
        count_bins = [int(x) for x in _csv(args.count_bins)]
    except ValueError:
        raise UserError(f"--count-bins: {args.count_bins!r} is not a comma-separated list of integers") from None
    types = variants.parse_types(args.types) if args.types else [(args.activation_type, args.weight_type)]
    return dict(
        labels=args.labels, images=args.images, sidecar=args.sidecar, fp32=args.fp32, preprocess=args.preprocess,
        decode=args.decode, name=args.name, per_cell=args.per_cell, strata=args.strata, count_bins=count_bins,
        seed=args.seed, allow_short=args.allow_short, skip_bad=args.skip_bad, methods=_csv(args.methods), out=args.out,
        percentile=args.percentile, entropy_bins=args.entropy_bins, per_channel=args.per_channel, types=types,
        weight_type=args.weight_type, reduce_range=args.reduce_range, exclude_nodes=_csv(args.exclude_nodes),
        exclude_op_types=_csv(args.exclude_op_types),
        session_requirements=session_config(args.session_requirements, "--require-session"),
        pre_process=args.pre_process, chunk_size=args.chunk_size,
        max_memory=args.max_memory, threads=args.threads, force=args.force)


def print_calset(calset) -> None:
    r = calset.recipe
    st = r["strata"]
    print(f"calibration set {calset.name}: {len(calset.selected)} images, seed {r['seed']}, pool {r['pool']} "
          f"(eval split excluded; {r['eval_images_checked']} eval images of these labels checked by SHA-256), "
          "luminance = mean Rec. 709 luma")
    if st["kind"] == "objects" and st["density"] == ["empty"]:   # a recogniser's word images, a classifier's photos
        print("strata by objects: none (no image has an object box: one stratum, balanced by lighting)")
    else:
        print(f"strata by {st['kind']}: {', '.join(st['density'])}"
              + (f" (none of: {', '.join(st['absent'])}: left out)" if st["absent"] else ""))
    rows = [(c["cell"], c["available"], c["selected"], c["shortfall"] or "",
             "-" if c["luma_min"] is None else f"{c['luma_min']:.1f}-{c['luma_max']:.1f}",
             "-" if c["pool_luma_min"] is None else f"{c['pool_luma_min']:.1f}-{c['pool_luma_max']:.1f}")
            for c in calset.cells]
    print(text_table(["cell", "candidates", "selected", "short", "luma selected", "luma pool"], rows, rule=True))
    for stratum, med in r["lighting_medians"].items():
        if med is not None:
            print(f"  median luma of {stratum}: {med:.1f} (dark < median <= bright)")
    if r["skipped_bad"]:
        print(f"  skipped {r['skipped_bad']} unreadable image(s) (recorded in the manifest)")
    print()


def result_json(res) -> dict:
    """The calibrate result as plain data (--json)."""
    r = res.calset.recipe if res.calset is not None else None
    return {
        "calibration_set": None if r is None else {
            "name": res.calset.name, "folder": str(res.calib_dir), "images": len(res.calset.selected),
            "seed": r["seed"], "strata": r["strata"], "cells": r["cells"], "manifest_sha256": r["manifest_sha256"]},
        "as_given": res.as_given,
        "variants": [{"name": x.variant.name, "file": str(x.variant.path), "method": x.variant.recipe["method"],
                      "options": _options(x.variant.recipe), "semantic_sha256": x.variant.recipe["semantic_sha256"],
                      "bytes": x.variant.path.stat().st_size, "seconds": round(x.seconds, 3),
                      "peak_mib": round(x.peak_mib, 1), "calib_images": x.calib_images} for x in res.reports],
        "failed": [{"name": n, "why": w} for n, w in res.failed], "notes": res.notes, "warnings": res.warnings,
        "calibration": {"methods": res.static_methods, "images": res.calib_images, "seconds": round(res.calib_seconds, 3),
                        "peak_mib": round(res.calib_peak_mib, 1), "plan": res.plan},
        "out": str(res.out), "state": res.state, "seconds": round(res.seconds, 3)}


def run_decode_only(args) -> int:
    """--decode-only: the decode block of existing variants changed (quantbench.quantize.redecode)."""
    import json

    res = decode_only(calibrate_options(args.model, OUTPUT.parse(args), **options_from_args(args)))
    if getattr(args, "json", False):
        print(json.dumps({"out": str(res.out), "state": res.state, "variants": res.variants,
                          "decode": {"before": res.before, "after": res.after}}, indent=2, sort_keys=True))
        return 0
    verb = {"unchanged": "unchanged (the same decode block was recorded)", "replaced": "recipes rewritten"}[res.state]
    print(f"decode {res.before} -> {res.after} in {len(res.variants)} variant(s) ({', '.join(res.variants)}): "
          f"nothing calibrated or quantized")
    print(f"variants:        {res.out}/ {verb}")
    return 0


def run(args) -> int:
    import json
    import sys

    if getattr(args, "decode_only", False):
        return run_decode_only(args)
    if getattr(args, "json", False):
        res = calibrate(args.model, OUTPUT.parse(args), **options_from_args(args)).result
        print(json.dumps(result_json(res), indent=2, sort_keys=True))
        for name, why in res.failed:
            print(f"quantbench calibrate: error: variant {name} not published: {why}", file=sys.stderr)
        return 1 if res.failed else 0
    res = calibrate(args.model, OUTPUT.parse(args), on_calset=print_calset, on_note=lambda text: print(f"note: {text}"),
                    **options_from_args(args)).result
    for w in res.warnings:
        print(f"warning: {w}")
    rows = []
    for r in res.reports:
        v = r.variant
        rows.append((v.name, v.recipe["method"] if v.recipe["method"] != "static" else v.recipe["calibration_method"],
                     _options(v.recipe), f"{v.path.stat().st_size / 1024:.0f} KiB",
                     "-" if r.calib_images is None else r.calib_images, f"{r.seconds:.1f} s", f"{r.peak_mib:.0f} MiB"))
    print(text_table(["variant", "method", "options", "size", "calib images", "time", "peak memory"], rows, rule=True))
    if res.static_methods:
        plan = res.plan
        how = (f"{plan['passes']} pass(es)" if plan.get("mode") != "chunked" else
               f"2 passes holding {plan['chunk']} image(s) at a time")
        per_img = plan.get("activation_bytes_per_image")
        budget = (f"; activations {per_img / 2**20:.1f} MiB per image, budget {plan['max_memory'] / 2**20:.0f} MiB"
                  if per_img else "")
        print(f"calibration ({', '.join(res.static_methods)}): {res.calib_images} images, {how}{budget}, "
              f"{res.calib_seconds:.1f} s, peak memory {res.calib_peak_mib:.0f} MiB")
    print()
    if res.calib_dir is not None:   # an already-quantized model has none
        print(f"calibration set: {res.calib_dir}/ (manifest.parquet, recipe.json)")
    verb = {"new": "written", "unchanged": "unchanged (identical files already there)",
            "replaced": "replaced (--force)"}[res.state]
    print(f"variants:        {res.out}/ ({len(res.reports)} models + recipes, index.json) {verb}")
    print(f"latest:          {res.latest} -> {res.out}")
    print(f"done in {res.seconds:.1f} s")
    sys.stdout.flush()
    for name, why in res.failed:
        print(f"quantbench calibrate: error: variant {name} not published: {why}", file=sys.stderr)
    return 1 if res.failed else 0
