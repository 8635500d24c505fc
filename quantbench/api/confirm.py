"""`equiv(confirm=K)`: the run in phases (analysis.confirm says why). The hosts' runs themselves are untouched:
each phase is a runs.runner.run_plan of a sub-plan (some hosts, some variants, some fixtures); a host's results
from an earlier phase are reused by the run's cache."""

from __future__ import annotations

import dataclasses
import sys

from quantbench.analysis import confirm as confirm_choice
from quantbench.analysis.equiv import AnalysisRequest, Selection, analyze
from quantbench.errors import ParameterError, UserError
from quantbench.hosts import fingerprintcache
from quantbench.hosts.keys import run_key
from quantbench.hosts.requirements import host_key
from quantbench.runs.runner import RunSummary
from quantbench.store import partwrite
from quantbench.store.hostresults import load_outputs

ALL = confirm_choice.ALL
DEFAULT_CONFIRM = confirm_choice.DEFAULT_CONFIRM


def check_confirm(confirm) -> int | None:
    """The K of `confirm` (a whole number >= 1: no host inherits unmeasured; or "all": None, every host runs every
    fixture)."""
    if isinstance(confirm, str) and confirm.strip().lower() == ALL:
        return None
    if isinstance(confirm, str) and confirm.strip().isdigit():
        confirm = int(confirm.strip())
    if isinstance(confirm, bool) or not isinstance(confirm, int) or confirm < 1:
        raise ParameterError("confirm", "must be a whole number of fixtures, at least 1, or 'all'", confirm)
    return confirm


def remembered_infos(plan, require_providers: bool) -> dict:
    """host -> what its remembered fingerprint says (arch, ISA flags, vector lengths, onnxruntime) and its session;
    None for a host never fingerprinted under these settings (hosts.fingerprintcache)."""
    out = {}
    for spec, host in zip(plan.specs, plan.hosts):
        try:
            hit = fingerprintcache.remembered(host, plan.sessions[spec.name], require_providers)
        except Exception:   # the cache is an optimisation: an unknown host runs in full
            hit = None
        ident = (hit[0].get("identity") or {}) if hit else None
        out[spec.name] = None if not ident else {
            "arch": ident.get("arch"), "isa_flags": ident.get("isa_flags"), "cpu": ident.get("cpu"),
            "ort_version": (ident.get("onnxruntime") or {}).get("version", ""), "session": plan.sessions[spec.name]}
    return out


def _sub_plan(plan, hosts: list, fixtures_for: dict):
    """The plan for `hosts` only, running `fixtures_for` (variant_id -> fixture ids) only."""
    keep = [i for i, s in enumerate(plan.specs) if s.name in hosts]
    by_id = {fx.fixture_id: fx for fx in plan.fixtures}
    ff = {vid: [by_id[f] for f in fids] for vid, fids in fixtures_for.items() if fids}
    wanted = {fx.fixture_id for fxs in ff.values() for fx in fxs}
    return dataclasses.replace(plan, specs=[plan.specs[i] for i in keep], hosts=[plan.hosts[i] for i in keep],
                               variants=[vi for vi in plan.variants if vi.variant_id in ff], fixtures_for=ff,
                               fixtures=[fx for fx in plan.fixtures if fx.fixture_id in wanted])


def _run_groups(plan, work: dict, run, summaries: list) -> None:
    """Run `work` (host -> {variant_id: fixture ids}), hosts with the same work in one run (they share the cores)."""
    groups: dict = {}
    for h, ff in work.items():
        if ff:
            groups.setdefault(repr(sorted((v, sorted(f)) for v, f in ff.items())), (ff, []))[1].append(h)
    for ff, hosts in groups.values():
        summaries.append(run(_sub_plan(plan, hosts, ff)))


def _merged(summaries: list, order: list):
    """One RunSummary of the phases' runs: per host its counts added, the last phase's identity kept."""
    first = summaries[0]
    per: dict = {}
    for s in summaries:
        for h in s.hosts:
            if h.name not in per:
                per[h.name] = dataclasses.replace(h)
                continue
            m = per[h.name]
            for f in ("ran", "cached", "imported", "planned", "seconds", "workers"):
                setattr(m, f, getattr(m, f) + getattr(h, f))
            m.errors, m.notes = m.errors + h.errors, m.notes + h.notes
            m.cannot_run = {**m.cannot_run, **h.cannot_run}
            m.does_not_start = m.does_not_start or h.does_not_start
    return dataclasses.replace(first, hosts=[per[n] for n in order if n in per])


def _hash_rows(hosts, sel: dict, root, inherited: bool = False) -> list:
    """Outputs rows (hashes) of `hosts` measured (`inherited`: or inherited) under this run's (fingerprint,
    session) (`sel`)."""
    cols = ["host", "fingerprint_id", "session_key", "session_options", "variant_id", "fixture_id", "output_name",
            "sha256", "inherited"]
    t = load_outputs(host=list(hosts), columns=cols, tables_root=root)
    return [r for r in t.to_pylist() if (inherited or r["inherited"] is None) and r["host"] in sel
            and (r["fingerprint_id"], host_key(r["session_options"], r["session_key"])) == sel[r["host"]]]


