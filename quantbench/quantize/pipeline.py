"""calibrate(options) -> result: calibration set, model intake, variants, smoke tests, publication.

The library half of `quantbench calibrate` (the command maps flags to
CalibrateOptions and prints the result). Writes calib_sets/<name>/ and the
variants folder, each built in a temporary folder and moved into place, so a
failure leaves nothing behind; a variant that fails its smoke test is not
published and is listed in `CalibrateResult.failed`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from quantbench.inputs import sidecarfile
from quantbench.analysis.decode import check_outputs, is_plugin, spec_from_sidecar
from quantbench.inputs.assets import CALIB_SETS_DIR, MODELS_DIR, demo_model
from quantbench.store.resultpaths import VARIANTS_DIR
from quantbench.calibset import builder
from quantbench.errors import ParameterError, UserError, flag_mark
from quantbench.inputs.fixtures import BUNDLED_LABELS
from quantbench.fsutil import check_writable_for, sha256_file
from quantbench.inputs.modelio import (check_tensor_outputs, graph_inputs, load_model, model_hashes, overridden_dims,
                                       quantized_ops, with_input_shape)
from quantbench.inputs.preprocess import load_rgb, to_tensor
from quantbench.inputs.sidecarfile import REQUIREMENTS, check_requirements
from quantbench.quantize import smoke
from quantbench.quantize import variants
from quantbench.quantize import methods as calibration_methods
from quantbench.quantize.calibration import ImageInputs, compute_ranges, check_limits
from quantbench.quantize.methods import DEFAULT_PERCENTILE, ENTROPY_BINS
from quantbench.quantize.ort_api import load_with_shape_infer
from quantbench.quantize.intake import check_finite_weights, check_loops, prepare
from quantbench.quantize.memory import PeakMeter
from quantbench.quantize.redecode import DecodeChange, only_decode_differs, set_decode
from quantbench.inputs.variantdir import (check_plain_name, check_replaceable, check_variants_place, publish_folder,
                                          staging_folder, write_index, write_latest)


@dataclass
class CalibrateOptions:
    """Every choice of a calibrate run; defaults are the demo's."""

    model: str | os.PathLike = "litter-detr-tiny"
    labels: str | os.PathLike | None = None
    images: str | os.PathLike | None = None
    sidecar: str | os.PathLike | None = None       # a sidecar file instead of the one beside the model
    fp32: str | os.PathLike | None = None          # an already-quantized model's float original (published as fp32)
    preprocess: str | None = None                  # module:function plug-in
    decode: str | None = None                      # the model's decoder, instead of the sidecar's decode kind
    name: str | None = None                        # calibration set name
    per_cell: int = 12
    strata: str = "auto"
    count_bins: Sequence[int] = ()
    seed: int = 0
    allow_short: bool = False
    skip_bad: bool = False
    methods: Sequence[str] = calibration_methods.DEFAULT_METHODS
    out: str | os.PathLike | None = None           # variants folder
    percentile: float | None = None
    entropy_bins: int | None = None
    per_channel: bool = True
    types: Sequence[tuple[str, str]] = (("u8", "s8"),)   # static (activation, weight) pairs
    weight_type: str = "s8"                        # dynamic
    reduce_range: bool = False
    exclude_nodes: Sequence[str] = ()
    exclude_op_types: Sequence[str] = ()
    #: session config entries every host must set to get the quantized variants' results (their recipes'
    #: session_requirements; every run of them applies it); {}: none
    session_requirements: Mapping[str, str] = field(default_factory=dict)
    pre_process: bool = True
    chunk_size: int | None = None                  # None: derived from max_memory per model
    max_memory: int | str | None = None            # activation budget (bytes or '2GiB'); None: a share of RAM
    threads: int | None = None                     # histogram binning threads; None: the usable cores
    force: bool = False
    progress: bool = True
    calib_sets_dir: str | os.PathLike | None = None
    variants_dir: str | os.PathLike | None = None


