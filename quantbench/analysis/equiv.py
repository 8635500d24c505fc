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
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from quantbench.analysis import classes as C
from quantbench.analysis import decisions as D
from quantbench.analysis import gates as G
from quantbench.analysis.decode import DecodeSpec, check_outputs, decode, spec_from_sidecar
from quantbench.analysis.precision import DistanceAccumulator
from quantbench.errors import UserError
from quantbench.fsutil import canonical_json

COMPARISONS = ("own-fp32", "ref-fp32", "ref-same")


@dataclass
class VariantRef:
    """What the analysis needs of a variant: name, semantic id, source model, its sidecar, run hint."""

    name: str
    variant_id: str
    model: str
    sidecar: dict | None
    path: str = ""


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

    def gate_failures(self, names) -> list[str]:
        """One message per failed named gate condition."""
        out = []
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
                    out.append(f"decision: {where}: {c['flips']} flips > budget {self.settings['budget']}")
        return out

    def summary(self) -> dict:
        return {"equiv_id": self.equiv_id, "settings": self.settings, "hosts": self.hosts,
                "variants": self.variants, "comparisons": self.comparisons}


def _fits(input_name: str, shape, inputs: dict) -> bool:
    dims = inputs.get(input_name)
    if dims is None or len(inputs) != 1:
        return False
    return len(dims) == len(shape) and all(d in (None, 0) or d == s for d, s in zip(dims, shape))


def _run_hint(host: str, variant: VariantRef, hint: str) -> str:
    return f"`quantbench run --hosts {host} --variants {variant.path or variant.name}{hint}`"


def select_results(hosts, variants, fixtures_for, prefer=None, run_hint: str = "", tables_root=None) -> dict:
    """Per host, the (fingerprint_id, session_key) whose results cover every variant x fixture.

    Preference: the combination this run produced (`prefer`), else the only
    complete one. A host without complete results names the run that would
    produce them; a fixture present under another input hash is refused.
    """
    from quantbench.hosts.results import load_outputs

    vids = [v.variant_id for v in variants]
    t = load_outputs(host=list(hosts), variant_id=vids, tensors=False, tables_root=tables_root)
    cols = {c: t.column(c).to_pylist() for c in ("host", "fingerprint_id", "session_key", "variant_id", "fixture_id")}
    have: dict = defaultdict(lambda: defaultdict(set))
    for h, fp, sk, v, f in zip(cols["host"], cols["fingerprint_id"], cols["session_key"], cols["variant_id"],
                               cols["fixture_id"]):
        have[h][(fp, sk)].add((v, f))
    need = {(v.variant_id, f) for v in variants for f in fixtures_for[v.variant_id]}
    chosen = {}
    for h in hosts:
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
                                f"without --no-run so this run's session decides")
        if pick is None:
            best = max(combos.values(), key=len, default=set())
            missing = sorted(need - best)
            _refuse_rehashed(h, missing, combos, tables_root)
            by_var = defaultdict(int)
            for vid, _ in missing:
                by_var[vid] += 1
            v0 = next(v for v in variants if v.variant_id in by_var)
            what = ", ".join(f"{v.name} ({by_var[v.variant_id]} fixtures)" for v in variants if v.variant_id in by_var)
            raise UserError(f"host {h}: no results for variant(s) {what}; run {_run_hint(h, v0, run_hint)}")
        chosen[h] = pick
    return chosen


def _refuse_rehashed(host, missing, combos, tables_root) -> None:
    """A missing fixture whose image this host ran under another input hash: refuse, do not compare."""
    from quantbench import tables

    if not missing:
        return
    ft = tables.read("fixtures", root=tables_root, columns=["fixture_id", "source", "image_sha256"])
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


