"""`quantbench calibrate`: balanced calibration set -> fp32, dynamic and static-QDQ variants.

With no arguments: the bundled demo detector and corpus. Writes
calib_sets/<name>/ (manifest.parquet, recipe.json), results/variants/<model>/
(<variant>.onnx, <variant>.recipe.json, static: <variant>.ranges.json, then
index.json) and results/variants/latest.json. Each folder is written in a
temporary folder and moved into place, so a failure leaves nothing behind.
"""

from __future__ import annotations

import argparse

HELP = ("Build a calibration set balanced by object density x lighting and make fp32, dynamic and "
        "static QDQ int8 variants (MinMax, Percentile, Entropy) with memory-bounded, order-independent calibration.")

METHOD_CHOICES = ("dynamic", "minmax", "percentile", "entropy")


def _csv(s: str) -> list[str]:
    return [x.strip() for x in str(s or "").split(",") if x.strip()]


def add_arguments(parser) -> None:
    from quantbench.quantize.calibration import DEFAULT_PERCENTILE, ENTROPY_BINS

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
    g.add_argument("--methods", default=",".join(METHOD_CHOICES),
                   help=f"variants besides fp32, comma-separated from {', '.join(METHOD_CHOICES)}")
    g.add_argument("--out", default=None, help="variants folder; if omitted: results/variants/<model>")
    g.add_argument("--percentile", type=float, default=DEFAULT_PERCENTILE, help="Percentile calibration: percentile kept")
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


def _resolve_model(arg, demo_model):
    from pathlib import Path

    if arg and "/" not in arg and not arg.endswith(".onnx") and not Path(arg).exists():
        return demo_model(arg)  # a bundled model name
    return Path(arg)


def _display_model(path):
    import os

    from quantbench.assets import MODELS_DIR

    p = os.path.abspath(path)
    if os.path.dirname(p) == str(MODELS_DIR.resolve()):
        return f"bundled:models/{os.path.basename(p)}"
    return p


def _fmt_table(headers, rows) -> str:
    cols = list(zip(headers, *rows)) if rows else [(h,) for h in headers]
    widths = [max(len(str(x)) for x in col) for col in cols]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip()
    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    return "\n".join(out)


def _options(recipe: dict) -> str:
    m = recipe.get("method")
    if m == "fp32":
        return "as given"
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
    return " ".join(parts)