@dataclass
class VariantReport:
    """One published variant and what making it cost."""

    variant: object            # quantbench.inputs.variantdir.Variant (its path is inside the published folder)
    seconds: float
    peak_mib: float
    calib_images: int | None   # static variants: the images calibrated on


@dataclass
class CalibrateResult:
    calset: builder.CalibSet | None   # None: the model was taken as given, nothing calibrated
    calib_dir: Path | None
    out: Path
    state: str                 # publish_folder's "new" | "unchanged" | "replaced"
    latest: Path
    reports: list = field(default_factory=list)
    failed: list = field(default_factory=list)      # (variant name, why) not published
    notes: list = field(default_factory=list)       # intake notes
    warnings: list = field(default_factory=list)
    static_methods: list = field(default_factory=list)
    calib_images: int = 0
    calib_seconds: float = 0.0
    calib_peak_mib: float = 0.0
    plan: dict = field(default_factory=dict)        # how calibration held activations (compute_ranges' plan)
    seconds: float = 0.0
    as_given: dict | None = None                    # an already-quantized model: {op type: count}, nothing re-quantized


def _check(opts: CalibrateOptions) -> tuple[list[str], list[str]]:
    """Validate the parameters once; returns (methods, static methods)."""
    methods = list(dict.fromkeys(opts.methods))
    bad = [m for m in methods if m not in calibration_methods.VARIANT_METHODS]
    if bad:
        raise ParameterError("methods", f"unknown {bad}; choose from {', '.join(calibration_methods.VARIANT_METHODS)}")
    for at, wt in opts.types:
        variants.quant_type(at), variants.quant_type(wt)
    variants.quant_type(opts.weight_type)
    check_limits(opts.chunk_size, opts.threads, opts.max_memory)  # a typo fails before any work
    if opts.entropy_bins is not None and opts.entropy_bins < 2:
        raise ParameterError("entropy_bins", f"must be at least 2 (got {opts.entropy_bins})")
    required(opts)
    return methods, [m for m in calibration_methods.STATIC if m in methods]


def required(opts: CalibrateOptions) -> dict:
    """The recipe entries the quantized variants get from `opts.session_requirements` (checked: known keys)."""
    if not opts.session_requirements:
        return {}
    return {REQUIREMENTS: check_requirements(dict(opts.session_requirements), flag_mark("session_requirements"))}


def resolve_model(model) -> Path:
    """A bundled model name (litter-detr-tiny, litter-cnn) or a path."""
    text = str(model)
    if text and "/" not in text and not text.endswith(".onnx") and not Path(text).exists():
        return demo_model(text)
    return Path(text)


def decode_only(opts: CalibrateOptions) -> DecodeChange:
    """The decode block of the existing variants of `opts.model` changed (quantize.redecode.set_decode): the
    sidecar (`opts.sidecar`, else beside the model) with `opts.decode`, into `opts.out` or the variants folder."""
    return set_decode(resolve_model(opts.model), sidecar_file=opts.sidecar, decode=opts.decode, out=opts.out,
                      variants_dir=opts.variants_dir)


def _display_model(path: Path) -> str:
    p = os.path.abspath(path)
    if os.path.dirname(p) == str(MODELS_DIR.resolve()):
        return f"bundled:models/{os.path.basename(p)}"
    return p