def _load_arrays(hosts, sel, variant_ids, fixture_ids, tables_root) -> dict:
    """{(host, variant_id): {fixture_id: ({output: array}, {output: sha256})}} in one table read."""
    from quantbench.hosts.results import load_outputs, tensor_from_row

    t = load_outputs(host=list(hosts), variant_id=list(variant_ids), fixture_id=sorted(fixture_ids),
                     tables_root=tables_root)
    out: dict = {(h, v): {} for h in hosts for v in variant_ids}
    for r in t.to_pylist():
        h = r["host"]
        if (r["fingerprint_id"], r["session_key"]) != tuple(sel[h]):
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
            rtol: float = G.DEFAULT_RTOL, budget: int = G.DEFAULT_BUDGET, prefer: dict | None = None,
            run_hint: str = "", tables_root=None) -> EquivResult:
    """The whole equivalence analysis; see the module docstring."""
    from quantbench import tables
    from quantbench.hosts.results import load_hosts

    hosts = list(dict.fromkeys(hosts))
    reference = reference or hosts[0]
    if reference not in hosts:
        raise UserError(f"--reference {reference}: not one of --hosts {','.join(hosts)}")
    if budget < 0:
        raise UserError(f"--budget {budget}: must be at least 0")
    by_model: dict = defaultdict(list)
    for v in variants:
        by_model[v.model].append(v)
    for model, vs in by_model.items():
        if not any(v.name == "fp32" for v in vs):
            raise UserError(f"model {model}: no fp32 variant among --variants ({', '.join(v.name for v in vs)}); "
                            f"decisions flip against fp32, so pass the fp32 model too")
    sel = select_results(hosts, variants, fixtures_for, prefer, run_hint, tables_root)
    # what determines the tables' rows; gate settings (atol, rtol, budget) only change verdicts
    settings = {"hosts": hosts, "reference": reference, "decode": decode_kind, "threshold": threshold,
                "variants": [{"name": v.name, "variant_id": v.variant_id, "model": v.model, "path": v.path}
                             for v in variants],
                "fixtures": {v.variant_id: sorted(fixtures_for[v.variant_id]) for v in variants}}
    eid = equiv_id_of(settings, sel)
    gate_settings = {"atol": atol, "rtol": rtol, "budget": budget}

    ht = load_hosts(host=hosts, tables_root=tables_root).to_pylist()
    host_rows = {(r["host"], r["fingerprint_id"]): r for r in ht}
    host_info, features = {}, {}
    for h in hosts:
        r = host_rows.get((h, sel[h][0]), {})
        fp = json.loads(r.get("fingerprint") or "{}")
        ident = fp.get("identity", {})
        host_info[h] = {"fingerprint_id": sel[h][0], "session_key": sel[h][1], "kind": r.get("kind", ""),
                        "arch": r.get("arch", ""), "cpu": r.get("cpu", ""), "ort_version": r.get("ort_version", ""),
                        "isa_flags": list(r.get("isa_flags") or [])}
        rest = {k: v for k, v in ident.items() if k not in ("cpu", "isa_flags", "numpy_cpu_features", "session",
                                                            "session_readback", "onnxruntime", "arch")}
        rest["onnxruntime_build"] = ident.get("onnxruntime", {}).get("build_info", "")
        sess = dict(ident.get("session") or {})
        sess.update(sess.pop("config_entries", {}) or {})
        features[h] = C.fingerprint_features(r.get("arch"), r.get("cpu"), r.get("isa_flags") or [],
                                             r.get("ort_version"), sess, rest)

    ft = tables.read("fixtures", root=tables_root, columns=["fixture_id", "source"])
    source = dict(zip(ft.column("fixture_id").to_pylist(), ft.column("source").to_pylist()))

    variant_out, comparisons, class_rows, decision_rows, flip_rows = [], [], [], [], []
    for model, vs in by_model.items():
        fp32 = next(v for v in vs if v.name == "fp32")
        fx_ids = sorted(fixtures_for[fp32.variant_id])
        data = _load_arrays(hosts, sel, [v.variant_id for v in vs],
                            {f for v in vs for f in fixtures_for[v.variant_id]}, tables_root)
        first = data[(reference, fp32.variant_id)][fx_ids[0]][0]
        spec = spec_from_sidecar(fp32.sidecar, decode_kind, threshold, source=f"model {model} sidecar")
        spec = check_outputs(spec, sorted(first))
        decoded_cache: dict = {}

        def decoded(h, vid, f):
            arrs, shas = data[(h, vid)][f]
            key = (vid, f, tuple(sorted(shas.items())))
            if key not in decoded_cache:
                decoded_cache[key] = decode(spec, arrs)
            return decoded_cache[key]

        for v in vs:
            vfx = sorted(fixtures_for[v.variant_id])
            hh = {h: {(f, o): s for f in vfx for o, s in data[(h, v.variant_id)][f][1].items()} for h in hosts}
            eq = C.equivalence_classes(hh)
            class_of = {h: c.label for c in eq for h in c.hosts}
            agree = C.fixture_agreement(hh)
            sep = C.separating_features({h: features[h] for h in hosts}, class_of)
            ref_label = class_of[reference]
            dists = []
            for c in eq:
                if c.label == ref_label:
                    continue
                rep = c.hosts[0]
                accs: dict = defaultdict(DistanceAccumulator)
                for f in vfx:
                    ra = data[(reference, v.variant_id)][f][0]
                    ca = data[(rep, v.variant_id)][f][0]
                    for o in sorted(ra):
                        if o in ca and ra[o].shape == ca[o].shape and ra[o].dtype == ca[o].dtype:
                            accs[o].add(ra[o], ca[o])
                for o, acc in sorted(accs.items()):
                    dists.append({"class": c.label, "host": rep, "ref_class": ref_label, "ref_host": reference,
                                  "output": o, **acc.result().as_dict()})
            vinfo = {"variant": v.name, "variant_id": v.variant_id, "model": model, "fixtures": len(vfx),
                     "classes": [c.as_dict() for c in eq],
                     "agreement": [{"a": a, "b": b, "fixtures_agree": n} for (a, b), n in agree.items()],
                     "separating_features": sep, "distances": dists,
                     "feature_values": {h: {k: features[h].get(k, False if k.startswith("isa:") else None)
                                            for k in (sep or [])} for h in hosts}}
            variant_out.append(vinfo)
            for c in eq:
                class_rows.append({
                    "equiv_id": eid, "variant_id": v.variant_id, "variant": v.name, "model": model,
                    "class_label": c.label, "hosts": c.hosts, "fingerprint_ids": [sel[h][0] for h in c.hosts],
                    "digest": c.digest, "fixtures": len(vfx), "reference": reference in c.hosts,
                    "separating_features": sep, "agreement": canonical_json(vinfo["agreement"]),
                    "distance": canonical_json([d for d in dists if d["class"] == c.label]),
                    "settings": canonical_json({**settings, "selections": {h: list(x) for h, x in sel.items()}})})

            flip_of = {}  # (comparison, host, fixture, slot) -> kind, for the decisions table
            for h in hosts:
                pairs = []
                if v.name != "fp32":
                    pairs.append(("own-fp32", h, fp32.variant_id))
                if h != reference:
                    pairs.append(("ref-fp32", reference, fp32.variant_id))
                    if v.name != "fp32":
                        pairs.append(("ref-same", reference, v.variant_id))
                for comp, rh, rvid in pairs:
                    rname = "fp32" if rvid == fp32.variant_id else v.name
                    per_fx, tgate = [], G.TensorGate()
                    for f in vfx:
                        ref_d, cand_d = decoded(rh, rvid, f), decoded(h, v.variant_id, f)
                        fc = D.compare(spec, ref_d, cand_d)
                        per_fx.append(fc)
                        tgate.add_fixture(data[(rh, rvid)][f][0], data[(h, v.variant_id)][f][0], atol, rtol)
                        for fl in fc.flips:
                            if fl.slot >= 0:
                                flip_of[(comp, h, f, fl.slot)] = fl.kind
                            flip_rows.append({
                                "equiv_id": eid, "comparison": comp, "host": h, "variant_id": v.variant_id,
                                "variant": v.name, "ref_host": rh, "ref_variant": rname, "fixture_id": f,
                                "source": source.get(f, ""), "ref_slot": fl.ref_slot, "slot": fl.slot,
                                "kind": fl.kind, "ref_class": spec.class_name(fl.ref_cls),
                                "class_name": spec.class_name(fl.cls), "ref_score": fl.ref_score,
                                "score": fl.score, "iou": fl.iou, "threshold": spec.threshold,
                                "margin": fl.margin, "band": D.band_label(abs(fl.margin))})
                    s = D.summarize(comp, h, v.name, rh, rname, per_fx, spec.threshold)
                    dec_ok = G.decision_passed(s.flips, budget)
                    comparisons.append({**s.as_dict(), "variant_id": v.variant_id, "model": model,
                                        "tensor_gate": tgate.as_dict(), "decision_passed": dec_ok,
                                        "gates_disagree": G.disagreement(tgate.passed, dec_ok)})
            for h in hosts:
                for f in vfx:
                    d = decoded(h, v.variant_id, f)
                    for i in range(d.slot.size):
                        q = int(d.slot[i])
                        decision_rows.append({
                            "equiv_id": eid, "host": h, "fingerprint_id": sel[h][0], "variant_id": v.variant_id,
                            "variant": v.name, "fixture_id": f, "slot": q, "class_id": int(d.cls[i]),
                            "class_name": spec.class_name(int(d.cls[i])), "score": float(d.score[i]),
                            "kept": bool(d.kept[i]), "margin": float(d.margin[i]),
                            "flip_own_fp32": flip_of.get(("own-fp32", h, f, q), ""),
                            "flip_ref_fp32": flip_of.get(("ref-fp32", h, f, q), "")})
        for vi in variant_out[-len(vs):]:
            vi["decode"] = spec.as_dict()
    return EquivResult(equiv_id=eid, settings={**settings, **gate_settings}, hosts=host_info, variants=variant_out,
                       comparisons=comparisons, class_rows=class_rows, decision_rows=decision_rows,
                       flip_rows=flip_rows)


def write_tables(result: EquivResult, tables_root) -> list:
    """Append the classes, decisions and flips rows; returns the part paths (rows stored before are not rewritten)."""
    from quantbench import tables

    paths = []
    for name, rows in (("classes", result.class_rows), ("decisions", result.decision_rows),
                       ("flips", result.flip_rows)):
        tables.maybe_compact(name, tables_root)  # before the append: the part named below stays
        p = tables.append(name, rows, root=tables_root, ledger=True)
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
