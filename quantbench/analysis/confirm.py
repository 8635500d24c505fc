"""`equiv --confirm K`: which hosts a run may confirm on a few fixtures instead of running in full, which fixtures
confirm them, and the rows a confirmed host inherits.

A host whose kernel-dispatch signature (analysis.predict: every routine the variant's graph reaches, its kernel's
`bytes` value on the host's features, same onnxruntime version, session and arch), computed from the fingerprint
its worker reports in this run, equals that of a host named before it is *predicted* to share that host's class
(its anchor). The anchor runs every fixture, the confirming ones first; the predicted host, in the same run, runs
only K confirming fixtures (runs.confirmboard): first those that separated classes in an earlier analysis of the
variant in the tables (a ref-same flip: bytes differ on nearly every fixture once kernels differ, decisions on
few), then those whose decisions lay nearest the threshold there, then by fixture id (fresh tables: the first K
by id), so the choice never depends on what this machine remembers. When every output of those fixtures is
byte-identical to its anchor's, the host inherits the anchor's other rows (marked `inherited` with the anchor's
name, under a run key no run looks up, so a later full run measures them); any difference makes the host run the
rest in full, and the miss is kept for the predictor. A host without a fingerprint of its own in the run
(imported, on a cluster) is predicted nothing and anchors nothing.
"""

from __future__ import annotations

import hashlib
import math

from quantbench.analysis import predict
from quantbench.fsutil import canonical_json

#: what `confirm` takes for every host running every fixture (what a release gate counting only measurements wants)
ALL = "all"
#: K = 2 unless asked, from measurement (results/bench/confirm-vit24.json, docs/benchmarks.md): on a 97 MB ViT-S over
#: ten hosts (four emulated) with 24 fixtures, 0.29 of --confirm all's wall time with the same classes and flips
#: and no miss; on the demo, where start-ups and not inferences are the time, 0.73. Every confirmed host was
#: byte-identical on every fixture it inherited, in every run measured; a miss runs the host in full.
DEFAULT_CONFIRM = 2


def _signature_key(info: dict | None, path: str, cache: dict):
    """What a host's bytes follow from on this graph (arch, onnxruntime, session, per-routine bytes), or None when
    quantbench cannot say (no fingerprint, no dispatch table, another provider than the CPU's)."""
    if not info or not info.get("isa_flags"):
        return None
    session = info.get("session") or {}
    if list(session.get("providers") or ["CPUExecutionProvider"]) != ["CPUExecutionProvider"]:
        return None
    table = predict.table_for(info.get("ort_version", ""), info.get("arch", ""))
    if table is None:
        return None
    level = session.get("graph_optimization_level", "all")
    memo = (path, table.version, table.arch, level)
    if memo not in cache:
        cache[memo] = predict.graph_routines(path, table, level)
    config = session.get("config_entries") or {}
    sig = predict.signature(table, cache[memo], predict.host_features(info), config)
    if any(predict.UNKNOWN in v for v in sig.values()):
        return None
    return canonical_json({"arch": predict.arch_tag(info.get("arch")), "ort": table.version, "session": session,
                           "sig": sig})


def host_info(fingerprint: dict, session: dict | None) -> dict | None:
    """What predicted_anchors reads of a host: its fingerprint's arch, ISA flags, CPU and onnxruntime version,
    and the session it runs under (None: the fingerprint has no identity)."""
    ident = fingerprint.get("identity") or {}
    if not ident:
        return None
    return {"arch": ident.get("arch"), "isa_flags": ident.get("isa_flags"), "cpu": ident.get("cpu"),
            "ort_version": (ident.get("onnxruntime") or {}).get("version", ""), "session": session}


def predicted_anchors(order: list[str], infos: dict, paths: dict, cache: dict | None = None) -> dict:
    """{variant_id: {host: anchor}}: each host (in `order`, the reference first) whose signature equals that of a
    host before it, mapped to the first such host; `infos`: host -> what analysis.predict.host_features reads plus
    ort_version and session (None: unknown); `paths`: variant_id -> model file; `cache`: the graphs' routines,
    kept between calls."""
    cache = {} if cache is None else cache
    out = {}
    for vid, path in paths.items():
        first: dict = {}
        mine = {}
        for h in order:
            key = _signature_key(infos.get(h), path, cache)
            if key is None:
                continue
            if key in first:
                mine[h] = first[key]
            else:
                first[key] = h
        out[vid] = mine
    return out


def nearest_margins(decision_rows) -> dict:
    """{(variant_id, fixture_id): the smallest |margin| of its decisions} (analysis decision rows)."""
    out: dict = {}
    for r in decision_rows:
        m = r.get("margin")
        if m is None or (isinstance(m, float) and math.isnan(m)):
            continue
        key = (r["variant_id"], r["fixture_id"])
        out[key] = min(out.get(key, math.inf), abs(m))
    return out


def confirm_fixtures(k: int, fixture_ids: list, vid: str, separating: set, margins: dict) -> list:
    """The `k` fixtures a predicted host runs first for variant `vid`: those that separated classes (decisions
    differed between hosts run in full) before the others, each group nearest the threshold first (no margin
    known: by fixture id); sorted."""
    ranked = sorted(fixture_ids, key=lambda f: (f not in separating, margins.get((vid, f), math.inf), f))
    return sorted(ranked[:k])


def inherited_run_key(run_key: str, anchor: str) -> str:
    """The run key of an inherited row: never a measured row's (the cache finds no inherited row as done)."""
    return hashlib.sha256(f"{run_key}|inherited from {anchor}".encode()).hexdigest()


def inherited_rows(anchor_rows, host: str, fingerprint_id: str, session_key: str, session_options: str,
                   run_key_of) -> list[dict]:
    """The anchor's rows (dicts with their tensors) as the predicted host's, marked `inherited`; `run_key_of`:
    (variant_id, fixture_id) -> the measured run key the host's own row would have."""
    out = []
    for r in anchor_rows:
        rk = run_key_of(r["variant_id"], r["fixture_id"])
        out.append({**{c: r.get(c) for c in ("variant_id", "variant", "fixture_id", "output_name", "dtype", "shape",
                                             "sha256", "tensor", "providers", "placement")},
                    "run_key": inherited_run_key(rk, r["host"]), "host": host, "fingerprint_id": fingerprint_id,
                    "session_key": session_key, "session_options": session_options, "inherited": r["host"]})
    return out