def input_recipe(model_path: Path, opts: CalibrateOptions) -> tuple[dict, dict | None, dict]:
    """(preprocess spec, sidecar, {"preprocess_plugin"/"decode_plugin": identity} of the plug-ins it runs) the model
    is calibrated with (quantbench.inputs.sidecarfile: the sidecar read once, the spec derived and checked once); checked
    against the model's input and outputs. A plug-in only the sidecar names runs only if allowed
    (quantbench.inputs.plugins.require); the recipe records the ones that ran, so later commands run them unasked."""
    from onnx import helper

    model = load_model(model_path)  # missing / not ONNX / fails onnx.checker -> UserError naming the file
    check_tensor_outputs(model, model_path)  # before anything is written: a ZipMap output has no tensor bytes
    check_finite_weights(model, model_path)  # and a NaN weight has no scale
    check_loops(model, model_path)  # and a Loop of 1e15 fixed iterations never ends
    sidecar, side_where = sidecarfile.calibration_sidecar(model_path, opts.sidecar, opts.decode)
    ins = graph_inputs(model)
    if len(ins) != 1:
        raise UserError(f"{model_path}: has {len(ins)} inputs ({', '.join(ins)}); calibrate feeds one image tensor")
    (in_name, dims), = ins.items()
    spec = sidecarfile.derive_spec(sidecar, dims, in_name, str(opts.sidecar or model_path), f"{side_where}: input 'plugin'",
                              side_where if sidecar else model_path, plugin=opts.preprocess, override=True)
    records = sidecarfile.plugin_records(spec)
    if spec.get("name") != in_name:
        raise UserError(f"{model_path}: input is named {in_name!r} but the sidecar's input block says "
                        f"{spec.get('name')!r}; fix the sidecar")
    if overridden_dims(dims, spec["shape"]):
        records["input_shape_override"] = shape_override(model_path, model, spec, side_where)
    if sidecar and sidecar.get("decode"):  # a decode block that cannot decode this model fails now, not after runs
        decoder = check_outputs(spec_from_sidecar(sidecar, source=side_where), [o.name for o in model.graph.output])
        if is_plugin(decoder.kind):
            records.update(sidecarfile.plugin_records(decode_plugin=decoder.kind))
    elem = next(i for i in model.graph.input if i.name == in_name).type.tensor_type.elem_type
    np_type = helper.tensor_dtype_to_np_dtype(elem)
    if str(np_type) != spec.get("dtype", "float32"):
        raise UserError(f"{model_path}: input {in_name!r} is {np_type}, the preprocessing makes {spec.get('dtype')}; "
                        f"set \"dtype\": \"{np_type}\" in the sidecar's input block")
    return spec, sidecar, records


def shape_override(model_path: Path, model, spec: dict, side_where) -> dict:
    """The sidecar's 'shape' over the declared input dims of a static-batch export (modelio.with_input_shape's record,
    kept in every variant's recipe), checked before any work: the graph must load and run at that shape."""
    import onnx
    import numpy as np

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    record = with_input_shape(copy, spec["name"], spec["shape"])
    why = smoke.runs(copy.SerializeToString(), {spec["name"]: np.zeros(spec["shape"], np.dtype(spec["dtype"]))})
    if why is not None:
        raise UserError(f"{model_path}: declares input {spec['name']!r} as {record['declared']}; at the sidecar's input "
                        f"'shape' {spec['shape']} ({side_where}) onnxruntime cannot run it ({why}): set 'shape' to "
                        "dims the graph runs at (a graph with a batch fixed inside, e.g. in a Reshape, runs only at "
                        "its declared batch)")
    return record


def shape_override_note(record: dict) -> str:
    """The line calibrate prints about a sidecar shape overriding declared dims."""
    outs = ", ".join(f"{k} {v['declared']} -> {v['used']}" for k, v in record["outputs"].items())
    return (f"input {record['input']!r} declared {record['declared']}, run as {record['used']} (the sidecar's input "
            f"'shape', in every variant and on every host); outputs {outs}")


def eval_labels(calset_recipe: dict) -> dict:
    """The labels a variant was calibrated with, as its recipe records them: later commands evaluate it on
    their eval split (quantbench.inputs.fixtures.calibration_labels) and check the file is unchanged."""
    path = calset_recipe["labels"]
    return {"path": path if path.startswith("bundled:") else os.path.abspath(path),
            "sha256": calset_recipe["labels_sha256"], "images": calset_recipe["images_dir"]}


