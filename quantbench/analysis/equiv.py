"""The equivalence analysis over the result tables: classes, flips, distances, gates.

Input: an AnalysisRequest: its Selection (host names, variants grouped by source model, each group with its fp32,
the fixture ids of each variant, which stored run of each host) and the decode and gate settings. Everything is read
from the `outputs`, `hosts` and `fixtures` tables, so the same analysis re-renders a report later without running
anything. Output: an EquivResult (plain data) with the rows of the `classes`, `decisions` and `flips` tables and a
JSON-able summary.

Comparisons, per host h and variant v (reference host R):
  own-fp32   v on h against fp32 on h: what quantizing does on that host;
  ref-fp32   v on h against fp32 on R: what the fleet serves against the reference;
  ref-same   v on h against v on R: the same artifact on another CPU.
Identical pairs (fp32 against itself) are skipped.

Decode ``none`` (``--decode none``, or a sidecar without a decode block): the
classes, distances and tensor gate are computed as always; the comparisons
carry ``decisions_compared: False`` and None for every decision figure (never a
zero that reads as "no flips"), the decisions and flips tables get no rows, and
asking for the decision gate is a UserError. A decoder that does not fit the
outputs stays an error (someone asked for it), naming ``--decode none``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from quantbench.store import compaction, partread, partwrite
from quantbench.analysis import classes
from quantbench.analysis import decisions
from quantbench.analysis import gates
from quantbench.analysis import resultcache
from quantbench.analysis.decode import (NONE_HINT, Decoded, DecodeSpec, check_outputs, decode, is_plugin, kind_of,
                                        spec_from_sidecar)
from quantbench.analysis import providers
from quantbench.analysis.precision import DistanceAccumulator
from quantbench.analysis.tiers import used_features
from quantbench.errors import ParameterError, UserError, flag_mark, marked
from quantbench.fsutil import canonical_json, check_writable
from quantbench.hosts.requirements import host_key, ran_as
from quantbench.store.hostresults import load_hosts, load_outputs, tensor_from_row
from quantbench.inputs.modelio import load_model, quantized_ops
from quantbench.inputs.plugins import require
from quantbench.inputs.sidecarfile import allow_recorded, plain_sidecar, sidecar_for
from quantbench.inputs.variantdir import Variant

COMPARISONS = ("own-fp32", "ref-fp32", "ref-same")


@dataclass
class VariantRef:
    """What the analysis needs of a variant: name, semantic id, source model, its sidecar, run hint."""

    name: str
    variant_id: str
    model: str
    sidecar: dict | None
    path: str = ""
    #: the session config entries every host runs it with (its recipe's session_requirements; {}: none)
    requirements: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Selection:
    """Which stored results an analysis reads: the hosts (repeats dropped), the variants, each variant's fixtures,
    and per host which of its stored runs. Checked when made, so a bad selection fails before any table is read."""

    hosts: tuple[str, ...]
    variants: tuple[VariantRef, ...]
    #: variant_id -> the fixture ids analysed for that variant (every variant has an entry)
    fixtures_for: Mapping[str, Sequence[str]]
    #: host -> the (fingerprint_id, session_key) this run produced, taken when several are complete (None: the only)
    prefer: Mapping[str, tuple[str, str]] | None = None
    #: (host, variant_id) -> why the host's runtime cannot run that variant: left out of that variant's classes and
    #: comparisons, and named in the result
    cannot_run: Mapping[tuple[str, str], str] = field(default_factory=dict)
    #: imported host -> {(fingerprint_id, session_key, variant_id, fixture_id)} its files hold (the run's merge): no
    #: other row of that host is taken, so an earlier import's rows fill no gap
    held: Mapping[str, set] = field(default_factory=dict)

    def __post_init__(self):
        if isinstance(self.hosts, str) or not isinstance(self.hosts, Sequence) or not all(
                isinstance(host, str) and host for host in self.hosts):
            raise ParameterError("hosts", "give the host names as a list of strings", self.hosts)
        if not self.hosts:
            raise ParameterError("hosts", "no host to analyse; name at least one")
        if not isinstance(self.variants, Sequence) or not self.variants or not all(
                isinstance(variant, VariantRef) for variant in self.variants):
            raise ParameterError("variants", "give at least one variant, each a VariantRef", self.variants)
        if not isinstance(self.fixtures_for, Mapping):
            raise ParameterError("fixtures_for", "give a dict of variant_id -> fixture ids", self.fixtures_for)
        for variant in self.variants:
            if variant.variant_id not in self.fixtures_for:
                raise ParameterError("fixtures_for", f"no fixtures for variant {variant.name}; give its fixture ids "
                                     f"under its variant_id {variant.variant_id[:12]}")
        for name in ("prefer", "cannot_run", "held"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), Mapping):
                raise ParameterError(name, "give a dict keyed by host (or None)", getattr(self, name))
        object.__setattr__(self, "hosts", tuple(dict.fromkeys(self.hosts)))
        object.__setattr__(self, "variants", tuple(self.variants))
        object.__setattr__(self, "cannot_run", dict(self.cannot_run or {}))
        object.__setattr__(self, "held", dict(self.held or {}))


@dataclass(frozen=True)
class AnalysisRequest:
    """One equivalence analysis asked for: what it reads (`selection`) and how it compares. Checked when made: each
    bad value is a ParameterError naming it, before any table is read."""

    selection: Selection
    #: the host every other one is compared with (None: the first host)
    reference: str | None = None
    #: how outputs become decisions, and the score threshold (None: the sidecar's)
    decode_kind: str | None = None
    threshold: float | None = None
    #: the tensor gate's tolerances, and the decision gate's budget (flips, or a share of fp32's decisions: "1%")
    atol: float = gates.DEFAULT_ATOL
    rtol: float = gates.DEFAULT_RTOL
    budget: int | str = gates.DEFAULT_BUDGET
    #: the options a hint to run a missing host repeats (api.equiv.run_hint)
    run_hint: str = ""
    #: the tables folder read (None: the default results folder's)
    tables_root: Path | str | None = None
    #: variants asked for whose model is semantically identical to an analysed one ({name, model, path,
    #: duplicate_of}): not run twice, the report names them
    duplicates: tuple[dict, ...] = ()
    #: where results are kept by the content key of everything the analysis reads (analysis.resultcache); a result
    #: found there is reused (EquivResult.reused). None: always computed, nothing kept
    cache_dir: Path | str | None = None

    def __post_init__(self):
        if not isinstance(self.selection, Selection):
            raise ParameterError("selection", "give a Selection (hosts, variants, their fixtures)", self.selection)
        hosts = self.selection.hosts
        reference = self.reference or hosts[0]
        if reference not in hosts:
            raise ParameterError("reference", f"not one of the hosts {','.join(hosts)}", reference)
        if self.decode_kind is not None and not isinstance(self.decode_kind, str):
            raise ParameterError("decode_kind", "give a decode kind's name, or None for the sidecar's",
                                 self.decode_kind)
        for name in ("atol", "rtol"):
            gates.check_tolerance(name, getattr(self, name))
        if not isinstance(self.run_hint, str):
            raise ParameterError("run_hint", "give the repeated options as text", self.run_hint)
        object.__setattr__(self, "reference", reference)
        # a count (int), or a share of the served decisions ("1%")
        object.__setattr__(self, "budget", gates.parse_budget(self.budget).value())
        object.__setattr__(self, "duplicates", tuple(self.duplicates or ()))


@dataclass
class EquivResult:
    """One equivalence analysis: its id and settings, per variant its classes and per comparison its flips and
    gates (plain dicts, as equiv.json holds them), and the rows of the classes, decisions and flips tables."""

    equiv_id: str
    settings: dict
    hosts: dict[str, dict]      # host -> selection (fingerprint_id, session_key, kind, arch, cpu)
    variants: list[dict]        # per variant dict: classes, agreement, separating, distances
    comparisons: list[dict]     # per comparison dict: ComparisonSummary + gates
    class_rows: list[dict] = field(default_factory=list)
    #: a reused result's are built on first use (a Sequence, not a list)
    decision_rows: Sequence[dict] = field(default_factory=list)
    flip_rows: list[dict] = field(default_factory=list)
    # (host, variant_id, fixture_id) -> Decoded: the decisions the flips were computed from (not
    # written to any table; the report's accuracy and flip gallery read them). Maps keep no mask.
    decoded: dict[tuple[str, str, str], Decoded] = field(default_factory=dict, repr=False)
    sidecars: dict[str, dict | None] = field(default_factory=dict, repr=False)   # model -> the fp32 variant's sidecar
    # the content key of everything the analysis read (resultcache): same key, same rows; the
    # tables' ledger finds the parts holding this result's rows by it
    cache_key: str = ""
    reused: bool = False        # taken from the analysis cache, not computed
    #: host -> why its runtime does not start on its CPU (left out of the classes: it has no outputs)
    not_started: dict[str, str] = field(default_factory=dict)
    #: host -> {variant: why its runtime cannot run it} (left out of that variant's classes)
    cannot_run: dict[str, dict[str, str]] = field(default_factory=dict)
    #: tiers no machine in reach shows, predicted per variant (analysis.predict): never a class, never gated
    predicted: list[dict] = field(default_factory=list)
    predicted_notes: list[str] = field(default_factory=list)
    #: equiv --confirm (api.confirm): host -> {variant: the host whose rows it inherited}, and the hosts predicted
    #: to share a class whose confirming fixtures differed (run in full: the predictor's misses)
    inherited: dict[str, dict[str, str]] = field(default_factory=dict)
    prediction_misses: list[dict] = field(default_factory=list)

    def gate_failures(self, names) -> list[str]:
        """One message per failed named gate condition."""
        out = []
        if "decision" in names:
            skipped = sorted({c["model"] for c in self.comparisons if not c.get("decisions_compared", True)})
            if skipped:
                raise UserError(f"{flag_mark('gate')} decision: decisions are not compared for model {', '.join(skipped)} "
                                f"(decode none); drop 'decision' from {flag_mark('gate')}, or give a decoder with {flag_mark('decode')} "
                                f"or the sidecar's 'decode' block")
        for v in self.variants if names else []:   # a gate cannot pass on a variant no host ran
            if not v["classes"]:
                out.append(f"{names[0]}: {v['variant']} was never run: no host's runtime can run it")
        for g in names:
            if g == "classes":
                for v in self.variants:
                    if len(v["classes"]) > 1:
                        out.append(f"classes: {v['variant']} splits into {len(v['classes'])} classes "
                                   f"({' | '.join(','.join(c['hosts']) for c in v['classes'])})")
            for c in self.comparisons:
                where = f"{c['variant']} on {c['host']} vs {c['ref_variant']} on {c['ref_host']}"
                if g == "tensor" and not c["tensor_gate"]["passed"]:
                    out.append(f"tensor: {where}: {c['tensor_gate']['failing']} of {c['tensor_gate']['elements']} "
                               f"elements beyond atol/rtol")
                if g == "decision" and not c["decision_passed"]:
                    out.append(f"decision: {where}: "
                               f"{gates.over_budget(c['flips'], self.settings['budget'], c.get('ref_total', 0))}")
        return out

    def summary(self) -> dict:
        return {"equiv_id": self.equiv_id, "settings": self.settings, "hosts": self.hosts,
                "variants": self.variants, "comparisons": self.comparisons, "not_started": self.not_started,
                "cannot_run": self.cannot_run, "predicted": self.predicted, "predicted_notes": self.predicted_notes,
                "inherited": self.inherited, "prediction_misses": self.prediction_misses}


def _run_hint(host: str, variant: VariantRef, hint: str) -> str:
    """The command that makes `host`'s missing results; `hint` repeats the options the analysis was given (marked,
    errors.flag_mark, as these are)."""
    return f"`quantbench run {flag_mark('hosts')} {host} {flag_mark('variants')} {variant.path or variant.name}{hint}`"


_HASH_COLS = ("host", "fingerprint_id", "session_key", "variant_id", "fixture_id", "output_name", "dtype", "shape",
              "sha256")


def _hash_rows(hosts, variants, tables_root) -> dict:
    """{column: values} of the outputs rows of these hosts and variants, hashes only (no tensor), and what
    analysis.providers reads of them (one read for both)."""
    columns = list(dict.fromkeys(_HASH_COLS + providers.COLUMNS + ("inherited",)))
    table = load_outputs(host=list(hosts), variant_id=[variant.variant_id for variant in variants], columns=columns,
                         tables_root=tables_root)
    out = {column: table.column(column).to_pylist() for column in columns}
    keep = [deployed and measured for deployed, measured in zip(
        _as_deployed(variants, out["variant_id"], out["session_options"]), _measured_first(out))]
    out = {column: [value for value, kept in zip(values, keep) if kept] for column, values in out.items()}
    out["stored_session_key"] = out["session_key"]   # as the rows hold it (an import's `held` names these)
    out["session_key"] = [host_key(options, key) for options, key in zip(out["session_options"], out["session_key"])]
    return out


def _measured_first(columns: dict) -> list:
    """Per row, False for an inherited row (equiv --confirm) of a fixture the host has since measured itself."""
    key = ("host", "fingerprint_id", "session_key", "variant_id", "fixture_id", "output_name")
    rows = list(zip(*(columns[column] for column in key)))
    measured = {row for row, inherited in zip(rows, columns["inherited"]) if inherited is None}
    return [inherited is None or row not in measured for row, inherited in zip(rows, columns["inherited"])]


def _as_deployed(variants, variant_ids: list, options: list) -> list:
    """Per result, whether it ran as its variant is deployed (hosts/requirements.ran_as: under the variant's session
    requirement, or a variant without one under none); a host's results are then selected by its own session
    (hosts/requirements.host_key: the requirement's entries taken off)."""
    required = {variant.variant_id: variant.requirements for variant in variants}
    memo: dict = {}
    return [memo.setdefault((variant_id, session), ran_as(session, required.get(variant_id) or {}))
            for variant_id, session in zip(variant_ids, options)]


def _selected_hashes(columns: dict, selected: dict, fixtures_for: Mapping) -> list:
    """The selected rows the analysis reads, as sorted [host, variant, fixture, output, dtype, shape, sha256]."""
    out = []
    for host, fingerprint_id, session_key, variant_id, fixture_id, output, dtype, shape, sha256 in zip(
            *(columns[column] for column in _HASH_COLS)):
        if host in selected and (fingerprint_id, session_key) == tuple(selected[host]) and variant_id in fixtures_for:
            out.append([host, variant_id, fixture_id, output, dtype, shape, sha256])
    wanted = {variant_id: set(fixture_ids) for variant_id, fixture_ids in fixtures_for.items()}
    return sorted(row for row in out if row[2] in wanted[row[1]])


def _stored_runs(columns: dict, held: Mapping) -> dict:
    """host -> (fingerprint_id, session_key) -> {(variant_id, fixture_id)} the rows (`columns`: _hash_rows) hold; an
    imported host of `held` only what its files hold."""
    have: dict = defaultdict(lambda: defaultdict(set))
    for host, fingerprint_id, session_key, stored_key, variant_id, fixture_id in zip(
            columns["host"], columns["fingerprint_id"], columns["session_key"], columns["stored_session_key"],
            columns["variant_id"], columns["fixture_id"]):
        if host not in held or (fingerprint_id, stored_key, variant_id, fixture_id) in held[host]:
            have[host][(fingerprint_id, session_key)].add((variant_id, fixture_id))
    return have


def _select(columns: dict, selection: Selection, run_hint: str, tables_root) -> dict:
    """Per host, the (fingerprint_id, session_key) whose results (`columns`: _hash_rows) cover every variant x
    fixture. Preference: the combination this run produced (`selection.prefer`), else the only complete one. A host
    without complete results names the run that would produce them; a fixture present under another input hash is
    refused. An imported host of `selection.held` has only the results its files hold."""
    have = _stored_runs(columns, selection.held)
    prefer, chosen = selection.prefer, {}
    for host in selection.hosts:
        need = {(variant.variant_id, fixture_id) for variant in selection.variants
                if (host, variant.variant_id) not in selection.cannot_run
                for fixture_id in selection.fixtures_for[variant.variant_id]}
        runs = have.get(host, {})
        complete = sorted(run for run, got in runs.items() if need <= got)
        pick = None
        if prefer and prefer.get(host) in complete:
            pick = prefer[host]
        elif len(complete) == 1:
            pick = complete[0]
        elif len(complete) > 1:
            preferred_sessions = {run[1] for run in (prefer or {}).values()}
            same_session = [run for run in complete if run[1] in preferred_sessions]
            if len(same_session) == 1:
                pick = same_session[0]
            else:
                raise UserError(f"host {host}: complete results under {len(complete)} fingerprints/sessions "
                                f"({', '.join(fp[:12] + '/' + sk[:8] for fp, sk in complete)}); rerun `quantbench "
                                f"equiv` without {flag_mark('no_run')} so this run's session decides")
        if pick is None:
            _refuse_missing(host, need, runs, selection, run_hint, tables_root)
        chosen[host] = pick
    return chosen


def _refuse_missing(host: str, need: set, runs: dict, selection: Selection, run_hint: str, tables_root) -> None:
    """Refuse a host without complete results: name the variants missing and the run that would make them."""
    best = max(runs.values(), key=len, default=set())
    missing = sorted(need - best)
    _refuse_rehashed(host, missing, runs, tables_root)
    missing_by_variant: dict = defaultdict(int)
    for variant_id, _ in missing:
        missing_by_variant[variant_id] += 1
    first = next(variant for variant in selection.variants if variant.variant_id in missing_by_variant)
    what = ", ".join(f"{variant.name} ({missing_by_variant[variant.variant_id]} fixtures)"
                     for variant in selection.variants if variant.variant_id in missing_by_variant)
    if host in selection.held:
        raise UserError(f"host {host}: its imported file(s) hold no results for variant(s) {what}; export "
                        f"them on the other machine, or analyse only the fixtures they hold")
    raise UserError(f"host {host}: no results for variant(s) {what}; run {_run_hint(host, first, run_hint)}")


def _refuse_rehashed(host, missing, runs, tables_root) -> None:
    """A missing fixture whose image this host ran under another input hash: refuse, do not compare."""
    if not missing:
        return
    columns = ("fixture_id", "source", "image_sha256")
    table = partread.read("fixtures", root=tables_root, columns=list(columns))
    image_of = {fixture_id: (source, image) for fixture_id, source, image in
                zip(*(table.column(column).to_pylist() for column in columns))}
    host_fixtures = {fixture_id for got in runs.values() for _, fixture_id in got}
    for _, fixture_id in missing:
        wanted = image_of.get(fixture_id)
        if not wanted:
            continue
        for other in host_fixtures:
            if other != fixture_id and image_of.get(other) is not None and image_of[other][1] == wanted[1]:
                raise UserError(f"fixture {wanted[0]}: input hash differs between hosts ({fixture_id[:12]} here, "
                                f"{other[:12]} on host {host}); the comparison would be meaningless; run every host "
                                f"with the same preprocessing")


def _load_arrays(hosts, selected, variants, fixture_ids, tables_root) -> dict:
    """{(host, variant_id): {fixture_id: ({output: array}, {output: sha256})}} in one table read (`variants`:
    VariantRefs; each one's results as it is deployed: _as_deployed)."""
    variant_ids = [variant.variant_id for variant in variants]
    required = {variant.variant_id: variant.requirements for variant in variants}
    table = load_outputs(host=list(hosts), variant_id=list(variant_ids), fixture_id=sorted(fixture_ids),
                         columns=[*_HASH_COLS, "session_options", "tensor", "inherited"], tables_root=tables_root)
    out: dict = {(host, variant_id): {} for host in hosts for variant_id in variant_ids}
    # an inherited row first, so a row the host measured for the same fixture since replaces it
    for row in sorted(table.to_pylist(), key=lambda row: row["inherited"] is None):
        host = row["host"]
        if not ran_as(row["session_options"], required.get(row["variant_id"]) or {}):
            continue
        if (row["fingerprint_id"], host_key(row["session_options"], row["session_key"])) != tuple(selected[host]):
            continue
        arrays, hashes = out[(host, row["variant_id"])].setdefault(row["fixture_id"], ({}, {}))
        arrays[row["output_name"]] = tensor_from_row(row)
        hashes[row["output_name"]] = row["sha256"]
    return out


def equiv_id_of(settings: dict, selections: dict) -> str:
    """The analysis id: the hash of what determines its rows (the settings and each host's selected run)."""
    blob = canonical_json({"settings": settings,
                           "selections": {host: list(run) for host, run in sorted(selections.items())}})
    return hashlib.sha256(blob.encode()).hexdigest()


def analyze(request: AnalysisRequest) -> EquivResult:
    """The whole equivalence analysis (see the module docstring) of what `request` selects.

    A result found in `request.cache_dir` under the content key of everything the analysis reads is reused, not
    recomputed. A host of `selection.cannot_run` is left out of that variant's classes and comparisons, the
    reference host too: a variant it cannot run has no comparison against it there, and no distances to a reference
    class.
    """
    selection, tables_root = request.selection, request.tables_root
    hosts, variants, fixtures_for = list(selection.hosts), list(selection.variants), selection.fixtures_for
    by_model = _by_model(variants)
    specs = {model: spec_from_sidecar(_base_of(model_variants).sidecar, request.decode_kind, request.threshold,
                                      source=f"model {model} sidecar")
             for model, model_variants in by_model.items()}
    columns = _hash_rows(hosts, variants, tables_root)
    selected = _select(columns, selection, request.run_hint, tables_root)
    settings = _settings(request, specs)
    host_info, features = _host_identities(hosts, selected, tables_root)
    context = _Context(equiv_id=equiv_id_of(settings, selected), hosts=hosts, reference=request.reference,
                       selected=selected, settings=settings, features=features,
                       source=_fixture_sources(tables_root), atol=request.atol, rtol=request.rtol,
                       budget=request.budget, cannot=dict(selection.cannot_run),
                       providers=providers.provider_runs(hosts, selected, columns, tables_root),
                       used=_kernels_used(hosts, selected, host_info, [v.variant_id for v in variants], tables_root))
    key = _content_key(request, context, host_info, specs, columns)
    inherited = _inherited_of(columns, selected, variants, fixtures_for)
    if request.cache_dir is not None:
        found = _from_payload(resultcache.load(request.cache_dir, key), context, by_model, fixtures_for)
        if found is not None:
            found.cache_key, found.cannot_run = key, _named_cannot(context.cannot, variants)
            return mark_inherited(found, inherited)
    out = _Output()
    for model, model_variants in by_model.items():
        model_run = _load_model(context, model, model_variants, specs[model], fixtures_for, tables_root)
        for variant in model_variants:
            _analyze_variant(context, model_run, variant, sorted(fixtures_for[variant.variant_id]), out)
        for variant_info in out.variants[-len(model_variants):]:
            variant_info["decode"] = model_run.spec.as_dict()
    result = EquivResult(equiv_id=context.equiv_id,
                         settings={**settings, "atol": request.atol, "rtol": request.rtol, "budget": request.budget},
                         hosts=host_info, variants=out.variants, comparisons=out.comparisons,
                         class_rows=out.class_rows, decision_rows=out.decision_rows, flip_rows=out.flip_rows,
                         decoded=out.decoded,
                         sidecars={model: plain_sidecar(_base_of(model_variants).sidecar)
                                   for model, model_variants in by_model.items()},
                         cache_key=key, cannot_run=_named_cannot(context.cannot, variants))
    if request.cache_dir is not None:
        resultcache.save(request.cache_dir, key, _payload(result, out.boxed))
    return mark_inherited(result, inherited)


def _content_key(request: AnalysisRequest, context: _Context, host_info: dict, specs: dict, columns: dict) -> str:
    """The content key of everything the analysis reads (analysis.resultcache): same key, same rows."""
    selection = request.selection
    fixture_ids = sorted({fixture_id for ids in selection.fixtures_for.values() for fixture_id in ids})
    return resultcache.key_of({"settings": context.settings, "selections": context.selected, "atol": request.atol,
                      "rtol": request.rtol, "budget": request.budget, "hosts": host_info,
                      "features": context.features, "kernels_used": context.used, "providers": context.providers,
                      "sources": {fixture_id: context.source.get(fixture_id) for fixture_id in fixture_ids},
                      "variants": [dataclasses.asdict(variant) for variant in selection.variants],
                      "specs": {model: spec.as_dict() for model, spec in specs.items()},
                      "outputs": _selected_hashes(columns, context.selected, selection.fixtures_for),
                      "cannot_run": sorted([host, variant_id, why]
                                           for (host, variant_id), why in context.cannot.items())})


def _inherited_of(columns: dict, selected: dict, variants, fixtures_for: Mapping) -> dict:
    """{host: {variant name: the host it inherited from}}: the selected rows a host inherited (equiv's confirm)."""
    names = {variant.variant_id: variant.name for variant in variants}
    wanted = {variant_id: set(fixture_ids) for variant_id, fixture_ids in fixtures_for.items()}
    out: dict = {}
    for host, fingerprint_id, session_key, variant_id, fixture_id, inherited in zip(
            *(columns[column] for column in ("host", "fingerprint_id", "session_key", "variant_id", "fixture_id",
                                             "inherited"))):
        if (inherited is not None and host in selected and (fingerprint_id, session_key) == tuple(selected[host])
                and fixture_id in wanted.get(variant_id, ())):
            out.setdefault(host, {})[names[variant_id]] = inherited
    return out


def mark_inherited(result: EquivResult, inherited: dict) -> EquivResult:
    """`result` with its hosts' inherited rows named: `inherited`, each class row's `inherited_hosts` and each
    variant's class `inherited` (only where a host inherited: an analysis without any reads as before)."""
    result.inherited = inherited
    for row in result.class_rows:
        hosts = [host for host in row["hosts"] if row["variant"] in inherited.get(host, {})]
        if hosts:
            row["inherited_hosts"] = hosts
    for variant_info in result.variants:
        for host_class in variant_info["classes"]:
            hosts = [host for host in host_class["hosts"] if variant_info["variant"] in inherited.get(host, {})]
            if hosts:
                host_class["inherited"] = hosts
    return result


def _named_cannot(cannot: dict, variants: list) -> dict:
    """{host: {variant name: why}} for the result and the report."""
    names = {variant.variant_id: variant.name for variant in variants}
    out: dict = {}
    for (host, variant_id), why in sorted(cannot.items()):
        out.setdefault(host, {})[names.get(variant_id, variant_id)] = why
    return out


def _payload(result: EquivResult, boxed: dict) -> dict:
    """What the cache keeps of a result: all but the decisions rows (rebuilt from the decoded decisions)."""
    return {"equiv_id": result.equiv_id, "settings": result.settings, "hosts": result.hosts,
            "variants": result.variants, "comparisons": result.comparisons, "class_rows": result.class_rows,
            "flip_rows": result.flip_rows, "sidecars": result.sidecars,
            "decoded": {"keys": [[host, variant_id, fixture_id, boxed[(host, variant_id, fixture_id)]]
                                 for host, variant_id, fixture_id in result.decoded],
                        "arrays": {name: resultcache.arrays_to_json([getattr(d, name) for d in result.decoded.values()])
                                   for name in _SLIM_FIELDS},
                        "text": [d.text for d in result.decoded.values()]}}


_SLIM_FIELDS = ("slot", "cls", "score", "kept", "margin", "box")
_PAYLOAD_TYPES = {"equiv_id": str, "settings": dict, "hosts": dict, "variants": list, "comparisons": list,
                  "class_rows": list, "flip_rows": list, "sidecars": dict, "decoded": dict}


def _payload_well_formed(payload: dict, context: _Context) -> bool:
    """Whether a cache payload has the shape _payload writes and is this analysis' (its id)."""
    if any(not isinstance(payload.get(name), kind) for name, kind in _PAYLOAD_TYPES.items()):
        return False
    if not all(isinstance(row, dict) for name in ("variants", "comparisons") for row in payload[name]):
        return False
    if not (resultcache.rows_typed("classes", payload["class_rows"])
            and resultcache.rows_typed("flips", payload["flip_rows"])):
        return False
    return payload["equiv_id"] == context.equiv_id


def _decoded_of(stored: dict) -> tuple[dict, dict] | None:
    """(decoded, boxed) by (host, variant_id, fixture_id) from a payload's "decoded"; None when malformed."""
    keys, arrays = stored.get("keys"), stored.get("arrays")
    if not (isinstance(keys, list) and isinstance(arrays, dict) and set(arrays) == set(_SLIM_FIELDS)):
        return None
    fields = {name: resultcache.arrays_from_json(arrays[name], len(keys)) for name in _SLIM_FIELDS}
    texts = stored.get("text", [None] * len(keys))
    if not (isinstance(texts, list) and len(texts) == len(keys) and all(
            text is None or (isinstance(text, list) and all(isinstance(x, str) for x in text)) for text in texts)):
        return None
    decoded, boxed = {}, {}
    for i, entry in enumerate(keys):
        host, variant_id, fixture_id, has_box = entry
        if not (isinstance(host, str) and isinstance(variant_id, str) and isinstance(fixture_id, str)
                and isinstance(has_box, bool)
                and all(fields[name][i] is not None for name in _SLIM_FIELDS[:-1])):   # only a box may be absent
            return None
        decoded[(host, variant_id, fixture_id)] = Decoded(**{name: fields[name][i] for name in _SLIM_FIELDS},
                                                          text=texts[i])
        boxed[(host, variant_id, fixture_id)] = has_box
    return decoded, boxed


def _from_payload(payload, context: _Context, by_model: dict, fixtures_for: Mapping) -> EquivResult | None:
    """The result a cache payload holds, checked; None when it is not a well-formed one (then recomputed)."""
    if payload is None:
        return None
    try:
        if not _payload_well_formed(payload, context):
            return None
        found = _decoded_of(payload["decoded"])
        if found is None:
            return None
        decoded, boxed = found
        variants = payload["variants"]
        rows = _StoredDecisions(lambda: _rebuild_decisions(context, by_model, fixtures_for, variants,
                                                           payload["flip_rows"], decoded, boxed))
        return EquivResult(equiv_id=payload["equiv_id"], settings=payload["settings"], hosts=payload["hosts"],
                           variants=variants, comparisons=payload["comparisons"],
                           class_rows=payload["class_rows"], decision_rows=rows, flip_rows=payload["flip_rows"],
                           decoded=decoded, sidecars=payload["sidecars"], reused=True)
    except (ValueError, TypeError, KeyError):
        return None


class _StoredDecisions(Sequence):
    """The decisions rows of a reused result, built on first use: writing the tables does not need them
    when the part holding them is still there (tables.append's ledger, keyed by the analysis key)."""

    def __init__(self, build):
        self._build, self._rows = build, None

    def _all(self) -> list:
        if self._rows is None:
            self._rows = self._build()
        return self._rows

    def __len__(self):
        return len(self._all())

    def __getitem__(self, i):
        return self._all()[i]


def _rebuild_decisions(context: _Context, by_model: dict, fixtures_for: Mapping, variants: list, flip_rows: list,
                       decoded: dict, boxed: dict) -> list:
    """The decisions rows of a reused result, in the order and with the values the analysis made them."""
    rows: list = []
    info = {variant_info["variant_id"]: variant_info for variant_info in variants}
    for model_variants in by_model.values():
        for variant in model_variants:
            decode_block = info[variant.variant_id].get("decode") or {}
            if not kind_of(decode_block["kind"]).decides:
                continue
            class_name = DecodeSpec(kind=decode_block["kind"], outputs={},
                                    classes=decode_block.get("classes") or []).class_name
            flip_of = {(row["comparison"], row["host"], row["fixture_id"], row["slot"]): row["kind"]
                       for row in flip_rows if row["variant_id"] == variant.variant_id and row["slot"] >= 0}
            _decision_rows(context, class_name, variant, sorted(fixtures_for[variant.variant_id]), flip_of, decoded,
                           boxed, rows)
    return rows


def _fp32_of(model_variants: list[VariantRef]) -> VariantRef | None:
    """The model's fp32 reference; None when none was given (an already-quantized model alone)."""
    return next((variant for variant in model_variants if variant.name == "fp32"), None)


def _base_of(model_variants: list[VariantRef]) -> VariantRef:
    """The variant whose sidecar and fixtures stand for the model: its fp32, else its first variant."""
    return _fp32_of(model_variants) or model_variants[0]


def _by_model(variants: list[VariantRef]) -> dict:
    """{model: [VariantRef]} in the order given (a model without fp32: flips count against it on the reference
    host)."""
    by_model: dict = defaultdict(list)
    for variant in variants:
        by_model[variant.model].append(variant)
    return by_model


def _settings(request: AnalysisRequest, specs: dict) -> dict:
    """What determines the tables' rows (hashed into the analysis id); gate settings only change verdicts."""
    selection = request.selection
    settings = {"hosts": list(selection.hosts), "reference": request.reference, "decode": request.decode_kind,
                "threshold": request.threshold,
                "variants": [{"name": v.name, "variant_id": v.variant_id, "model": v.model, "path": v.path,
                              **({"session_requirements": v.requirements} if v.requirements else {})}
                             for v in selection.variants],
                "fixtures": {v.variant_id: sorted(selection.fixtures_for[v.variant_id]) for v in selection.variants}}
    if request.duplicates:   # only when there are some: an analysis without duplicates keeps its id
        settings["duplicates"] = sorted((dict(duplicate) for duplicate in request.duplicates),
                                        key=lambda duplicate: (duplicate["model"], duplicate["name"]))
    plugin_ids = {model: spec.as_dict()["plugin"] for model, spec in specs.items() if spec.decoder_kind.plugin}
    if plugin_ids:   # the plug-in's code decides the rows: its file hash is part of the analysis id
        settings["decode_plugins"] = plugin_ids
    return settings


def _host_identities(hosts, selected, tables_root) -> tuple[dict, dict]:
    """Per host, the selected fingerprint's summary and its fingerprint features (read from the hosts table)."""
    columns = ["host", "fingerprint_id", "kind", "arch", "cpu", "isa_flags", "ort_version", "fingerprint"]
    rows = {(row["host"], row["fingerprint_id"]): row
            for row in load_hosts(host=hosts, tables_root=tables_root, columns=columns).to_pylist()}
    host_info, features = {}, {}
    for host in hosts:
        host_info[host], features[host] = _host_identity(rows.get((host, selected[host][0]), {}), selected[host])
    return host_info, classes.without_mask_cpu(features, {host: info.get("cpu_mechanism", "")
                                                    for host, info in host_info.items()})


def _host_identity(row: dict, selected) -> tuple[dict, dict]:
    """One hosts-table row -> (summary for the report, fingerprint features that may separate classes)."""
    fingerprint = json.loads(row.get("fingerprint") or "{}")
    identity = fingerprint.get("identity", {})
    info = {"fingerprint_id": selected[0], "session_key": selected[1], "kind": row.get("kind", ""),
            "arch": row.get("arch", ""), "cpu": row.get("cpu", ""), "ort_version": row.get("ort_version", ""),
            "isa_flags": list(row.get("isa_flags") or []), "session": identity.get("session") or {},
            # how the CPU was shown: "real", "qemu" or "native-masked" (the fingerprint's word; "" before it had one)
            "cpu_mechanism": identity.get("cpu_mechanism", "")}
    vectors = {k: identity[k] for k in classes.VECTOR_FEATURES if k in identity}   # aarch64: SVE/SME lengths, in bits
    info.update(vectors)
    if (fingerprint.get("imported_from") or {}).get("split_from"):  # an imported host whose files ran on several CPUs
        info["split_from"] = fingerprint["imported_from"]["split_from"]
    rest = {k: v for k, v in identity.items() if k not in ("cpu", "isa_flags", "numpy_cpu_features", "session",
                                                           "session_readback", "onnxruntime", "arch", *vectors)}
    rest["onnxruntime_build"] = identity.get("onnxruntime", {}).get("build_info", "")
    session = dict(identity.get("session") or {})
    session.update(session.pop("config_entries", {}) or {})
    return info, classes.fingerprint_features(row.get("arch"), row.get("cpu"), row.get("isa_flags") or [],
                                        row.get("ort_version"), session, rest, vectors)


def _kernels_used(hosts, selected, host_info, variant_ids, tables_root) -> dict:
    """{variant_id: {host: {ISA flag: [families]}}}: the dispatch features each host's kernels used running the
    variant, from the qemu kernel evidence (`localize --evidence`) taken under the selected fingerprint."""
    columns = ["host", "fingerprint_id", "variant_id", "family", "sites"]
    table = partread.read("evidence", root=tables_root, columns=columns,
                          filter={"host": sorted(selected), "variant_id": variant_ids})
    seen: dict = defaultdict(lambda: defaultdict(set))
    for host, fingerprint_id, variant_id, family, sites in zip(*(table.column(c).to_pylist() for c in columns)):
        if host in selected and fingerprint_id == selected[host][0] and variant_id in variant_ids and sites:
            seen[variant_id][host].add(family)
    return {variant_id: {host: used_features(families, host_info[host]["isa_flags"])
                         for host, families in sorted(by_host.items())}
            for variant_id, by_host in sorted(seen.items())}


def _fixture_geometry(fixture_ids, tables_root) -> dict:
    """{fixture_id: the geometry its row records (preprocess.Geometry.as_dict)}; fixtures without one left out."""
    table = partread.read("fixtures", root=tables_root, columns=["fixture_id", "geometry"],
                          filter={"fixture_id": sorted(fixture_ids)})
    return {fixture_id: json.loads(geometry) for fixture_id, geometry in
            zip(table.column("fixture_id").to_pylist(), table.column("geometry").to_pylist()) if geometry}


def _fixture_sources(tables_root) -> dict:
    """{fixture_id: its source image}, for the rows and the report."""
    table = partread.read("fixtures", root=tables_root, columns=["fixture_id", "source"])
    return dict(zip(table.column("fixture_id").to_pylist(), table.column("source").to_pylist()))


@dataclass
class _Context:
    """What every variant of the analysis shares."""

    equiv_id: str
    hosts: list
    reference: str
    selected: dict       # host -> (fingerprint_id, session_key)
    settings: dict
    features: dict       # host -> fingerprint features
    source: dict         # fixture_id -> source image
    atol: float
    rtol: float
    budget: int | str    # flips per comparison, or a share of the decisions fp32 serves in it ("1%")
    used: dict = field(default_factory=dict)   # variant_id -> host -> {ISA flag: [families]} (qemu evidence)
    cannot: dict = field(default_factory=dict)   # (host, variant_id) -> why its runtime cannot run it
    providers: dict = field(default_factory=dict)   # host -> variant_id -> resolved providers (analysis.providers)


@dataclass
class _Output:
    """The analysis' output, filled variant by variant."""

    variants: list = field(default_factory=list)
    comparisons: list = field(default_factory=list)
    class_rows: list = field(default_factory=list)
    decision_rows: list = field(default_factory=list)
    flip_rows: list = field(default_factory=list)
    decoded: dict = field(default_factory=dict)
    boxed: dict = field(default_factory=dict)   # (host, variant_id, fixture_id) -> the decoder gave boxes


@dataclass
class _ModelRun:
    """One model's loaded outputs and its decoder; decoded decisions are cached by output hashes."""

    model: str
    fp32: VariantRef | None   # None: no fp32 given; each variant compares with itself on the reference host
    data: dict           # (host, variant_id) -> {fixture_id: ({output: array}, {output: sha256})}
    spec: DecodeSpec
    compared: bool       # False under decode none: classes, distances and the tensor gate only
    cache: dict = field(default_factory=dict)
    geometry: dict = field(default_factory=dict)   # fixture_id -> its recorded geometry, for a decoder taking it

    def arrays(self, host, variant_id, fixture_id) -> dict:
        """{output: array} of `variant_id` on `host` for one fixture."""
        return self.data[(host, variant_id)][fixture_id][0]

    def decoded(self, host, variant_id, fixture_id):
        """The decisions of `variant_id` on `host` for one fixture, decoded once per distinct output hashes."""
        arrays, hashes = self.data[(host, variant_id)][fixture_id]
        key = (variant_id, fixture_id, tuple(sorted(hashes.items())))
        if key not in self.cache:
            try:
                self.cache[key] = decode(self.spec, arrays, self.geometry.get(fixture_id))
            except UserError as exc:
                raise UserError(f"model {self.model}: {marked(exc)}; or {NONE_HINT}") from None
        return self.cache[key]


def _load_model(context: _Context, model, model_variants, spec, fixtures_for, tables_root) -> _ModelRun:
    """Read one model's selected outputs and fit its decoder to them; a decoder that does not fit fails here."""
    fp32, base = _fp32_of(model_variants), _base_of(model_variants)
    all_fixtures = {fixture_id for variant in model_variants for fixture_id in fixtures_for[variant.variant_id]}
    data = _load_arrays(context.hosts, context.selected, model_variants, all_fixtures, tables_root)
    fit_host, fit_variant_id = _fit_pair(context, base, model_variants)
    first_fixture = sorted(fixtures_for[fit_variant_id])[0]
    first = data[(fit_host, fit_variant_id)][first_fixture][0]
    compared = spec.decoder_kind.decides
    try:
        spec = check_outputs(spec, sorted(first))
    except UserError as exc:
        raise UserError(f"model {model}: {marked(exc)}; or {NONE_HINT}") from None
    model_run = _ModelRun(model=model, fp32=fp32, data=data, spec=spec, compared=compared)
    if compared and spec.decoder_kind.takes_geometry:
        model_run.geometry = _fixture_geometry(all_fixtures, tables_root)
    if compared:
        model_run.decoded(fit_host, fit_variant_id, first_fixture)   # a decoder that does not fit fails first
    return model_run


def _fit_pair(context: _Context, base: VariantRef, model_variants: list) -> tuple[str, str]:
    """The (host, variant_id) whose outputs the decoder is fitted to: the base variant on the reference host, else
    the first variant and host (reference first) whose runtime ran it."""
    pairs = [(host, variant.variant_id) for variant in [base, *model_variants]
             for host in [context.reference, *context.hosts]]
    ran = [pair for pair in pairs if pair not in context.cannot]
    if not ran:
        raise UserError(f"model {model_variants[0].model}: no host can run any of its variants "
                        f"({', '.join(sorted({why for (_, _), why in context.cannot.items()}))})")
    return ran[0]


def _analyze_variant(context: _Context, model_run: _ModelRun, variant: VariantRef, fixture_ids: list,
                     out: _Output) -> None:
    """Classes, distances, comparisons and decisions of one variant, appended to `out` (over the hosts whose
    runtime can run it)."""
    context = dataclasses.replace(context, hosts=[host for host in context.hosts
                                                  if (host, variant.variant_id) not in context.cannot])
    host_classes, variant_info = _classes_and_distances(context, model_run, variant, fixture_ids)
    out.variants.append(variant_info)
    out.class_rows += _class_rows(context, model_run.model, variant, host_classes, variant_info)
    flip_of = {}  # (comparison, host, fixture, slot) -> kind, for the decisions table
    for host in context.hosts:
        for comparison, ref_host, ref_variant_id in _comparison_pairs(context.reference, model_run.fp32, variant,
                                                                       host):
            if (ref_host, ref_variant_id) in context.cannot:   # its own fp32 does not run there: nothing to compare
                continue
            summary, flips = _compare(context, model_run, variant, fixture_ids, comparison, host, ref_host,
                                      ref_variant_id)
            out.comparisons.append(summary)
            for fixture_id, flip in flips:
                if flip.slot >= 0:
                    flip_of[(comparison, host, fixture_id, flip.slot)] = flip.kind
                out.flip_rows.append(_flip_row(context, model_run.spec, variant, summary, fixture_id, flip))
    if model_run.compared:
        _decisions(context, model_run, variant, fixture_ids, flip_of, out)


def _classes_and_distances(context: _Context, model_run: _ModelRun, variant: VariantRef,
                           fixture_ids: list) -> tuple[list, dict]:
    """The variant's equivalence classes and its summary: agreement, separating features, distances."""
    hosts = context.hosts
    hashes = {host: {(fixture_id, output): sha256 for fixture_id in fixture_ids
                     for output, sha256 in model_run.data[(host, variant.variant_id)][fixture_id][1].items()}
              for host in hosts}
    host_classes = classes.equivalence_classes(hashes)
    class_of = {host: host_class.label for host_class in host_classes for host in host_class.hosts}
    agreement = classes.fixture_agreement(hashes)
    float_only = _float_only(variant)
    features = {host: context.features[host] for host in hosts}
    used = context.used.get(variant.variant_id)
    separation = classes.separation(features, class_of, used, float_only)
    smallest = separation.pop("smallest")
    pairs = (classes.pair_separation(features, class_of, agreement, used, float_only)
             if classes.needs_pairs(smallest, len(host_classes)) else [])
    variant_info = {
        "variant": variant.name, "variant_id": variant.variant_id, "model": model_run.model,
        "fixtures": len(fixture_ids), "session_requirements": dict(variant.requirements),
        "classes": [host_class.as_dict() for host_class in host_classes],
        "agreement": [{"a": a, "b": b, "fixtures_agree": n} for (a, b), n in agreement.items()],
        "separating_features": smallest, "separation": separation, "pairs": pairs,
        "distances": _class_distances(context, model_run, variant, fixture_ids, host_classes,
                                      class_of.get(context.reference)),
        "versions": classes.version_findings(features, class_of),
        "providers": {host: context.providers.get(host, {}).get(variant.variant_id, {}) for host in hosts},
        "feature_values": {host: {name: context.features[host].get(name, False if name.startswith("isa:") else None)
                                  for name in dict.fromkeys([*(smallest or []), *separation["features"]])}
                           for host in hosts}}
    return host_classes, variant_info


def _float_only(variant: VariantRef) -> bool:
    """Whether the variant runs no integer kernel (no quantized op in its graph; unknown without its file: False)."""
    if not variant.path or not Path(variant.path).is_file():
        return False
    return not quantized_ops(load_model(variant.path, check=False, load_external_data=False))


def _class_distances(context: _Context, model_run: _ModelRun, variant: VariantRef, fixture_ids: list,
                     host_classes: list, ref_label) -> list[dict]:
    """Per class other than the reference's, per output: the numeric distance of its first host to the reference
    (none when the reference host cannot run the variant: `ref_label` None)."""
    reference = context.reference
    distances: list = []
    if ref_label is None:
        return distances
    for host_class in host_classes:
        if host_class.label == ref_label:
            continue
        first_host = host_class.hosts[0]
        accumulators: dict = defaultdict(DistanceAccumulator)
        for fixture_id in fixture_ids:
            ref_arrays = model_run.arrays(reference, variant.variant_id, fixture_id)
            class_arrays = model_run.arrays(first_host, variant.variant_id, fixture_id)
            for output in sorted(ref_arrays):
                ref, other = ref_arrays[output], class_arrays.get(output)
                if other is not None and ref.shape == other.shape and ref.dtype == other.dtype:
                    accumulators[output].add(ref, other)
        for output, accumulator in sorted(accumulators.items()):
            distances.append({"class": host_class.label, "host": first_host, "ref_class": ref_label,
                              "ref_host": reference, "output": output, **accumulator.result().as_dict()})
    return distances


def _class_rows(context: _Context, model: str, variant: VariantRef, host_classes: list,
                variant_info: dict) -> list[dict]:
    """The `classes` table rows of one variant."""
    selections = {host: list(run) for host, run in context.selected.items()}
    return [{"equiv_id": context.equiv_id, "variant_id": variant.variant_id, "variant": variant.name, "model": model,
             "class_label": host_class.label, "hosts": host_class.hosts,
             "fingerprint_ids": [context.selected[host][0] for host in host_class.hosts],
             "digest": host_class.digest, "fixtures": variant_info["fixtures"],
             "reference": context.reference in host_class.hosts,
             "separating_features": variant_info["separating_features"],
             "agreement": canonical_json(variant_info["agreement"]),
             "distance": canonical_json([d for d in variant_info["distances"] if d["class"] == host_class.label]),
             "provider_findings": providers.class_findings(context.providers, variant.variant_id, host_class.hosts),
             "placements": canonical_json(providers.class_placements(context.providers, variant.variant_id,
                                                              host_class.hosts)),
             "settings": canonical_json({**context.settings, "selections": selections})}
            for host_class in host_classes]


def _comparison_pairs(reference: str, fp32: VariantRef, variant: VariantRef,
                      host: str) -> list[tuple[str, str, str]]:
    """(comparison, reference host, reference variant_id) for `variant` on `host` (without fp32: ref-same only)."""
    if fp32 is None:
        return [("ref-same", reference, variant.variant_id)] if host != reference else []
    pairs = []
    if variant.name != "fp32":
        pairs.append(("own-fp32", host, fp32.variant_id))
    if host != reference:
        pairs.append(("ref-fp32", reference, fp32.variant_id))
        if variant.name != "fp32":
            pairs.append(("ref-same", reference, variant.variant_id))
    return pairs


def _compare(context: _Context, model_run: _ModelRun, variant: VariantRef, fixture_ids: list, comparison: str,
             host: str, ref_host: str, ref_variant_id: str) -> tuple[dict, list]:
    """One comparison of `variant` on `host` against `ref_variant_id` on `ref_host`: (its summary with both gates,
    [(fixture_id, Flip)])."""
    fp32 = model_run.fp32
    ref_name = "fp32" if fp32 is not None and ref_variant_id == fp32.variant_id else variant.name
    per_fixture, flips, tensor_gate = [], [], gates.TensorGate()
    for fixture_id in fixture_ids:
        tensor_gate.add_fixture(model_run.arrays(ref_host, ref_variant_id, fixture_id),
                                model_run.arrays(host, variant.variant_id, fixture_id), context.atol, context.rtol)
        if not model_run.compared:
            continue
        compared = decisions.compare(model_run.spec, model_run.decoded(ref_host, ref_variant_id, fixture_id),
                             model_run.decoded(host, variant.variant_id, fixture_id))
        per_fixture.append(compared)
        flips += [(fixture_id, flip) for flip in compared.flips]
    if not model_run.compared:
        return _not_compared(comparison, host, variant.name, ref_host, ref_name, len(fixture_ids),
                             variant.variant_id, model_run.model, tensor_gate), flips
    spec = model_run.spec
    summary = decisions.summarize(comparison, host, variant.name, ref_host, ref_name, per_fixture, spec.threshold,
                          decisions.flip_kinds(spec), totals_fixed=spec.decoder_kind.totals_fixed(spec.threshold),
                          margin_kinds=spec.decoder_kind.margin_flips)
    decision_ok = gates.decision_passed(summary.flips, context.budget, summary.ref_total)
    return {**summary.as_dict(), "variant_id": variant.variant_id, "model": model_run.model,
            "tensor_gate": tensor_gate.as_dict(), "decision_passed": decision_ok,
            "gates_disagree": gates.disagreement(tensor_gate.passed, decision_ok), "decisions_compared": True}, flips


def _flip_row(context: _Context, spec: DecodeSpec, variant: VariantRef, comparison: dict, fixture_id: str,
              flip) -> dict:
    """One `flips` table row."""
    return {"equiv_id": context.equiv_id, "comparison": comparison["comparison"], "host": comparison["host"],
            "variant_id": variant.variant_id, "variant": variant.name, "ref_host": comparison["ref_host"],
            "ref_variant": comparison["ref_variant"], "fixture_id": fixture_id,
            "source": context.source.get(fixture_id, ""), "ref_slot": flip.ref_slot, "slot": flip.slot,
            "kind": flip.kind,
            "ref_class": spec.class_name(flip.ref_cls) if flip.ref_text is None else flip.ref_text,
            "class_name": spec.class_name(flip.cls) if flip.text is None else flip.text,
            "ref_score": flip.ref_score, "score": flip.score, "iou": flip.iou,
            "threshold": spec.threshold, "margin": flip.margin, "band": decisions.band_label(abs(flip.margin))}


def _decisions(context: _Context, model_run: _ModelRun, variant: VariantRef, fixture_ids: list, flip_of: dict,
               out: _Output) -> None:
    """Every decoded decision of `variant` on every host: the slim decoded decisions and `decisions` table rows."""
    for host in context.hosts:
        for fixture_id in fixture_ids:
            decided = model_run.decoded(host, variant.variant_id, fixture_id)
            out.decoded[(host, variant.variant_id, fixture_id)] = _slim(decided)
            out.boxed[(host, variant.variant_id, fixture_id)] = getattr(decided, "box", None) is not None
    _decision_rows(context, model_run.spec.class_name, variant, fixture_ids, flip_of, out.decoded, out.boxed,
                   out.decision_rows)


def _decision_rows(context: _Context, class_name, variant: VariantRef, fixture_ids: list, flip_of: dict,
                   decoded: dict, boxed: dict, rows: list) -> None:
    """The `decisions` rows of `variant` on every host, from the slim decoded decisions (a region's box is not a
    row's: `boxed` says which decisions had boxes of their own), appended to `rows`; `class_name`: the decode
    spec's (DecodeSpec.class_name)."""
    names: dict = {}   # class id -> name, asked of the spec once
    for host in context.hosts:
        for fixture_id in fixture_ids:
            decided = decoded[(host, variant.variant_id, fixture_id)]
            # whole arrays to Python values at once: the same ints, floats and bools as int()/float()/bool()
            slots, class_ids = np.asarray(decided.slot, np.int64).tolist(), np.asarray(decided.cls, np.int64).tolist()
            scores = np.asarray(decided.score, np.float64).tolist()
            margins = np.asarray(decided.margin, np.float64).tolist()
            kept = np.asarray(decided.kept, bool).tolist()
            boxes = (np.asarray(decided.box, np.float64).tolist() if boxed[(host, variant.variant_id, fixture_id)]
                     else None)
            text = getattr(decided, "text", None)   # ctc: each decision's name is its string
            source = context.source.get(fixture_id)
            for i, slot in enumerate(slots):
                class_id = class_ids[i]
                if class_id not in names:
                    names[class_id] = class_name(class_id)
                rows.append({
                    "equiv_id": context.equiv_id, "host": host, "fingerprint_id": context.selected[host][0],
                    "variant_id": variant.variant_id, "variant": variant.name, "fixture_id": fixture_id,
                    "source": source, "slot": slot, "class_id": class_id, "box": None if boxes is None else boxes[i],
                    "class_name": names[class_id] if text is None else text[i], "score": scores[i],
                    "kept": kept[i], "margin": margins[i],
                    "flip_own_fp32": flip_of.get(("own-fp32", host, fixture_id, slot), ""),
                    "flip_ref_fp32": flip_of.get(("ref-fp32", host, fixture_id, slot), "")})


def _slim(decided):
    """The decisions without a map's per-element arrays (a region's box stands for it)."""
    box = decided.box
    if box is None and decided.labels is not None and decided.slot.size:
        planes = decided.labels.reshape(-1, *decided.labels.shape[-2:])
        height, width = planes.shape[-2:]
        _, ys, xs = np.nonzero(planes)
        labels = planes[planes > 0] - 1            # same (plane, row, col) order as np.nonzero
        count = decided.slot.size
        lo_x, lo_y = np.full(count, np.inf), np.full(count, np.inf)
        hi_x, hi_y = np.full(count, -np.inf), np.full(count, -np.inf)
        np.minimum.at(lo_x, labels, xs)
        np.minimum.at(lo_y, labels, ys)
        np.maximum.at(hi_x, labels, xs + 1)
        np.maximum.at(hi_y, labels, ys + 1)
        box = np.stack([lo_x / width, lo_y / height, hi_x / width, hi_y / height], axis=1)   # normalised to the map
    return Decoded(slot=decided.slot, cls=decided.cls, score=decided.score, kept=decided.kept, margin=decided.margin,
                   box=box, text=getattr(decided, "text", None))


def _not_compared(comparison, host, variant, ref_host, ref_variant, fixtures, variant_id, model,
                  tensor_gate) -> dict:
    """A comparison under decode none: the tensor gate only; every decision figure None, not zero."""
    keys = decisions.ComparisonSummary.__dataclass_fields__
    return {**{k: None for k in keys}, "comparison": comparison, "host": host, "variant": variant,
            "ref_host": ref_host, "ref_variant": ref_variant, "fixtures": fixtures, "concealed": False, "margins": {},
            "variant_id": variant_id, "model": model, "tensor_gate": tensor_gate.as_dict(), "decision_passed": None,
            "gates_disagree": "", "decisions_compared": False}



# --------------------------------------------------------------------------- re-analysis


def last_equiv(results) -> dict:
    """The summary the last `quantbench equiv` wrote into `results` (equiv.json: its id, settings, labels), or {}."""
    path = Path(results) / "equiv.json"
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass
class Reanalysis:
    """An earlier analysis computed again from the tables: the result (its settings["gates"]: the gates that
    analysis was run with) and the labels it read ({"fixtures", "images"}; {} unless it was the last equiv)."""

    result: EquivResult
    labels: dict


def _pick_analysis(root: Path, want: str | None) -> tuple[str, dict]:
    """(equiv id, its settings) of the analysis whose id starts with `want` (None: the only one)."""
    table = partread.read("classes", root=root, columns=["equiv_id", "settings"])
    settings_of = dict(zip(table.column("equiv_id").to_pylist(), table.column("settings").to_pylist()))
    if not settings_of:
        raise UserError(f"{root}/classes: no equiv results; run `quantbench equiv {flag_mark('hosts')} pi,x86` first")
    ids = sorted(settings_of)
    if want:
        match = [i for i in ids if i.startswith(want)]
        if len(match) != 1:
            raise ParameterError("equiv_id", f"{'no' if not match else 'several'} analyses match; "
                                             f"known: {', '.join(i[:12] for i in ids)}", want)
        return match[0], json.loads(settings_of[match[0]])
    if len(ids) == 1:
        return ids[0], json.loads(settings_of[ids[0]])
    raise UserError(f"{root}/classes: {len(ids)} equiv analyses; pick one with {flag_mark('equiv_id')} "
                    f"({', '.join(i[:12] for i in ids)})")


def _recorded_refs(settings: dict, root: Path) -> list[VariantRef]:
    """The analysed variants as the models table records them, each with the sidecar its recipe carries."""
    models = {row["variant_id"]: row for row in partread.read("models", root=root).to_pylist()}
    refs = []
    for recorded in settings["variants"]:
        recipe = json.loads((models.get(recorded["variant_id"]) or {}).get("recipe") or "{}")
        allow_recorded(recipe)   # the plug-ins calibrate ran, unchanged, run again
        sidecar = sidecar_for(Variant(name=recorded["name"], path=Path(recorded.get("path") or ""),
                                      model=recorded["model"], recipe=recipe))
        refs.append(VariantRef(name=recorded["name"], variant_id=recorded["variant_id"], model=recorded["model"],
                               sidecar=sidecar, path=recorded.get("path", ""),
                               requirements=dict(recorded.get("session_requirements") or {})))
    return refs


def reanalyze(results, equiv_id: str | None = None) -> Reanalysis:
    """The analysis `equiv_id` (a prefix; None: the last equiv's, else the only one) computed again from the
    tables under `results`/tables, with the settings it was run with (its gates too when it was the last equiv)."""
    results = Path(results)
    root = results / "tables"
    last = last_equiv(results)
    found_id, settings = _pick_analysis(root, equiv_id or last.get("equiv_id"))
    refs = _recorded_refs(settings, root)
    if is_plugin(settings["decode"]):   # named on that equiv's command line, read back from a table: ask again
        require(settings["decode"], f"{root}/classes (analysis {found_id[:12]}): decode")
    # gate settings are not part of the analysis id: take the last run's when it is this analysis
    gate_settings = (last.get("settings") or {}) if last.get("equiv_id") == found_id else {}
    check_writable(results, "the report is written into the results folder")
    selection = Selection(hosts=settings["hosts"], variants=refs, fixtures_for=settings["fixtures"],
                          prefer={host: tuple(run) for host, run in settings["selections"].items()})
    result = analyze(AnalysisRequest(
        selection, reference=settings["reference"], decode_kind=settings["decode"], threshold=settings["threshold"],
        atol=gate_settings.get("atol", gates.DEFAULT_ATOL), rtol=gate_settings.get("rtol", gates.DEFAULT_RTOL),
        budget=gate_settings.get("budget", gates.DEFAULT_BUDGET), tables_root=root,
        duplicates=settings.get("duplicates"), cache_dir=resultcache.cache_dir_of(results)))
    # the verdict states the gates that analysis was run with
    result.settings["gates"] = list(gate_settings.get("gates") or [])
    return Reanalysis(result, (last.get("labels") or {}) if last.get("equiv_id") == found_id else {})


def write_tables(result: EquivResult, tables_root) -> list:
    """Append the classes, decisions and flips rows; returns the part paths (rows stored before are not rewritten)."""
    paths = []
    for name, rows in (("classes", result.class_rows), ("decisions", result.decision_rows),
                       ("flips", result.flip_rows)):
        compaction.maybe_compact(name, tables_root)  # before the append: the part named below stays
        path = partwrite.append(name, rows, root=tables_root, ledger=True, made_from=result.cache_key or None)
        if path is not None:
            paths.append(path)
    return paths


def as_json(obj) -> str:
    """The summary as JSON (NaN -> null)."""
    def clean(x):
        if isinstance(x, float) and (np.isnan(x) or np.isinf(x)):
            return None
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if isinstance(x, np.generic):
            return clean(x.item())
        return x
    return json.dumps(clean(obj), indent=2, sort_keys=True)
