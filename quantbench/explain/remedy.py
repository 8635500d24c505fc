"""Remedy matrix: which known remedy brings every host into one equivalence class, at what decision cost.

For a static QDQ variant whose hosts split, each remedy is tried on the same hosts
and fixtures:

* baseline           - the variant as shipped;
* x64quantprecision  - the same model, session config ``session.x64quantprecision=1``
                       (onnxruntime avoids the saturating U8S8 path on x86);
* reduce_range       - re-quantized with 7-bit weights (``reduce_range=True``);
* s8s8               - re-quantized with int8 activations and weights;
* u8u8               - re-quantized with uint8 activations and weights, where the
                       quantizer supports it (otherwise the row says why not);
* disable_kleidiai   - the same model, session config ``mlas.disable_kleidiai=1``: on an
                       SME host (phone-sme2, docker-arm64) MLAS's own kernels instead of
                       KleidiAI's SME SGEMM, convolution and dynamic-quantization MatMul;
                       tried where the fleet has an SME host (a row says so otherwise).

Re-quantized remedies use the variant's own calibration ranges (its
``<stem>.ranges.json``) on the same prepared float model (``prepared.onnx``
beside the variants when calibrate kept it, else prepared again from the fp32
model), so only the remedy changes; without a ranges file they are calibrated on the given feeds. A remedy's
decision cost is the decision flips against fp32 on the same host, summed over
hosts (and the worst host). The first row's note names each host's U8S8 path, read from
its worker's fingerprint (explain/lint.fleet_note): which hosts take the saturating
VPMADDUBSW path, which accumulate exactly, and which the shipped variant's layers affect.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from quantbench.analysis.classes import equivalence_classes
from quantbench.analysis.decisions import compare
from quantbench.errors import ParameterError, UserError
from quantbench.explain.lint import fleet_note, fleet_paths, lint_model
from quantbench.explain.localize import decode_runs
from quantbench.fsutil import canonical_json, check_writable_for, content_key
from quantbench.hosts.keys import session_options
from quantbench.hosts.startup import parallel, start_workers
from quantbench.hosts.workerclient import JobFailed
from quantbench.inputs.modelio import load_model, semantic_sha256
from quantbench.quantize import intake
from quantbench.quantize import variants
from quantbench.inputs.sidecarfile import REQUIREMENTS
from quantbench.inputs.variantdir import variants_folder_of
from quantbench.quantize.calibration import compute_ranges, load_ranges
from quantbench.quantize.ort_api import load_with_shape_infer, method_name
from quantbench.textfmt import text_table

REMEDIES = ("baseline", "x64quantprecision", "reduce_range", "s8s8", "u8u8", "disable_kleidiai")
#: the remedies that run the variant's own file (its id is the base variant's)
SAME_MODEL = ("baseline", "x64quantprecision", "disable_kleidiai")
X64_ENTRY = "session.x64quantprecision"
KLEIDIAI_ENTRY = "mlas.disable_kleidiai"
#: the remedies that only change something on hosts with this ISA flag (the row says so when no host has it)
ONLY_ON = {"disable_kleidiai": "sme"}


@dataclass
class RemedyVariant:
    remedy: str
    path: Path | None
    config_entries: dict = field(default_factory=dict)
    note: str = ""


@dataclass
class RemedyRow:
    remedy_id: str
    base_variant_id: str
    remedy: str
    variant_id: str
    session_options: str
    hosts: list
    supported: bool
    classes: int | None
    one_class: bool | None
    class_map: str
    flips_total: int | None
    flips_max: int | None
    fixtures: int
    note: str = ""

    def row(self) -> dict:
        return asdict(self)


def check_remedies(remedies, out_dir) -> None:
    """The remedies to try (known, at least one: none printed an empty table and 'none' closes the gap) and the
    folder their variants go to: not inside a variants folder (files its index does not list), one that takes
    files (a read-only results folder was a traceback); before anything is built or run."""
    if not list(remedies):
        raise ParameterError("remedies", f"name at least one remedy of {', '.join(REMEDIES)}")
    bad = [r for r in remedies if r not in REMEDIES]
    if bad:
        raise ParameterError("remedies", f"unknown remedy {', '.join(bad)}; choose from {', '.join(REMEDIES)}")
    inside = variants_folder_of(out_dir)
    if inside is not None:
        raise ParameterError("out", f"is inside the variants folder {inside} (calibrate's: its index lists no "
                                    "other file); write remedy variants elsewhere (e.g. results/remedies)",
                             str(out_dir))
    check_writable_for(Path(out_dir) / "remedy", "nothing was written")


def build_remedies(base_path, float_model, out_dir, recipe: dict | None = None, ranges_file=None, feeds=None,
                   remedies=REMEDIES) -> list[RemedyVariant]:
    """The remedy variants of a static QDQ variant, written under out_dir."""
    recipe = dict(recipe or {})
    check_remedies(remedies, out_dir)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out: list[RemedyVariant] = []
    if "baseline" in remedies:
        out.append(RemedyVariant("baseline", Path(base_path), note="the variant as shipped"))
    if "x64quantprecision" in remedies:
        out.append(RemedyVariant("x64quantprecision", Path(base_path), {X64_ENTRY: "1"},
                                 "same model, session config session.x64quantprecision=1"))
    requant = [r for r in ("reduce_range", "s8s8", "u8u8") if r in remedies]
    if requant:
        out += _requantized(base_path, float_model, out_dir, recipe, ranges_file, feeds, requant)
    if "disable_kleidiai" in remedies:
        out.append(RemedyVariant("disable_kleidiai", Path(base_path), {KLEIDIAI_ENTRY: "1"},
                                 f"same model, session config {KLEIDIAI_ENTRY}=1 (MLAS's kernels, not KleidiAI's SME "
                                 "ones)"))
    return _with_requirement(out, recipe)


def _not_here(rv: RemedyVariant, workers) -> RemedyVariant:
    """A remedy that changes nothing on a fleet without the ISA flag it acts on, as a row saying so."""
    flag = ONLY_ON.get(rv.remedy)
    if flag is None or rv.path is None:
        return rv
    if any(flag in (w.fingerprint.get("identity", {}).get("isa_flags") or []) for w in workers):
        return rv
    return RemedyVariant(rv.remedy, None, rv.config_entries, f"not tried: no host here has {flag.upper()} "
                         f"({rv.note.split(' (')[0]} changes nothing without it)")


def _with_requirement(out: list[RemedyVariant], recipe: dict) -> list[RemedyVariant]:
    """Every remedy of a variant that carries a session requirement (its recipe's) runs with it too: the variant as
    shipped is the variant under its requirement, and so is each remedy tried on it."""
    required = dict(recipe.get(REQUIREMENTS) or {})
    if not required:
        return out
    said = ", ".join(f"{k}={v}" for k, v in sorted(required.items()))
    for rv in out:
        if rv.path is not None:
            rv.config_entries = {**required, **rv.config_entries}
            rv.note += f"; with the variant's session requirement {said}"
    return out


def _requantized(base_path, float_model, out_dir: Path, recipe: dict, ranges_file, feeds, requant) -> list:
    """The re-quantized remedies (reduce_range, s8s8, u8u8), on the variant's own ranges when it has them."""
    out: list[RemedyVariant] = []
    per_channel = bool(recipe.get("per_channel", True))
    kept = Path(base_path).parent / "prepared.onnx"  # calibrate keeps the model it quantized beside the variants
    if kept.exists():
        prepared = kept
    else:
        prepared = out_dir / "prepared.onnx"
        intake.prepare(float_model, prepared, pre_process=bool(recipe.get("pre_process", True)),
                       per_channel=per_channel)
    prep_model = load_with_shape_infer(prepared)  # once: calibration and every re-quantized variant
    ranges_file = Path(ranges_file) if ranges_file else None
    if ranges_file and ranges_file.exists():
        ranges = load_ranges(ranges_file)
        method = method_name(ranges)
        how = f"ranges from {ranges_file.name}"
    else:
        if feeds is None:
            raise UserError(f"{base_path}: no ranges file beside the variant and no calibration inputs")
        method = recipe.get("calibration_method", "minmax")
        ranges = compute_ranges(prepared, feeds, [method], model=prep_model)[method]
        how = f"calibrated here ({method}, {len(feeds)} inputs)"
    act = recipe.get("activation_type", "u8")
    wt = recipe.get("weight_type", "s8")
    options = {"reduce_range": (act, wt, True), "s8s8": ("s8", "s8", False), "u8u8": ("u8", "u8", False)}
    for r in requant:
        at, w, rr = options[r]
        try:
            variants.make_static(prepared, out_dir / f"{r}.onnx", ranges=ranges, method=method, activation_type=at,
                           weight_type=w, per_channel=per_channel, reduce_range=rr, name=r, model=prep_model)
            out.append(RemedyVariant(r, out_dir / f"{r}.onnx", note=f"{at.upper()}{w.upper()}"
                                     f"{', reduce_range' if rr else ''}; {how}"))
        except Exception as exc:  # the quantizer refuses a combination: a row, not a crash
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            out.append(RemedyVariant(r, None, note=f"not supported by the quantizer: {msg}"))
    return out


def _first_session(hosts, extra_entries=None) -> dict:
    """The first host's session with a remedy's entries, in wire form: what a row records."""
    return session_options(hosts[0].session).with_entries(extra_entries).wire()


def _run_on_all(workers, hosts, data: bytes, fixtures, names, extra_entries=None):
    """(runs per host of the model `data`, the first host's session, the hosts whose onnxruntime could not make
    the session, in host order: their JobFailed); any other failure raises."""

    def one(i):
        try:
            session = session_options(hosts[i].session).with_entries(extra_entries).wire()
            return workers[i].run(data, fixtures, session, return_tensors=names)
        except JobFailed as exc:
            if not exc.cannot_run:
                raise
            return exc
    runs = parallel(one, list(range(len(hosts))))
    return runs, _first_session(hosts, extra_entries), [r for r in runs if isinstance(r, JobFailed)]


def remedy_matrix(remedies: list[RemedyVariant], fp32_path, hosts, fixtures, spec, base_variant_id: str = "",
                  require_providers: bool = False, progress: bool = True, shipped_model=None) -> list[RemedyRow]:
    """Run every remedy (and fp32) on every host; classes and decision flips against fp32 per remedy. A remedy
    onnxruntime cannot make a session of on some host is a row saying so, like one the quantizer refuses.
    `shipped_model`: the shipped variant's parsed model when the caller has it (the fleet note lints it). A remedy
    that runs fp32's own file with no entries (the baseline when fp32 is shipped) takes fp32's runs: the same job."""
    from tqdm import tqdm

    names = list(spec.outputs.values())
    workers = start_workers(hosts, require_providers)
    fx_ids = sorted(fx.fixture_id for fx in fixtures)
    labels = [h.label for h in hosts]
    rows: list[RemedyRow] = []
    try:
        fp32_bytes = Path(fp32_path).read_bytes()
        fp32_runs, _, failed = _run_on_all(workers, hosts, fp32_bytes, fixtures, names)
        if failed:
            raise failed[0]
        fp32_dec = [decode_runs(spec, r, names, fixtures) for r in fp32_runs]
        bar = tqdm(remedies, desc="remedies", unit="remedy", disable=not progress, leave=False)
        for rv in bar:
            rv = _not_here(rv, workers)
            rid = content_key([base_variant_id, rv.remedy, labels, fx_ids])
            if rv.path is None:
                rows.append(RemedyRow(rid, base_variant_id, rv.remedy, "", "", labels, False, None, None, "", None,
                                      None, len(fx_ids), rv.note))
                continue
            vid = base_variant_id if base_variant_id and rv.remedy in SAME_MODEL else \
                semantic_sha256(load_model(rv.path, check=False))
            data = Path(rv.path).read_bytes()
            if not rv.config_entries and data == fp32_bytes:   # fp32 shipped: its runs
                runs, sess, failed = fp32_runs, _first_session(hosts), []
            else:
                runs, sess, failed = _run_on_all(workers, hosts, data, fixtures, names, rv.config_entries)
            if failed:  # e.g. onnxruntime 1.32.0, a shared int8 weight and x64quantprecision (tests/explain)
                why = failed[0].why
                rows.append(RemedyRow(rid, base_variant_id, rv.remedy, vid, canonical_json(sess), labels, False, None,
                                      None, "", None, None, len(fx_ids), "onnxruntime cannot make this session on "
                                      f"{', '.join(e.host for e in failed)}: {why}"))
                continue
            hashes = {labels[i]: {(r["fixture_id"], k): v["sha256"] for r in runs[i] for k, v in r["outputs"].items()}
                      for i in range(len(hosts))}
            cmap = {h: c.label for c in equivalence_classes(hashes) for h in c.hosts}
            flips = []
            for i in range(len(hosts)):
                dec = decode_runs(spec, runs[i], names, fixtures)
                flips.append(sum(len(compare(spec, fp32_dec[i][f], dec[f]).flips) for f in dec))
            rows.append(RemedyRow(rid, base_variant_id, rv.remedy, vid, canonical_json(sess), labels, True,
                                  len(set(cmap.values())), len(set(cmap.values())) == 1, canonical_json(cmap),
                                  sum(flips), max(flips), len(fx_ids), rv.note))
        bar.close()
        if rows:   # which hosts take the saturating U8S8 path, and whether the shipped variant's layers reach it
            shipped = next((rv.path for rv in remedies if rv.remedy == "baseline"), None)
            shipped = shipped_model if shipped_model is not None else shipped
            rows[0].note += "; " + fleet_note(fleet_paths(workers), lint_model(shipped) if shipped else None)
    finally:
        for w in workers:
            w.close()
    return rows


def table(rows: list[RemedyRow]) -> str:
    head = ("remedy", "classes", "one class", "flips vs fp32 (sum/max)", "classes by host", "note")
    out = []
    for r in rows:
        cm = json.loads(r.class_map) if r.class_map else {}
        out.append((r.remedy, r.classes, None if r.one_class is None else ("YES" if r.one_class else "no"),
                    None if r.flips_total is None else f"{r.flips_total}/{r.flips_max}",
                    " ".join(f"{h}={c}" for h, c in cm.items()) or None, r.note))
    return text_table(head, out)