#: said before calibrating when Entropy runs at onnxruntime's default bins (docs/calibrate.md, "Note on Entropy")
ENTROPY_DEFAULT_NOTE = (f"static-entropy at {ENTROPY_BINS} histogram bins (onnxruntime's default) has a single KL "
                        "candidate, so it gives MinMax's range: it is a byte-duplicate of static-minmax, at the "
                        "cost of its histograms (why it is not a default method); 256 entropy bins or more let it "
                        "clip outliers, or leave entropy out of the methods")


def _refuse_decode_only_change(opts: CalibrateOptions, out: Path, model_path: Path, spec: dict, sidecar) -> None:
    """Before any work: variants of this model and preprocessing that differ only in their decode block would be
    made again byte for byte, then refused at publication; say how to change the block without re-quantizing."""
    if opts.force:
        return
    differs = only_decode_differs(out, model_path, spec, sidecar)
    if differs:
        raise UserError(f"{out}: holds the variants this run would make, recorded with another decode block "
                        f"({differs}); their bytes do not depend on it: pass {flag_mark('decode_only')} to record the new "
                        f"block without calibrating or quantizing again, or {flag_mark('force')} to calibrate again")


@contextlib.contextmanager
def removed_on_failure(dests: list):
    """What a failed run made is removed: each of `dests` it created (a calibration set written before the variants
    failed) and the folders made to hold them (calib_sets/, results/variants/), when they are left empty."""
    made = [p for d in dests for p in [Path(d), *Path(d).parents] if not p.exists()]
    try:
        yield
    except BaseException:
        for p in sorted(set(made), key=lambda q: len(q.parts), reverse=True):  # the deepest first
            if p in {Path(d) for d in dests}:
                shutil.rmtree(p, ignore_errors=True)
            elif p.is_dir() and not any(p.iterdir()):
                p.rmdir()
        raise


def calibrate(opts: CalibrateOptions, on_calset: Callable | None = None, on_note: Callable | None = None) -> CalibrateResult:
    """The whole calibrate pipeline; `on_calset(calset)` and `on_note(text)` report progress as it happens."""
    t_start = time.perf_counter()
    methods, static_methods = _check(opts)
    percentile = DEFAULT_PERCENTILE if opts.percentile is None else opts.percentile
    entropy_bins = ENTROPY_BINS if opts.entropy_bins is None else opts.entropy_bins
    model_path = resolve_model(opts.model)
    spec, sidecar, records = input_recipe(model_path, opts)
    model_name = model_path.stem
    calib_root = Path(opts.calib_sets_dir or CALIB_SETS_DIR)
    variants_root = Path(opts.variants_dir or VARIANTS_DIR)
    found = quantized_ops(load_model(model_path, check=False))
    if found:   # already quantized: published as given, nothing re-quantized, no calibration set
        return calibrate_as_given(opts, model_path, spec, sidecar, records, found, variants_root, t_start, on_note)
    if opts.fp32:
        raise ParameterError("fp32", f"{model_path} is a float model, itself the fp32 variant; a float original is "
                                     "named only for an already-quantized model", str(opts.fp32))

    # neither output folder may be one quantbench must not replace (e.g. results/)
    check_plain_name(model_name, f"{flag_mark('model')} {opts.model}: model name")
    name = check_plain_name(opts.name or f"{model_name}-n{opts.per_cell}-seed{opts.seed}", f"{flag_mark('name')}:")
    out = Path(opts.out) if opts.out else variants_root / model_name
    check_variants_place(out, variants_root.parent)
    check_replaceable(calib_root / name, "calibration set")
    check_replaceable(out, "variants")
    for dest in (calib_root / name, out):   # a read-only folder: one line before anything is written
        check_writable_for(dest, f"nothing was written (calibrate writes {dest})")
    _refuse_decode_only_change(opts, out, model_path, spec, sidecar)
    # before the work it costs
    if calibration_methods.wanted(static_methods, "entropy_bins") and entropy_bins == ENTROPY_BINS and on_note:
        on_note(ENTROPY_DEFAULT_NOTE)
    with removed_on_failure([calib_root / name, out]):  # a failure leaves nothing: no calibration set either
        # 1. calibration set
        calset = builder.build(name, labels=opts.labels, images=opts.images, per_cell=opts.per_cell, seed=opts.seed,
                               count_bins=sorted(opts.count_bins), allow_short=opts.allow_short, skip_bad=opts.skip_bad,
                               spec=spec, model=model_name, strata=opts.strata, progress=opts.progress)
        if on_calset:
            on_calset(calset)
        calib_dir = builder.write(calset, calib_root, force=opts.force)
        paths = [builder.resolve_images_root(calset.recipe["images_dir"]) / r["path"] for r in calset.selected]

        # 2. variants
        common = {"source_model": {"path": _display_model(model_path), **model_hashes(model_path)}, "seed": opts.seed,
                  "preprocess": spec, "sidecar": sidecar, "pre_process": bool(opts.pre_process),
                  "eval_labels": eval_labels(calset.recipe), **records}
        calib_info = {"name": name, "folder": str(calib_root / name), "manifest_sha256": calset.recipe["manifest_sha256"],
                      "images": len(paths), "seed": opts.seed}
        result = CalibrateResult(calset=calset, calib_dir=calib_dir, out=out, state="", latest=variants_root / "latest.json",
                                 static_methods=static_methods, calib_images=len(paths))
        made = _VariantMaker(model_path, model_name, spec, paths, opts, common, calib_info, percentile, entropy_bins,
                             methods, static_methods, result, on_note)
        result.state = made.publish(out)
        write_latest(out, model_name, results_dir=variants_root.parent)
        result.seconds = time.perf_counter() - t_start
        return result