def _anchor_decisions(refs, order: list, runs_full: dict, full: dict, sel: dict, decode, threshold,
                      root) -> tuple[dict, set]:
    """(margins: (variant_id, fixture_id) -> the |margin| nearest the threshold on the variant's first host run in
    full, separating: the fixtures on which a host run in full served other decisions than that host, for some
    variant); nothing for a variant that cannot be decoded."""
    margins, separating = {}, set()
    for v in refs:
        hosts = [h for h in order if h in runs_full.get(v.variant_id, ()) and h in sel]
        if not hosts:
            continue
        try:
            selection = Selection(hosts=hosts, variants=[v], fixtures_for={v.variant_id: full[v.variant_id]},
                                  prefer={h: sel[h] for h in hosts})
            res = analyze(AnalysisRequest(selection, reference=hosts[0], decode_kind=decode, threshold=threshold,
                                          tables_root=root))
        except (UserError, KeyError, ValueError):
            continue
        margins.update(confirm_choice.nearest_margins([r for r in res.decision_rows if r["host"] == hosts[0]]))
        separating |= {r["fixture_id"] for r in res.flip_rows if r["comparison"] == "ref-same"}
    return margins, separating


@dataclasses.dataclass
class Confirmed:
    """What the phases did: the merged summary, (host, variant_id) -> anchor inherited from, the misses."""

    summary: RunSummary
    inherited: dict[tuple[str, str], str]
    misses: list[dict]


def run_confirmed(plan, k: int | None, run, refs, reference: str | None, decode, threshold, root,
                  require_providers: bool) -> Confirmed:
    """Run `plan` (with `run`: a sub-plan -> RunSummary) in phases: every host run in full for the variants it is
    not predicted on, the predicted hosts on their confirming fixtures, in full where those differ; the confirmed
    ones' other rows inherited (written to the outputs table)."""
    full = {vid: sorted(fx.fixture_id for fx in fxs) for vid, fxs in plan.fixtures_for.items()}
    order = plan.names if reference is None else [reference] + [n for n in plan.names if n != reference]
    anchors = {} if k is None else confirm_choice.predicted_anchors(order, remembered_infos(plan, require_providers),
                                                       {vi.variant_id: str(vi.path) for vi in plan.variants})
    if not any(anchors.values()):
        return Confirmed(run(plan), {}, [])
    summaries: list = []
    _run_groups(plan, {h: {v: full[v] for v in full if h not in anchors[v]} for h in order}, run, summaries)
    sel = {h.name: (h.fingerprint_id, h.session_key) for s in summaries for h in s.hosts if h.fingerprint_id}
    runs_full = {v: [h for h in order if h not in anchors[v]] for v in full}
    margins, separating = _anchor_decisions(refs, order, runs_full, full, sel, decode, threshold, root)
    first = {v: confirm_choice.confirm_fixtures(k, full[v], v, separating, margins) for v in full}
    _run_groups(plan, {h: {v: first[v] for v in full if h in anchors[v]} for h in order}, run, summaries)
    sel.update({h.name: (h.fingerprint_id, h.session_key) for s in summaries for h in s.hosts if h.fingerprint_id})
    digest = confirm_choice.digests(_hash_rows(order, sel, root))
    misses, inherited = [], {}
    for v in full:
        for h, a in anchors[v].items():
            if h in sel and confirm_choice.confirmed(digest, h, a, v, first[v]):
                inherited[(h, v)] = a
            else:
                misses.append({"host": h, "variant_id": v, "anchor": a})
    _run_groups(plan, _miss_work(misses, full), run, summaries)
    held = _inherit(inherited, first, sel, plan, root)
    for m in misses:
        print(f"note: {m['host']} was predicted to share {m['anchor']}'s class, but its confirming fixtures differ: "
              "run in full (a prediction miss, kept in equiv.json)", file=sys.stderr)
    return Confirmed(_merged(summaries, plan.names), held, misses)


def _miss_work(misses: list, full: dict) -> dict:
    out: dict = {}
    for m in misses:
        out.setdefault(m["host"], {})[m["variant_id"]] = full[m["variant_id"]]
    return out


def _inherit(inherited: dict, first: dict, sel: dict, plan, root) -> dict:
    """Write the rows each confirmed (host, variant) inherits from its anchor (the fixtures it has no row of);
    returns the pairs that hold inherited rows, with their anchor (a host measured in full inherits nothing)."""
    names = {vi.variant_id: vi for vi in plan.variants}
    out = {}
    for (h, v), a in sorted(inherited.items()):
        own = [r for r in _hash_rows([h], sel, root, inherited=True) if r["variant_id"] == v]
        measured = [r for r in own if r["inherited"] is None]
        if not measured:
            continue
        skey, opts = measured[0]["session_key"], measured[0]["session_options"]
        have = {r["fixture_id"] for r in own}
        if any(r["inherited"] is not None for r in own):
            out[(h, v)] = a
        rows = [r for r in load_outputs(host=a, variant_id=v, fingerprint_id=sel[a][0], tables_root=root).to_pylist()
                if r["inherited"] is None and r["fixture_id"] not in have
                and host_key(r["session_options"], r["session_key"]) == sel[a][1]]
        if not rows:
            continue
        fid = sel[h][0]
        new = confirm_choice.inherited_rows(rows, h, fid, skey, opts, lambda vid, fx: run_key(vid, fx, fid, skey))
        partwrite.append("outputs", new, root=root)
        out[(h, v)] = a
        print(f"note: {h} {names[v].name}: byte-identical to {a} on its {len(first[v])} confirming fixtures; "
              f"inherits its other {len({r['fixture_id'] for r in rows})}", file=sys.stderr)
    return out