def run(args) -> int:
    import sys
    import time
    from pathlib import Path

    from onnx import helper

    from quantbench.assets import CALIB_SETS_DIR, VARIANTS_DIR, demo_model, load_sidecar
    from quantbench.calibset import builder
    from quantbench.errors import UserError
    from quantbench.modelio import graph_inputs, load_model, model_hashes
    from quantbench.preprocess import input_spec, load_rgb, to_tensor
    from quantbench.quantize import smoke
    from quantbench.quantize import variants as qv
    from quantbench.quantize.calibration import ImageInputs, compute_ranges, load_with_shape_infer
    from quantbench.quantize.memory import PeakMeter
    from quantbench.variants import load_sidecar_file, publish_folder, staging_folder, write_index, write_latest

    t_start = time.perf_counter()
    methods = _csv(args.methods)
    bad = [m for m in methods if m not in METHOD_CHOICES]
    if bad:
        raise UserError(f"--methods: unknown {bad}; choose from {', '.join(METHOD_CHOICES)}")
    static_methods = [m for m in ("minmax", "percentile", "entropy") if m in methods]
    types = qv.parse_types(args.types) if args.types else [(args.activation_type, args.weight_type)]
    for at, wt in types:
        qv.quant_type(at), qv.quant_type(wt)
    try:
        count_bins = [int(x) for x in _csv(args.count_bins)]
    except ValueError:
        raise UserError(f"--count-bins: {args.count_bins!r} is not a comma-separated list of integers") from None
    if args.chunk_size is not None and args.chunk_size < 1:
        raise UserError(f"--chunk-size: must be at least 1 (got {args.chunk_size})")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads: must be at least 1 (got {args.threads})")
    if args.max_memory is not None:
        from quantbench.quantize.calibration import parse_memory

        parse_memory(args.max_memory)  # a typo fails before any work
    if args.entropy_bins < 2:
        raise UserError(f"--entropy-bins: must be at least 2 (got {args.entropy_bins})")
    exclude_nodes, exclude_op_types = _csv(args.exclude_nodes), _csv(args.exclude_op_types)

    model_path = _resolve_model(args.model, demo_model)
    model = load_model(model_path)  # missing / not ONNX / fails onnx.checker -> UserError naming the file
    model_name = model_path.stem
    if not model_name or model_name.startswith(".") or model_name in ("variants", "tables", "releases"):
        raise UserError(f"{model_path}: model name {model_name!r} cannot name a variants folder; rename the file")
    sidecar = load_sidecar_file(args.sidecar) if args.sidecar else load_sidecar(model_path)
    ins = graph_inputs(model)
    if len(ins) != 1:
        raise UserError(f"{model_path}: has {len(ins)} inputs ({', '.join(ins)}); calibrate feeds one image tensor")
    (in_name, dims), = ins.items()
    spec = input_spec(sidecar, dims, in_name, source=str(args.sidecar or model_path))
    if spec.get("name") != in_name:
        raise UserError(f"{model_path}: input is named {in_name!r} but the sidecar's input block says "
                        f"{spec.get('name')!r}; fix the sidecar")
    np_type = helper.tensor_dtype_to_np_dtype(model.graph.input[[i.name for i in model.graph.input].index(in_name)]
                                              .type.tensor_type.elem_type)
    if str(np_type) != spec.get("dtype", "float32"):
        raise UserError(f"{model_path}: input {in_name!r} is {np_type}, the preprocessing makes {spec.get('dtype')}; "
                        "calibrate needs a float model")
    del model

    # 1. calibration set
    name = args.name or f"{model_name}-n{args.per_cell}-seed{args.seed}"
    if not name or "/" in name or name.startswith("."):
        raise UserError(f"--name: {name!r} is not a plain folder name")
    calset = builder.build(name, labels=args.labels, images=args.images, per_cell=args.per_cell, seed=args.seed,
                           count_bins=count_bins, allow_short=args.allow_short, skip_bad=args.skip_bad, spec=spec,
                           model=model_name, strata=args.strata, progress=True)
    rows = [(c["cell"], c["available"], c["selected"], c["shortfall"] or "",
             "-" if c["luma_min"] is None else f"{c['luma_min']:.1f}-{c['luma_max']:.1f}",
             "-" if c["pool_luma_min"] is None else f"{c['pool_luma_min']:.1f}-{c['pool_luma_max']:.1f}")
            for c in calset.cells]
    st = calset.recipe["strata"]
    print(f"calibration set {name}: {len(calset.selected)} images, seed {args.seed}, "
          f"pool {calset.recipe['pool']} (eval split excluded; {calset.recipe['eval_images_checked']} eval images "
          f"of these labels checked by SHA-256), luminance = mean Rec. 709 luma")
    print(f"strata by {st['kind']}: {', '.join(st['density'])}"
          + (f" (none of: {', '.join(st['absent'])}: left out)" if st["absent"] else ""))
    print(_fmt_table(["cell", "candidates", "selected", "short", "luma selected", "luma pool"], rows))
    for med_cls, med in calset.recipe["lighting_medians"].items():
        if med is not None:
            print(f"  median luma of {med_cls}: {med:.1f} (dark < median <= bright)")
    if calset.recipe["skipped_bad"]:
        print(f"  skipped {calset.recipe['skipped_bad']} unreadable image(s) (recorded in the manifest)")
    print()
    calib_dir = builder.write(calset, CALIB_SETS_DIR, force=args.force)
    manifest_sha = calset.recipe["manifest_sha256"]
    paths = [builder.resolve_images_root(calset.recipe["images_dir"]) / r["path"] for r in calset.selected]

    # 2. variants, in a staging folder published at the end
    out = Path(args.out) if args.out else VARIANTS_DIR / model_name
    source = {"path": _display_model(model_path), **model_hashes(model_path)}
    common = {"source_model": source, "seed": args.seed, "preprocess": spec, "sidecar": sidecar,
              "pre_process": bool(args.pre_process)}
    calib_info = {"name": name, "folder": str(CALIB_SETS_DIR / name), "manifest_sha256": manifest_sha,
                  "images": len(paths), "seed": args.seed}
    summary = []
    failed = []
    with staging_folder(out) as stage:
        prepared = stage / "prepared.onnx"  # kept: the float graph the ranges and variants belong to
        intake = qv.prepare_model(model_path, prepared, pre_process=args.pre_process, per_channel=args.per_channel)
        for note in intake["notes"]:
            print(f"note: {note}")
        common["intake"] = intake
        prep_model = load_with_shape_infer(prepared)
        names = {n.name for n in prep_model.graph.node}
        missing = [n for n in exclude_nodes if n not in names]
        if missing:
            hint = " after pre-processing (pass --no-pre-process to use the original graph)" if args.pre_process else ""
            raise UserError(f"--exclude-nodes: {model_path} has no node named {', '.join(map(repr, missing))}{hint}")

        # the smoke image: the first calibration image, as every variant will be fed
        feeds = {spec["name"]: to_tensor(load_rgb(paths[0]), spec)}
        variants = []

        def publish(v, secs, mib, n_img, ref):
            why = smoke.check(v.path, feeds, ref)
            if why is not None:
                failed.append((v.name, why))
                return
            variants.append(v)
            summary.append((v, secs, mib, n_img))

        with PeakMeter() as mem:
            t = time.perf_counter()
            v = qv.make_fp32(model_path, stage / "fp32.onnx", model_name=model_name, recipe_extra=common)
        try:
            ref = smoke.reference(v.path, feeds)
        except Exception as exc:  # onnxruntime's own exception types
            raise UserError(f"{model_path}: the fp32 model does not run on calibration image {paths[0]} "
                            f"({smoke.first_line(exc)}); check the sidecar's input block") from None
        publish(v, time.perf_counter() - t, mem.mib, "-", ref)
        if "dynamic" in methods:
            with PeakMeter() as mem:
                t = time.perf_counter()
                v = qv.make_dynamic(prepared, stage / "dynamic.onnx", weight_type=args.weight_type,
                                    per_channel=args.per_channel, reduce_range=args.reduce_range,
                                    exclude_nodes=exclude_nodes, exclude_op_types=exclude_op_types,
                                    model_name=model_name, recipe_extra=common)
            publish(v, time.perf_counter() - t, mem.mib, "-", ref)

        calib_time = calib_mem = 0.0
        if static_methods:
            op_types = qv.static_op_types(exclude_op_types)
            hist_opts = {"entropy_bins": args.entropy_bins} if "entropy" in static_methods else {}
            plan: dict = {}
            with PeakMeter() as mem:
                t = time.perf_counter()
                ranges = compute_ranges(prepared, ImageInputs(paths, spec), static_methods,
                                        percentile=args.percentile, op_types=op_types, chunk_size=args.chunk_size,
                                        max_memory=args.max_memory, threads=args.threads, plan=plan,
                                        progress=True, model=prep_model, **hist_opts)
            calib_time, calib_mem = time.perf_counter() - t, mem.mib
            for at, wt in types:
                suffix = "" if (at, wt) == ("u8", "s8") else f"-{at}{wt}"
                for m in static_methods:
                    vname = f"static-{m}{suffix}"
                    copts = {"entropy_bins": args.entropy_bins} if m == "entropy" else {}
                    with PeakMeter() as mem:
                        t = time.perf_counter()
                        v = qv.make_static(prepared, stage / f"{vname}.onnx", ranges=ranges[m], method=m,
                                           percentile=args.percentile, activation_type=at, weight_type=wt,
                                           per_channel=args.per_channel, reduce_range=args.reduce_range,
                                           exclude_nodes=exclude_nodes, exclude_op_types=exclude_op_types,
                                           calibration_options=copts, name=vname, model_name=model_name,
                                           model=prep_model,
                                           recipe_extra={**common, "calibration_set": calib_info})
                    publish(v, time.perf_counter() - t, mem.mib, str(len(paths)), ref)
        for v in variants:
            if v.name != "fp32" and v.path.stat().st_size > variants[0].path.stat().st_size:
                print(f"warning: {v.name} ({v.path.stat().st_size / 1024:.0f} KiB) is larger than fp32 "
                      f"({variants[0].path.stat().st_size / 1024:.0f} KiB): weights were probably quantized as "
                      "activations; see the notes above")
        for name_, _ in failed:  # a variant that failed is not published: remove its files from the stage
            for f in stage.glob(f"{name_}.*"):
                f.unlink()
        write_index(stage, variants)
        state = publish_folder(stage, out, force=args.force, what="variants")
    write_latest(out, model_name)

    rows = []
    for v, secs, mib, n_img in summary:
        size = (out / v.path.name).stat().st_size
        rows.append((v.name, v.recipe["method"] if v.recipe["method"] != "static" else v.recipe["calibration_method"],
                     _options(v.recipe), f"{size / 1024:.0f} KiB", n_img, f"{secs:.1f} s", f"{mib:.0f} MiB"))
    print(_fmt_table(["variant", "method", "options", "size", "calib images", "time", "peak memory"], rows))
    if static_methods:
        how = (f"{plan['passes']} pass(es)" if plan.get("mode") != "chunked" else
               f"2 passes holding {plan['chunk']} image(s) at a time")
        per_img = plan.get("activation_bytes_per_image")
        budget = (f"; activations {per_img / 2**20:.1f} MiB per image, budget {plan['max_memory'] / 2**20:.0f} MiB"
                  if per_img else "")
        print(f"calibration ({', '.join(static_methods)}): {len(paths)} images, {how}{budget}, "
              f"{calib_time:.1f} s, peak memory {calib_mem:.0f} MiB")
    print()
    print(f"calibration set: {calib_dir}/ (manifest.parquet, recipe.json)")
    verb = {"new": "written", "unchanged": "unchanged (identical files already there)", "replaced": "replaced (--force)"}[state]
    print(f"variants:        {out}/ ({len(summary)} models + recipes, index.json) {verb}")
    print(f"latest:          {VARIANTS_DIR / 'latest.json'} -> {out}")
    print(f"done in {time.perf_counter() - t_start:.1f} s")
    sys.stdout.flush()
    if failed:
        for vname, why in failed:
            print(f"quantbench calibrate: error: variant {vname} not published: {why}", file=sys.stderr)
        return 1
    return 0