class _VariantMaker:
    """Makes, smoke-tests and publishes the variants of one calibrate run (in a staging folder)."""

    def __init__(self, model_path, model_name, spec, paths, opts, common, calib_info, percentile, entropy_bins,
                 methods, static_methods, result, on_note):
        self.model_path, self.model_name, self.spec, self.paths = model_path, model_name, spec, paths
        self.opts, self.common, self.calib_info = opts, common, calib_info
        self.percentile, self.entropy_bins = percentile, entropy_bins
        self.methods, self.static_methods, self.result = methods, static_methods, result
        self.on_note = on_note or (lambda text: None)
        self.published: list = []

    def publish(self, out: Path) -> str:
        with staging_folder(out) as stage:
            self.make_all(stage)
            for name, _ in self.result.failed:  # not published: its files leave the stage
                for f in stage.glob(f"{name}.*"):
                    f.unlink()
            write_index(stage, self.published)
            state = publish_folder(stage, out, force=self.opts.force, what="variants")
        for r in self.result.reports:  # the published copies
            r.variant.path = out / Path(r.variant.path).name
        return state

    def _timed(self, make, calib_images=None):
        with PeakMeter() as mem:
            t = time.perf_counter()
            v = make()
        return v, time.perf_counter() - t, mem.mib, calib_images

    def _accept(self, made, ref) -> None:
        v, secs, mib, n_img = made
        why = smoke.check(v.path, self.feeds, ref)
        if why is not None:
            self.result.failed.append((v.name, why))
            return
        self.published.append(v)
        self.result.reports.append(VariantReport(v, secs, mib, n_img))

    def make_all(self, stage: Path) -> None:
        o = self.opts
        prepared = stage / "prepared.onnx"  # kept: the float graph the ranges and variants belong to
        override = self.common.get("input_shape_override")
        intake = prepare(self.model_path, prepared, pre_process=o.pre_process, per_channel=o.per_channel,
                         shape_override=override)
        for note in ([shape_override_note(override)] if override else []) + intake["notes"]:
            self.result.notes.append(note)
            self.on_note(note)
        self.common["intake"] = intake
        prep_model = load_with_shape_infer(prepared, workdir=stage)
        missing = [n for n in o.exclude_nodes if n not in {x.name for x in prep_model.graph.node}]
        if missing:
            hint = f" after pre-processing (pass {flag_mark('pre_process')} to use the original graph)" if o.pre_process else ""
            raise ParameterError("exclude_nodes", f"{self.model_path} has no node named "
                                                  f"{', '.join(map(repr, missing))}{hint}")
        # the smoke image: the first calibration image, as every variant will be fed
        self.feeds = {self.spec["name"]: to_tensor(load_rgb(self.paths[0]), self.spec)}

        fp32 = self._timed(lambda: variants.make_fp32(self.model_path, stage / "fp32.onnx", model_name=self.model_name,
                                                recipe_extra=self.common, shape_override=override))
        try:
            ref = smoke.reference(fp32[0].path, self.feeds)
        except Exception as exc:  # onnxruntime's own exception types
            raise UserError(f"{self.model_path}: the fp32 model does not run on calibration image {self.paths[0]} "
                            f"({smoke.first_line(exc)}); check the sidecar's input block") from None
        self._accept(fp32, ref)
        if calibration_methods.DYNAMIC in self.methods:
            self._accept(self._timed(lambda: variants.make_dynamic(
                prepared, stage / "dynamic.onnx", weight_type=o.weight_type, per_channel=o.per_channel,
                reduce_range=o.reduce_range, exclude_nodes=o.exclude_nodes, exclude_op_types=o.exclude_op_types,
                model_name=self.model_name, recipe_extra={**self.common, **required(o)})), ref)
        if self.static_methods:
            ranges = self._calibrate(prepared, prep_model)
            for at, wt in o.types:
                for m in self.static_methods:
                    self._accept(self._timed(lambda: self._static(stage, prepared, prep_model, ranges, m, at, wt),
                                             len(self.paths)), ref)
        sizes = {v.name: v.path.stat().st_size for v in self.published}
        for v in self.published:
            if v.name != "fp32" and "fp32" in sizes and sizes[v.name] > sizes["fp32"]:
                self.result.warnings.append(
                    f"{v.name} ({sizes[v.name] / 1024:.0f} KiB) is larger than fp32 ({sizes['fp32'] / 1024:.0f} KiB): "
                    "weights were probably quantized as activations; see the notes above")

    def _calibrate(self, prepared, prep_model):
        o = self.opts
        wants_bins = calibration_methods.wanted(self.static_methods, "entropy_bins")
        hist = {"entropy_bins": self.entropy_bins} if wants_bins else {}
        with PeakMeter() as mem:
            t = time.perf_counter()
            ranges = compute_ranges(prepared, ImageInputs(self.paths, self.spec), self.static_methods,
                                    percentile=self.percentile, op_types=variants.static_op_types(o.exclude_op_types),
                                    chunk_size=o.chunk_size, max_memory=o.max_memory, threads=o.threads,
                                    plan=self.result.plan, progress=o.progress, model=prep_model, **hist)
        self.result.calib_seconds, self.result.calib_peak_mib = time.perf_counter() - t, mem.mib
        return ranges

    def _static(self, stage, prepared, prep_model, ranges, method, at, wt):
        o = self.opts
        vname = f"static-{method}" + ("" if (at, wt) == ("u8", "s8") else f"-{at}{wt}")
        copts = {"entropy_bins": self.entropy_bins} if calibration_methods.takes(method, "entropy_bins") else {}
        return variants.make_static(prepared, stage / f"{vname}.onnx", ranges=ranges[method], method=method,
                              percentile=self.percentile, activation_type=at, weight_type=wt,
                              per_channel=o.per_channel, reduce_range=o.reduce_range, exclude_nodes=o.exclude_nodes,
                              exclude_op_types=o.exclude_op_types, calibration_options=copts, name=vname,
                              model_name=self.model_name, model=prep_model,
                              recipe_extra={**self.common, "calibration_set": self.calib_info, **required(o)})


