"""The equivalence analysis over the result tables: classes, flips, distances, gates.

Input: host names, variants (grouped by source model, each group with its fp32),
fixture ids, decode settings. Everything is read from the `outputs`, `hosts`
and `fixtures` tables, so the same analysis re-renders a report later without
running anything. Output: an EquivResult (plain data) with the rows of the
`classes`, `decisions` and `flips` tables and a JSON-able summary.

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from quantbench.store import compaction, partread, partwrite
from quantbench.analysis import classes as C
from quantbench.analysis import decisions as D
from quantbench.analysis import gates as G
from quantbench.analysis import resultcache as RC
from quantbench.analysis.decode import (NONE_HINT, Decoded, DecodeSpec, check_outputs, decode, is_plugin, kind_of,
                                        spec_from_sidecar)
from quantbench.analysis import providers as PR
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


@dataclass
class EquivResult:
    equiv_id: str
    settings: dict
    hosts: dict                 # host -> selection (fingerprint_id, session_key, kind, arch, cpu)
    variants: list              # per variant dict: classes, agreement, separating, distances
    comparisons: list           # per comparison dict: ComparisonSummary + gates
    class_rows: list = field(default_factory=list)
    decision_rows: list = field(default_factory=list)
    flip_rows: list = field(default_factory=list)
    # (host, variant_id, fixture_id) -> Decoded: the decisions the flips were computed from (not
    # written to any table; the report's accuracy and flip gallery read them). Maps keep no mask.
    decoded: dict = field(default_factory=dict, repr=False)
    sidecars: dict = field(default_factory=dict, repr=False)   # model -> the fp32 variant's sidecar
    # the content key of everything the analysis read (resultcache): same key, same rows; the
    # tables' ledger finds the parts holding this result's rows by it
    cache_key: str = ""
    reused: bool = False        # taken from the analysis cache, not computed
    #: host -> why its runtime does not start on its CPU (left out of the classes: it has no outputs)
    not_started: dict = field(default_factory=dict)
    #: host -> {variant: why its runtime cannot run it} (left out of that variant's classes)
    cannot_run: dict = field(default_factory=dict)
    #: tiers no machine in reach shows, predicted per variant (analysis.predict): never a class, never gated
    predicted: list = field(default_factory=list)
    predicted_notes: list = field(default_factory=list)
    #: equiv --confirm (api.confirm): host -> {variant: the host whose rows it inherited}, and the hosts predicted
    #: to share a class whose confirming fixtures differed (run in full: the predictor's misses)
    inherited: dict = field(default_factory=dict)
    prediction_misses: list = field(default_factory=list)

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
                               f"{G.over_budget(c['flips'], self.settings['budget'], c.get('ref_total', 0))}")
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
    cols = list(dict.fromkeys(_HASH_COLS + PR.COLUMNS + ("inherited",)))
    t = load_outputs(host=list(hosts), variant_id=[v.variant_id for v in variants], columns=cols,
                     tables_root=tables_root)
    out = {c: t.column(c).to_pylist() for c in cols}
    keep = [a and b for a, b in zip(_as_deployed(variants, out["variant_id"], out["session_options"]),
                                    _measured_first(out))]
    out = {c: [x for x, k in zip(vals, keep) if k] for c, vals in out.items()}
    out["stored_session_key"] = out["session_key"]   # as the rows hold it (an import's `held` names these)
    out["session_key"] = [host_key(o, k) for o, k in zip(out["session_options"], out["session_key"])]
    return out


def _measured_first(cols: dict) -> list:
    """Per row, False for an inherited row (equiv --confirm) of a fixture the host has since measured itself."""
    key = ("host", "fingerprint_id", "session_key", "variant_id", "fixture_id", "output_name")
    rows = list(zip(*(cols[c] for c in key)))
    measured = {r for r, i in zip(rows, cols["inherited"]) if i is None}
    return [i is None or r not in measured for r, i in zip(rows, cols["inherited"])]


def _as_deployed(variants, variant_ids: list, options: list) -> list:
    """Per result, whether it ran as its variant is deployed (hosts/requirements.ran_as: under the variant's session
    requirement, or a variant without one under none); a host's results are then selected by its own session
    (hosts/requirements.host_key: the requirement's entries taken off)."""
    required = {v.variant_id: v.requirements for v in variants}
    memo: dict = {}
    return [memo.setdefault((v, o), ran_as(o, required.get(v) or {})) for v, o in zip(variant_ids, options)]


def _selected_hashes(cols: dict, sel: dict, fixtures_for: dict) -> list:
    """The selected rows the analysis reads, as sorted [host, variant, fixture, output, dtype, shape, sha256]."""
    out = []
    for h, fp, sk, v, f, o, dt, sh, sha in zip(*(cols[c] for c in _HASH_COLS)):
        if h in sel and (fp, sk) == tuple(sel[h]) and v in fixtures_for:
            out.append([h, v, f, o, dt, sh, sha])
    want = {v: set(fs) for v, fs in fixtures_for.items()}
    return sorted(r for r in out if r[2] in want[r[1]])


def _select(cols: dict, hosts, variants, fixtures_for, prefer, run_hint, tables_root, cannot=None,
            held=None) -> dict:
    """Per host, the (fingerprint_id, session_key) whose results (`cols`: _hash_rows) cover every variant x
    fixture. Preference: the combination this run produced (`prefer`), else the only complete one. A host without
    complete results names the run that would produce them; a fixture present under another input hash is
    refused. An imported host of `held` has only the results its files hold."""
    have: dict = defaultdict(lambda: defaultdict(set))
    held = held or {}
    for h, fp, sk, stored, v, f in zip(cols["host"], cols["fingerprint_id"], cols["session_key"],
                                       cols["stored_session_key"], cols["variant_id"], cols["fixture_id"]):
        if h not in held or (fp, stored, v, f) in held[h]:
            have[h][(fp, sk)].add((v, f))
    chosen = {}
    for h in hosts:
        need = {(v.variant_id, f) for v in variants if (h, v.variant_id) not in (cannot or {})
                for f in fixtures_for[v.variant_id]}
        combos = have.get(h, {})
        full = sorted(k for k, got in combos.items() if need <= got)
        pick = None
        if prefer and prefer.get(h) in full:
            pick = prefer[h]
        elif len(full) == 1:
            pick = full[0]
        elif len(full) > 1:
            pref_sk = {p[1] for p in (prefer or {}).values()}
            same = [k for k in full if k[1] in pref_sk]
            if len(same) == 1:
                pick = same[0]
            else:
                raise UserError(f"host {h}: complete results under {len(full)} fingerprints/sessions "
                                f"({', '.join(fp[:12] + '/' + sk[:8] for fp, sk in full)}); rerun `quantbench equiv` "
                                f"without {flag_mark('no_run')} so this run's session decides")
        if pick is None:
            best = max(combos.values(), key=len, default=set())
            missing = sorted(need - best)
            _refuse_rehashed(h, missing, combos, tables_root)
            by_var = defaultdict(int)
            for vid, _ in missing:
                by_var[vid] += 1
            v0 = next(v for v in variants if v.variant_id in by_var)
            what = ", ".join(f"{v.name} ({by_var[v.variant_id]} fixtures)" for v in variants if v.variant_id in by_var)
            if h in held:
                raise UserError(f"host {h}: its imported file(s) hold no results for variant(s) {what}; export "
                                f"them on the other machine, or analyse only the fixtures they hold")
            raise UserError(f"host {h}: no results for variant(s) {what}; run {_run_hint(h, v0, run_hint)}")
        chosen[h] = pick
    return chosen


def _refuse_rehashed(host, missing, combos, tables_root) -> None:
    """A missing fixture whose image this host ran under another input hash: refuse, do not compare."""
    if not missing:
        return
    ft = partread.read("fixtures", root=tables_root, columns=["fixture_id", "source", "image_sha256"])
    by_id = {f: (s, i) for f, s, i in zip(*(ft.column(c).to_pylist() for c in ("fixture_id", "source", "image_sha256")))}
    host_fx = {f for got in combos.values() for _, f in got}
    for _, f in missing:
        src = by_id.get(f)
        if not src:
            continue
        for g in host_fx:
            if g != f and by_id.get(g) is not None and by_id[g][1] == src[1]:
                raise UserError(f"fixture {src[0]}: input hash differs between hosts ({f[:12]} here, {g[:12]} on "
                                f"host {host}); the comparison would be meaningless; run every host with the same "
                                f"preprocessing")


def _load_arrays(hosts, sel, variants, fixture_ids, tables_root) -> dict:
    """{(host, variant_id): {fixture_id: ({output: array}, {output: sha256})}} in one table read (`variants`:
    VariantRefs; each one's results as it is deployed: _as_deployed)."""
    variant_ids = [v.variant_id for v in variants]
    required = {v.variant_id: v.requirements for v in variants}
    t = load_outputs(host=list(hosts), variant_id=list(variant_ids), fixture_id=sorted(fixture_ids),
                     columns=[*_HASH_COLS, "session_options", "tensor", "inherited"], tables_root=tables_root)
    out: dict = {(h, v): {} for h in hosts for v in variant_ids}
    # an inherited row first, so a row the host measured for the same fixture since replaces it
    for r in sorted(t.to_pylist(), key=lambda r: r["inherited"] is None):
        h = r["host"]
        if not ran_as(r["session_options"], required.get(r["variant_id"]) or {}):
            continue
        if (r["fingerprint_id"], host_key(r["session_options"], r["session_key"])) != tuple(sel[h]):
            continue
        arrs, shas = out[(h, r["variant_id"])].setdefault(r["fixture_id"], ({}, {}))
        arrs[r["output_name"]] = tensor_from_row(r)
        shas[r["output_name"]] = r["sha256"]
    return out


def equiv_id_of(settings: dict, selections: dict) -> str:
    blob = canonical_json({"settings": settings, "selections": {h: list(s) for h, s in sorted(selections.items())}})
    return hashlib.sha256(blob.encode()).hexdigest()


def analyze(hosts: list[str], variants: list[VariantRef], fixtures_for: dict, reference: str | None = None,
            decode_kind: str | None = None, threshold: float | None = None, atol: float = G.DEFAULT_ATOL,
            rtol: float = G.DEFAULT_RTOL, budget: int | str = G.DEFAULT_BUDGET, prefer: dict | None = None,
            run_hint: str = "", tables_root=None, duplicates: list | None = None, cache_dir=None,
            cannot_run: dict | None = None, held: dict | None = None) -> EquivResult:
    """The whole equivalence analysis; see the module docstring.

    `duplicates`: variants asked for whose model is semantically identical to an analysed
    one ({name, model, path, duplicate_of}); they are not run twice, and the report names them.
    `cache_dir`: where results are kept by the content key of everything the analysis reads
    (quantbench.analysis.resultcache); a result found there is reused, not recomputed
    (`EquivResult.reused`). None: always computed, nothing kept.
    `cannot_run`: {(host, variant_id): why} the host's runtime cannot run that variant (the run's result); the host
    is left out of that variant's classes and comparisons, and the result names it.
    `held`: {imported host: {(fingerprint_id, session_key, variant_id, fixture_id)}} the results its files hold
    (the run's merge); no other row of that host is taken, so an earlier import's rows fill no gap. The reference host too: a
    variant it cannot run has no comparison against it there, and no distances to a reference class.
    """
    budget = G.parse_budget(budget).value()   # a count (int), or a share of the served decisions ("1%")
    hosts, reference, by_model = _check_request(hosts, variants, reference)
    cannot = dict(cannot_run or {})
    specs = {model: spec_from_sidecar(_base_of(vs).sidecar, decode_kind, threshold, source=f"model {model} sidecar")
             for model, vs in by_model.items()}
    cols = _hash_rows(hosts, variants, tables_root)
    sel = _select(cols, hosts, variants, fixtures_for, prefer, run_hint, tables_root, cannot, held)
    settings = _settings(hosts, reference, decode_kind, threshold, variants, fixtures_for, duplicates, specs)
    host_info, features = _host_identities(hosts, sel, tables_root)
    runs = PR.provider_runs(hosts, sel, cols, tables_root)
    ctx = _Context(equiv_id=equiv_id_of(settings, sel), hosts=hosts, reference=reference, sel=sel,
                   settings=settings, features=features, source=_fixture_sources(tables_root),
                   atol=atol, rtol=rtol, budget=budget, cannot=cannot, providers=runs,
                   used=_kernels_used(hosts, sel, host_info, [v.variant_id for v in variants], tables_root))
    key = RC.key_of({"settings": settings, "selections": sel, "atol": atol, "rtol": rtol, "budget": budget,
                     "hosts": host_info, "features": features, "kernels_used": ctx.used, "providers": runs,
                     "sources": {f: ctx.source.get(f) for f in sorted({f for fs in fixtures_for.values() for f in fs})},
                     "variants": [dataclasses.asdict(v) for v in variants],
                     "specs": {m: sp.as_dict() for m, sp in specs.items()},
                     "outputs": _selected_hashes(cols, sel, fixtures_for),
                     "cannot_run": sorted([h, v, why] for (h, v), why in cannot.items())})
    if cache_dir is not None:
        found = _from_payload(RC.load(cache_dir, key), ctx, by_model, fixtures_for)
        if found is not None:
            found.cache_key, found.cannot_run = key, _named_cannot(cannot, variants)
            return mark_inherited(found, _inherited_of(cols, sel, variants, fixtures_for))
    out = _Rows()
    for model, vs in by_model.items():
        run = _load_model(ctx, model, vs, specs[model], fixtures_for, tables_root)
        for v in vs:
            _analyze_variant(ctx, run, v, sorted(fixtures_for[v.variant_id]), out)
        for vi in out.variants[-len(vs):]:
            vi["decode"] = run.spec.as_dict()
    result = EquivResult(equiv_id=ctx.equiv_id, settings={**settings, "atol": atol, "rtol": rtol, "budget": budget},
                         hosts=host_info, variants=out.variants, comparisons=out.comparisons,
                         class_rows=out.class_rows, decision_rows=out.decision_rows, flip_rows=out.flip_rows,
                         decoded=out.decoded,
                         sidecars={m: plain_sidecar(_base_of(vs).sidecar) for m, vs in by_model.items()},
                         cache_key=key, cannot_run=_named_cannot(cannot, variants))
    if cache_dir is not None:
        RC.save(cache_dir, key, _payload(result, out.boxed))
    return mark_inherited(result, _inherited_of(cols, sel, variants, fixtures_for))


def _inherited_of(cols: dict, sel: dict, variants, fixtures_for: dict) -> dict:
    """{host: {variant name: the host it inherited from}}: the selected rows a host inherited (equiv's confirm)."""
    names = {v.variant_id: v.name for v in variants}
    want = {v: set(fs) for v, fs in fixtures_for.items()}
    out: dict = {}
    for h, fp, sk, v, f, inh in zip(*(cols[c] for c in ("host", "fingerprint_id", "session_key", "variant_id",
                                                           "fixture_id", "inherited"))):
        if inh is not None and h in sel and (fp, sk) == tuple(sel[h]) and f in want.get(v, ()):
            out.setdefault(h, {})[names[v]] = inh
    return out


def mark_inherited(result: EquivResult, inherited: dict) -> EquivResult:
    """`result` with its hosts' inherited rows named: `inherited`, each class row's `inherited_hosts` and each
    variant's class `inherited` (only where a host inherited: an analysis without any reads as before)."""
    result.inherited = inherited
    for row in result.class_rows:
        hosts = [h for h in row["hosts"] if row["variant"] in inherited.get(h, {})]
        if hosts:
            row["inherited_hosts"] = hosts
    for v in result.variants:
        for c in v["classes"]:
            hosts = [h for h in c["hosts"] if v["variant"] in inherited.get(h, {})]
            if hosts:
                c["inherited"] = hosts
    return result


def _named_cannot(cannot: dict, variants: list) -> dict:
    """{host: {variant name: why}} for the result and the report."""
    names = {v.variant_id: v.name for v in variants}
    out: dict = {}
    for (h, vid), why in sorted(cannot.items()):
        out.setdefault(h, {})[names.get(vid, vid)] = why
    return out


def _payload(result: EquivResult, boxed: dict) -> dict:
    """What the cache keeps of a result: all but the decisions rows (rebuilt from the decoded decisions)."""
    return {"equiv_id": result.equiv_id, "settings": result.settings, "hosts": result.hosts,
            "variants": result.variants, "comparisons": result.comparisons, "class_rows": result.class_rows,
            "flip_rows": result.flip_rows, "sidecars": result.sidecars,
            "decoded": {"keys": [[h, v, f, boxed[(h, v, f)]] for h, v, f in result.decoded],
                        "arrays": {k: RC.arrays_to_json([getattr(d, k) for d in result.decoded.values()])
                                   for k in _SLIM_FIELDS},
                        "text": [d.text for d in result.decoded.values()]}}


_SLIM_FIELDS = ("slot", "cls", "score", "kept", "margin", "box")
_PAYLOAD_TYPES = {"equiv_id": str, "settings": dict, "hosts": dict, "variants": list, "comparisons": list,
                  "class_rows": list, "flip_rows": list, "sidecars": dict, "decoded": dict}


def _from_payload(payload, ctx: _Context, by_model: dict, fixtures_for: dict) -> EquivResult | None:
    """The result a cache payload holds, checked; None when it is not a well-formed one (then recomputed)."""
    if payload is None:
        return None
    try:
        if any(not isinstance(payload.get(k), t) for k, t in _PAYLOAD_TYPES.items()):
            return None
        if not all(isinstance(r, dict) for k in ("variants", "comparisons") for r in payload[k]):
            return None
        if not (RC.rows_typed("classes", payload["class_rows"]) and RC.rows_typed("flips", payload["flip_rows"])):
            return None
        if payload["equiv_id"] != ctx.equiv_id:
            return None
        keys, arrays = payload["decoded"].get("keys"), payload["decoded"].get("arrays")
        if not (isinstance(keys, list) and isinstance(arrays, dict) and set(arrays) == set(_SLIM_FIELDS)):
            return None
        cols = {k: RC.arrays_from_json(arrays[k], len(keys)) for k in _SLIM_FIELDS}
        texts = payload["decoded"].get("text", [None] * len(keys))
        if not (isinstance(texts, list) and len(texts) == len(keys) and all(
                t is None or (isinstance(t, list) and all(isinstance(x, str) for x in t)) for t in texts)):
            return None
        decoded, boxed = {}, {}
        for i, e in enumerate(keys):
            h, v, f, b = e
            if not (isinstance(h, str) and isinstance(v, str) and isinstance(f, str) and isinstance(b, bool)
                    and all(cols[k][i] is not None for k in _SLIM_FIELDS[:-1])):   # only a box may be absent
                return None
            decoded[(h, v, f)] = Decoded(**{k: cols[k][i] for k in _SLIM_FIELDS}, text=texts[i])
            boxed[(h, v, f)] = b
        variants = payload["variants"]
        rows = _StoredDecisions(lambda: _rebuild_decisions(ctx, by_model, fixtures_for, variants,
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


def _rebuild_decisions(ctx: _Context, by_model: dict, fixtures_for: dict, variants: list, flip_rows: list,
                       decoded: dict, boxed: dict) -> list:
    """The decisions rows of a reused result, in the order and with the values the analysis made them."""
    rows: list = []
    info = {v["variant_id"]: v for v in variants}
    for model, vs in by_model.items():
        for v in vs:
            dd = info[v.variant_id].get("decode") or {}
            if not kind_of(dd["kind"]).decides:
                continue
            class_name = DecodeSpec(kind=dd["kind"], outputs={}, classes=dd.get("classes") or []).class_name
            flip_of = {(r["comparison"], r["host"], r["fixture_id"], r["slot"]): r["kind"] for r in flip_rows
                       if r["variant_id"] == v.variant_id and r["slot"] >= 0}
            _decision_rows(ctx, class_name, v, sorted(fixtures_for[v.variant_id]), flip_of, decoded, boxed, rows)
    return rows


def _fp32_of(vs: list[VariantRef]) -> VariantRef | None:
    """The model's fp32 reference; None when none was given (an already-quantized model alone)."""
    return next((v for v in vs if v.name == "fp32"), None)


def _base_of(vs: list[VariantRef]) -> VariantRef:
    """The variant whose sidecar and fixtures stand for the model: its fp32, else its first variant."""
    return _fp32_of(vs) or vs[0]


def _check_request(hosts, variants, reference) -> tuple[list, str, dict]:
    """(hosts without repeats, the reference host, {model: [VariantRef]}); refuses what cannot be analysed."""
    hosts = list(dict.fromkeys(hosts))
    reference = reference or hosts[0]
    if reference not in hosts:
        raise ParameterError("reference", f"not one of the hosts {','.join(hosts)}", reference)
    by_model: dict = defaultdict(list)
    for v in variants:
        by_model[v.model].append(v)
    return hosts, reference, by_model   # a model without fp32: flips count against it on the reference host


def _settings(hosts, reference, decode_kind, threshold, variants, fixtures_for, duplicates, specs) -> dict:
    """What determines the tables' rows (hashed into the analysis id); gate settings only change verdicts."""
    settings = {"hosts": hosts, "reference": reference, "decode": decode_kind, "threshold": threshold,
                "variants": [{"name": v.name, "variant_id": v.variant_id, "model": v.model, "path": v.path,
                              **({"session_requirements": v.requirements} if v.requirements else {})}
                             for v in variants],
                "fixtures": {v.variant_id: sorted(fixtures_for[v.variant_id]) for v in variants}}
    if duplicates:   # only when there are some: an analysis without duplicates keeps its id
        settings["duplicates"] = sorted((dict(d) for d in duplicates), key=lambda d: (d["model"], d["name"]))
    plugin_ids = {m: sp.as_dict()["plugin"] for m, sp in specs.items() if sp.decoder_kind.plugin}
    if plugin_ids:   # the plug-in's code decides the rows: its file hash is part of the analysis id
        settings["decode_plugins"] = plugin_ids
    return settings


def _host_identities(hosts, sel, tables_root) -> tuple[dict, dict]:
    """Per host, the selected fingerprint's summary and its fingerprint features (read from the hosts table)."""
    cols = ["host", "fingerprint_id", "kind", "arch", "cpu", "isa_flags", "ort_version", "fingerprint"]
    rows = {(r["host"], r["fingerprint_id"]): r
            for r in load_hosts(host=hosts, tables_root=tables_root, columns=cols).to_pylist()}
    host_info, features = {}, {}
    for h in hosts:
        host_info[h], features[h] = _host_identity(rows.get((h, sel[h][0]), {}), sel[h])
    return host_info, C.without_mask_cpu(features, {h: i.get("cpu_mechanism", "") for h, i in host_info.items()})


def _host_identity(r: dict, selected) -> tuple[dict, dict]:
    """One hosts-table row -> (summary for the report, fingerprint features that may separate classes)."""
    fp = json.loads(r.get("fingerprint") or "{}")
    ident = fp.get("identity", {})
    info = {"fingerprint_id": selected[0], "session_key": selected[1], "kind": r.get("kind", ""),
            "arch": r.get("arch", ""), "cpu": r.get("cpu", ""), "ort_version": r.get("ort_version", ""),
            "isa_flags": list(r.get("isa_flags") or []), "session": ident.get("session") or {},
            # how the CPU was shown: "real", "qemu" or "native-masked" (the fingerprint's word; "" before it had one)
            "cpu_mechanism": ident.get("cpu_mechanism", "")}
    vectors = {k: ident[k] for k in C.VECTOR_FEATURES if k in ident}   # aarch64: SVE/SME lengths, in bits
    info.update(vectors)
    if (fp.get("imported_from") or {}).get("split_from"):  # an imported host whose files ran on several CPUs
        info["split_from"] = fp["imported_from"]["split_from"]
    rest = {k: v for k, v in ident.items() if k not in ("cpu", "isa_flags", "numpy_cpu_features", "session",
                                                        "session_readback", "onnxruntime", "arch", *vectors)}
    rest["onnxruntime_build"] = ident.get("onnxruntime", {}).get("build_info", "")
    sess = dict(ident.get("session") or {})
    sess.update(sess.pop("config_entries", {}) or {})
    return info, C.fingerprint_features(r.get("arch"), r.get("cpu"), r.get("isa_flags") or [],
                                        r.get("ort_version"), sess, rest, vectors)


def _kernels_used(hosts, sel, host_info, variant_ids, tables_root) -> dict:
    """{variant_id: {host: {ISA flag: [families]}}}: the dispatch features each host's kernels used running the
    variant, from the qemu kernel evidence (`localize --evidence`) taken under the selected fingerprint."""
    cols = ["host", "fingerprint_id", "variant_id", "family", "sites"]
    t = partread.read("evidence", root=tables_root, columns=cols, filter={"host": sorted(sel), "variant_id": variant_ids})
    seen: dict = defaultdict(lambda: defaultdict(set))
    for h, fp, vid, fam, sites in zip(*(t.column(c).to_pylist() for c in cols)):
        if h in sel and fp == sel[h][0] and vid in variant_ids and sites:
            seen[vid][h].add(fam)
    return {vid: {h: used_features(fams, host_info[h]["isa_flags"]) for h, fams in sorted(by_host.items())}
            for vid, by_host in sorted(seen.items())}


def _fixture_geometry(fixture_ids, tables_root) -> dict:
    """{fixture_id: the geometry its row records (preprocess.Geometry.as_dict)}; fixtures without one left out."""
    ft = partread.read("fixtures", root=tables_root, columns=["fixture_id", "geometry"],
                       filter={"fixture_id": sorted(fixture_ids)})
    return {f: json.loads(g) for f, g in zip(ft.column("fixture_id").to_pylist(), ft.column("geometry").to_pylist())
            if g}


def _fixture_sources(tables_root) -> dict:
    ft = partread.read("fixtures", root=tables_root, columns=["fixture_id", "source"])
    return dict(zip(ft.column("fixture_id").to_pylist(), ft.column("source").to_pylist()))


@dataclass
class _Context:
    """What every variant of the analysis shares."""

    equiv_id: str
    hosts: list
    reference: str
    sel: dict            # host -> (fingerprint_id, session_key)
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
class _Rows:
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

    def arrays(self, h, vid, f) -> dict:
        return self.data[(h, vid)][f][0]

    def decoded(self, h, vid, f):
        arrs, shas = self.data[(h, vid)][f]
        key = (vid, f, tuple(sorted(shas.items())))
        if key not in self.cache:
            try:
                self.cache[key] = decode(self.spec, arrs, self.geometry.get(f))
            except UserError as exc:
                raise UserError(f"model {self.model}: {marked(exc)}; or {NONE_HINT}") from None
        return self.cache[key]


def _load_model(ctx: _Context, model, vs, spec, fixtures_for, tables_root) -> _ModelRun:
    """Read one model's selected outputs and fit its decoder to them; a decoder that does not fit fails here."""
    fp32, base = _fp32_of(vs), _base_of(vs)
    fx_ids = sorted(fixtures_for[base.variant_id])
    data = _load_arrays(ctx.hosts, ctx.sel, vs,
                        {f for v in vs for f in fixtures_for[v.variant_id]}, tables_root)
    fit_host, fit_vid = _fit_pair(ctx, base, vs)
    first = data[(fit_host, fit_vid)][sorted(fixtures_for[fit_vid])[0]][0]
    compared = spec.decoder_kind.decides
    try:
        spec = check_outputs(spec, sorted(first))
    except UserError as exc:
        raise UserError(f"model {model}: {marked(exc)}; or {NONE_HINT}") from None
    run = _ModelRun(model=model, fp32=fp32, data=data, spec=spec, compared=compared)
    if compared and spec.decoder_kind.takes_geometry:
        run.geometry = _fixture_geometry({f for v in vs for f in fixtures_for[v.variant_id]}, tables_root)
    if compared:
        run.decoded(fit_host, fit_vid, sorted(fixtures_for[fit_vid])[0])   # a decoder that does not fit fails first
    return run


def _fit_pair(ctx: _Context, base: VariantRef, vs: list) -> tuple[str, str]:
    """The (host, variant_id) whose outputs the decoder is fitted to: the base variant on the reference host, else
    the first variant and host (reference first) whose runtime ran it."""
    pairs = [(h, v.variant_id) for v in [base, *vs] for h in [ctx.reference, *ctx.hosts]]
    ran = [p for p in pairs if p not in ctx.cannot]
    if not ran:
        raise UserError(f"model {vs[0].model}: no host can run any of its variants "
                        f"({', '.join(sorted({why for (_, _), why in ctx.cannot.items()}))})")
    return ran[0]


def _analyze_variant(ctx: _Context, run: _ModelRun, v: VariantRef, vfx: list, out: _Rows) -> None:
    """Classes, distances, comparisons and decisions of one variant, appended to `out` (over the hosts whose
    runtime can run it)."""
    ctx = dataclasses.replace(ctx, hosts=[h for h in ctx.hosts if (h, v.variant_id) not in ctx.cannot])
    eq, vinfo = _classes_and_distances(ctx, run, v, vfx)
    out.variants.append(vinfo)
    out.class_rows += _class_rows(ctx, run.model, v, eq, vinfo)
    flip_of = {}  # (comparison, host, fixture, slot) -> kind, for the decisions table
    for h in ctx.hosts:
        for comp, rh, rvid in _comparison_pairs(ctx.reference, run.fp32, v, h):
            if (rh, rvid) in ctx.cannot:   # its own fp32 does not run there: nothing to compare with
                continue
            comparison, flips = _compare(ctx, run, v, vfx, comp, h, rh, rvid)
            out.comparisons.append(comparison)
            for f, fl in flips:
                if fl.slot >= 0:
                    flip_of[(comp, h, f, fl.slot)] = fl.kind
                out.flip_rows.append(_flip_row(ctx, run.spec, v, comparison, f, fl))
    if run.compared:
        _decisions(ctx, run, v, vfx, flip_of, out)


def _classes_and_distances(ctx: _Context, run: _ModelRun, v: VariantRef, vfx: list) -> tuple[list, dict]:
    """The variant's equivalence classes and its summary: agreement, separating features, distances."""
    hosts, reference = ctx.hosts, ctx.reference
    hh = {h: {(f, o): s for f in vfx for o, s in run.data[(h, v.variant_id)][f][1].items()} for h in hosts}
    eq = C.equivalence_classes(hh)
    class_of = {h: c.label for c in eq for h in c.hosts}
    agree = C.fixture_agreement(hh)
    float_only = _float_only(v)
    separation = C.separation({h: ctx.features[h] for h in hosts}, class_of, ctx.used.get(v.variant_id), float_only)
    sep = separation.pop("smallest")
    pairs = C.pair_separation({h: ctx.features[h] for h in hosts}, class_of, agree, ctx.used.get(v.variant_id),
                              float_only) if C.needs_pairs(sep, len(eq)) else []
    vinfo = {"variant": v.name, "variant_id": v.variant_id, "model": run.model, "fixtures": len(vfx),
             "session_requirements": dict(v.requirements),
             "classes": [c.as_dict() for c in eq],
             "agreement": [{"a": a, "b": b, "fixtures_agree": n} for (a, b), n in agree.items()],
             "separating_features": sep, "separation": separation, "pairs": pairs,
             "distances": _class_distances(ctx, run, v, vfx, eq, class_of.get(reference)),
             "versions": C.version_findings({h: ctx.features[h] for h in hosts}, class_of),
             "providers": {h: ctx.providers.get(h, {}).get(v.variant_id, {}) for h in hosts},
             "feature_values": {h: {k: ctx.features[h].get(k, False if k.startswith("isa:") else None)
                                    for k in dict.fromkeys([*(sep or []), *separation["features"]])}
                                for h in hosts}}
    return eq, vinfo


def _float_only(v: VariantRef) -> bool:
    """Whether the variant runs no integer kernel (no quantized op in its graph; unknown without its file: False)."""
    if not v.path or not Path(v.path).is_file():
        return False
    return not quantized_ops(load_model(v.path, check=False, load_external_data=False))


def _class_distances(ctx: _Context, run: _ModelRun, v: VariantRef, vfx: list, eq: list, ref_label) -> list[dict]:
    """Per class other than the reference's, per output: the numeric distance of its first host to the reference
    (none when the reference host cannot run the variant: `ref_label` None)."""
    reference = ctx.reference
    dists: list = []
    if ref_label is None:
        return dists
    for c in eq:
        if c.label == ref_label:
            continue
        rep = c.hosts[0]
        accs: dict = defaultdict(DistanceAccumulator)
        for f in vfx:
            ra, ca = run.arrays(reference, v.variant_id, f), run.arrays(rep, v.variant_id, f)
            for o in sorted(ra):
                if o in ca and ra[o].shape == ca[o].shape and ra[o].dtype == ca[o].dtype:
                    accs[o].add(ra[o], ca[o])
        for o, acc in sorted(accs.items()):
            dists.append({"class": c.label, "host": rep, "ref_class": ref_label, "ref_host": reference,
                          "output": o, **acc.result().as_dict()})
    return dists


def _class_rows(ctx: _Context, model: str, v: VariantRef, eq: list, vinfo: dict) -> list[dict]:
    """The `classes` table rows of one variant."""
    return [{"equiv_id": ctx.equiv_id, "variant_id": v.variant_id, "variant": v.name, "model": model,
             "class_label": c.label, "hosts": c.hosts, "fingerprint_ids": [ctx.sel[h][0] for h in c.hosts],
             "digest": c.digest, "fixtures": vinfo["fixtures"], "reference": ctx.reference in c.hosts,
             "separating_features": vinfo["separating_features"], "agreement": canonical_json(vinfo["agreement"]),
             "distance": canonical_json([d for d in vinfo["distances"] if d["class"] == c.label]),
             "provider_findings": PR.class_findings(ctx.providers, v.variant_id, c.hosts),
             "placements": canonical_json(PR.class_placements(ctx.providers, v.variant_id, c.hosts)),
             "settings": canonical_json({**ctx.settings, "selections": {h: list(x) for h, x in ctx.sel.items()}})}
            for c in eq]


def _comparison_pairs(reference: str, fp32: VariantRef, v: VariantRef, h: str) -> list[tuple[str, str, str]]:
    """(comparison, reference host, reference variant_id) for variant `v` on host `h` (without fp32: ref-same only)."""
    if fp32 is None:
        return [("ref-same", reference, v.variant_id)] if h != reference else []
    pairs = []
    if v.name != "fp32":
        pairs.append(("own-fp32", h, fp32.variant_id))
    if h != reference:
        pairs.append(("ref-fp32", reference, fp32.variant_id))
        if v.name != "fp32":
            pairs.append(("ref-same", reference, v.variant_id))
    return pairs


def _compare(ctx: _Context, run: _ModelRun, v: VariantRef, vfx: list, comp, h, rh, rvid) -> tuple[dict, list]:
    """One comparison of `v` on `h` against `rvid` on `rh`: (its summary with both gates, [(fixture, Flip)])."""
    rname = "fp32" if run.fp32 is not None and rvid == run.fp32.variant_id else v.name
    per_fx, flips, tgate = [], [], G.TensorGate()
    for f in vfx:
        tgate.add_fixture(run.arrays(rh, rvid, f), run.arrays(h, v.variant_id, f), ctx.atol, ctx.rtol)
        if not run.compared:
            continue
        fc = D.compare(run.spec, run.decoded(rh, rvid, f), run.decoded(h, v.variant_id, f))
        per_fx.append(fc)
        flips += [(f, fl) for fl in fc.flips]
    if not run.compared:
        return _not_compared(comp, h, v.name, rh, rname, len(vfx), v.variant_id, run.model, tgate), flips
    s = D.summarize(comp, h, v.name, rh, rname, per_fx, run.spec.threshold, D.flip_kinds(run.spec),
                    totals_fixed=run.spec.decoder_kind.totals_fixed(run.spec.threshold),
                    margin_kinds=run.spec.decoder_kind.margin_flips)
    dec_ok = G.decision_passed(s.flips, ctx.budget, s.ref_total)
    return {**s.as_dict(), "variant_id": v.variant_id, "model": run.model, "tensor_gate": tgate.as_dict(),
            "decision_passed": dec_ok, "gates_disagree": G.disagreement(tgate.passed, dec_ok),
            "decisions_compared": True}, flips


def _flip_row(ctx: _Context, spec: DecodeSpec, v: VariantRef, comparison: dict, f: str, fl) -> dict:
    """One `flips` table row."""
    return {"equiv_id": ctx.equiv_id, "comparison": comparison["comparison"], "host": comparison["host"],
            "variant_id": v.variant_id, "variant": v.name, "ref_host": comparison["ref_host"],
            "ref_variant": comparison["ref_variant"], "fixture_id": f, "source": ctx.source.get(f, ""),
            "ref_slot": fl.ref_slot, "slot": fl.slot, "kind": fl.kind,
            "ref_class": spec.class_name(fl.ref_cls) if fl.ref_text is None else fl.ref_text,
            "class_name": spec.class_name(fl.cls) if fl.text is None else fl.text, "ref_score": fl.ref_score,
            "score": fl.score, "iou": fl.iou,
            "threshold": spec.threshold, "margin": fl.margin, "band": D.band_label(abs(fl.margin))}


def _decisions(ctx: _Context, run: _ModelRun, v: VariantRef, vfx: list, flip_of: dict, out: _Rows) -> None:
    """Every decoded decision of `v` on every host: the slim decoded decisions and `decisions` table rows."""
    for h in ctx.hosts:
        for f in vfx:
            d = run.decoded(h, v.variant_id, f)
            out.decoded[(h, v.variant_id, f)] = _slim(d)
            out.boxed[(h, v.variant_id, f)] = getattr(d, "box", None) is not None
    _decision_rows(ctx, run.spec.class_name, v, vfx, flip_of, out.decoded, out.boxed, out.decision_rows)


def _decision_rows(ctx: _Context, class_name, v: VariantRef, vfx: list, flip_of: dict, decoded: dict,
                   boxed: dict, rows: list) -> None:
    """The `decisions` rows of `v` on every host, from the slim decoded decisions (a region's box is not a row's:
    `boxed` says which decisions had boxes of their own), appended to `rows`; `class_name`: the decode
    spec's (DecodeSpec.class_name)."""
    names: dict = {}   # class id -> name, asked of the spec once
    for h in ctx.hosts:
        for f in vfx:
            d = decoded[(h, v.variant_id, f)]
            # whole arrays to Python values at once: the same ints, floats and bools as int()/float()/bool()
            slots, cls = np.asarray(d.slot, np.int64).tolist(), np.asarray(d.cls, np.int64).tolist()
            score, margin = np.asarray(d.score, np.float64).tolist(), np.asarray(d.margin, np.float64).tolist()
            kept = np.asarray(d.kept, bool).tolist()
            boxes = np.asarray(d.box, np.float64).tolist() if boxed[(h, v.variant_id, f)] else None
            text = getattr(d, "text", None)   # ctc: each decision's name is its string
            src = ctx.source.get(f)
            for i, q in enumerate(slots):
                c = cls[i]
                if c not in names:
                    names[c] = class_name(c)
                rows.append({
                    "equiv_id": ctx.equiv_id, "host": h, "fingerprint_id": ctx.sel[h][0],
                    "variant_id": v.variant_id, "variant": v.name, "fixture_id": f, "source": src,
                    "slot": q, "class_id": c, "box": None if boxes is None else boxes[i],
                    "class_name": names[c] if text is None else text[i], "score": score[i], "kept": kept[i],
                    "margin": margin[i],
                    "flip_own_fp32": flip_of.get(("own-fp32", h, f, q), ""),
                    "flip_ref_fp32": flip_of.get(("ref-fp32", h, f, q), "")})


def _slim(d):
    """The decisions without a map's per-element arrays (a region's box stands for it)."""
    box = d.box
    if box is None and d.labels is not None and d.slot.size:
        planes = d.labels.reshape(-1, *d.labels.shape[-2:])
        h, w = planes.shape[-2:]
        _, ys, xs = np.nonzero(planes)
        lab = planes[planes > 0] - 1            # same (plane, row, col) order as np.nonzero
        n = d.slot.size
        lo_x, lo_y = np.full(n, np.inf), np.full(n, np.inf)
        hi_x, hi_y = np.full(n, -np.inf), np.full(n, -np.inf)
        np.minimum.at(lo_x, lab, xs)
        np.minimum.at(lo_y, lab, ys)
        np.maximum.at(hi_x, lab, xs + 1)
        np.maximum.at(hi_y, lab, ys + 1)
        box = np.stack([lo_x / w, lo_y / h, hi_x / w, hi_y / h], axis=1)   # normalised to the map
    return Decoded(slot=d.slot, cls=d.cls, score=d.score, kept=d.kept, margin=d.margin, box=box,
                   text=getattr(d, "text", None))


def _not_compared(comp, host, variant, ref_host, ref_variant, fixtures, variant_id, model, tgate) -> dict:
    """A comparison under decode none: the tensor gate only; every decision figure None, not zero."""
    keys = D.ComparisonSummary.__dataclass_fields__
    return {**{k: None for k in keys}, "comparison": comp, "host": host, "variant": variant, "ref_host": ref_host,
            "ref_variant": ref_variant, "fixtures": fixtures, "concealed": False, "margins": {}, "variant_id": variant_id,
            "model": model, "tensor_gate": tgate.as_dict(), "decision_passed": None, "gates_disagree": "",
            "decisions_compared": False}


# --------------------------------------------------------------------------- re-analysis


def last_equiv(results) -> dict:
    """The summary the last `quantbench equiv` wrote into `results` (equiv.json: its id, settings, labels), or {}."""
    p = Path(results) / "equiv.json"
    if not p.exists():
        return {}
    try:
        data = json.loads(p.read_text())
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
    ct = partread.read("classes", root=root, columns=["equiv_id", "settings"])
    settings_of = dict(zip(ct.column("equiv_id").to_pylist(), ct.column("settings").to_pylist()))
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


def _recorded_refs(st: dict, root: Path) -> list[VariantRef]:
    """The analysed variants as the models table records them, each with the sidecar its recipe carries."""
    models = {r["variant_id"]: r for r in partread.read("models", root=root).to_pylist()}
    refs = []
    for v in st["variants"]:
        recipe = json.loads((models.get(v["variant_id"]) or {}).get("recipe") or "{}")
        allow_recorded(recipe)   # the plug-ins calibrate ran, unchanged, run again
        sidecar = sidecar_for(Variant(name=v["name"], path=Path(v.get("path") or ""), model=v["model"], recipe=recipe))
        refs.append(VariantRef(name=v["name"], variant_id=v["variant_id"], model=v["model"], sidecar=sidecar,
                               path=v.get("path", ""), requirements=dict(v.get("session_requirements") or {})))
    return refs


def reanalyze(results, equiv_id: str | None = None) -> Reanalysis:
    """The analysis `equiv_id` (a prefix; None: the last equiv's, else the only one) computed again from the
    tables under `results`/tables, with the settings it was run with (its gates too when it was the last equiv)."""
    results = Path(results)
    root = results / "tables"
    last = last_equiv(results)
    eid, st = _pick_analysis(root, equiv_id or last.get("equiv_id"))
    refs = _recorded_refs(st, root)
    if is_plugin(st["decode"]):   # named on that equiv's command line, read back from a table: ask again
        require(st["decode"], f"{root}/classes (analysis {eid[:12]}): decode")
    prefer = {h: tuple(x) for h, x in st["selections"].items()}
    # gate settings are not part of the analysis id: take the last run's when it is this analysis
    gs = (last.get("settings") or {}) if last.get("equiv_id") == eid else {}
    check_writable(results, "the report is written into the results folder")
    result = analyze(st["hosts"], refs, st["fixtures"], reference=st["reference"], decode_kind=st["decode"],
                     threshold=st["threshold"], atol=gs.get("atol", G.DEFAULT_ATOL),
                     rtol=gs.get("rtol", G.DEFAULT_RTOL), budget=gs.get("budget", G.DEFAULT_BUDGET),
                     prefer=prefer, tables_root=root, duplicates=st.get("duplicates"),
                     cache_dir=RC.cache_dir_of(results))
    result.settings["gates"] = list(gs.get("gates") or [])   # the verdict states the gates that analysis was run with
    return Reanalysis(result, (last.get("labels") or {}) if last.get("equiv_id") == eid else {})


def write_tables(result: EquivResult, tables_root) -> list:
    """Append the classes, decisions and flips rows; returns the part paths (rows stored before are not rewritten)."""
    paths = []
    for name, rows in (("classes", result.class_rows), ("decisions", result.decision_rows),
                       ("flips", result.flip_rows)):
        compaction.maybe_compact(name, tables_root)  # before the append: the part named below stays
        p = partwrite.append(name, rows, root=tables_root, ledger=True, made_from=result.cache_key or None)
        if p is not None:
            paths.append(p)
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