def as_given_note(found: dict) -> str:
    """The one line calibrate says about an already-quantized model."""
    ops = ", ".join(f"{n} x{k}" for n, k in found.items())
    return (f"the model is already quantized ({ops}): nothing is re-quantized; it is published as the variant "
            f"{variants.AS_GIVEN!r}")


def calibrate_as_given(opts: CalibrateOptions, model_path: Path, spec: dict, sidecar, records: dict, found: dict,
                       variants_root: Path, t_start: float, on_note: Callable | None) -> CalibrateResult:
    """An already-quantized model: a variants folder holding it as `as-given` (and its float original as fp32 when
    `opts.fp32` names one), each smoke-tested on the first labelled image; no calibration set is written."""
    model_name = check_plain_name(model_path.stem, f"{flag_mark('model')} {opts.model}: model name")
    fp32_path = Path(opts.fp32) if opts.fp32 else None
    if fp32_path is not None:
        fp32_model = load_model(fp32_path)   # missing / not ONNX -> UserError naming the file
        if quantized_ops(fp32_model):
            raise ParameterError("fp32", f"{fp32_path} is itself quantized ({', '.join(quantized_ops(fp32_model))}); "
                                         "name the float model", str(fp32_path))
    out = Path(opts.out) if opts.out else variants_root / model_name
    check_variants_place(out, variants_root.parent)
    check_replaceable(out, "variants")
    check_writable_for(out, f"nothing was written (calibrate writes {out})")
    cands, labels_path, images_dir = builder.read_labels(opts.labels, opts.images)
    labels = {"labels": str(labels_path) if opts.labels else BUNDLED_LABELS, "labels_sha256": sha256_file(labels_path),
              "images_dir": builder.images_root_token(images_dir)}
    common = {"source_model": {"path": _display_model(model_path), **model_hashes(model_path)}, "preprocess": spec,
              "sidecar": sidecar, "eval_labels": eval_labels(labels), **records}
    note = as_given_note(found)
    result = CalibrateResult(calset=None, calib_dir=None, out=out, state="", latest=variants_root / "latest.json",
                             notes=[note], as_given=found)
    if on_note:
        on_note(note)
    feeds = {spec["name"]: to_tensor(load_rgb(cands[0].path), spec)}
    with staging_folder(out) as stage:
        override = records.get("input_shape_override")
        made = [variants.make_as_given(model_path, stage / f"{variants.AS_GIVEN}.onnx", found, model_name=model_name,
                                 recipe_extra={**common, **required(opts)}, shape_override=override)]
        if fp32_path is not None:
            made.insert(0, variants.make_fp32(fp32_path, stage / "fp32.onnx", model_name=model_name, recipe_extra=common,
                                        shape_override=override))
        try:
            ref = smoke.reference(made[0].path, feeds)
        except Exception as exc:  # onnxruntime's own exception types
            raise UserError(f"{made[0].path.name}: does not run on image {cands[0].path} "
                            f"({smoke.first_line(exc)}); check the sidecar's input block") from None
        for v in made[1:]:
            why = smoke.check(v.path, feeds, ref)
            if why is not None:
                raise UserError(f"{fp32_path} and {model_path} do not make the same outputs: {v.name} {why}")
        write_index(stage, made)
        result.state = publish_folder(stage, out, force=opts.force, what="variants")
    for v in made:
        v.path = out / Path(v.path).name
        result.reports.append(VariantReport(v, 0.0, 0.0, None))
    write_latest(out, model_name, results_dir=variants_root.parent)
    result.seconds = time.perf_counter() - t_start
    return result
