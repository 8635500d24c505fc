"""Resolved providers of an analysis: per host and variant, which execution provider ran the nodes (the
outputs' placement column, read from each run's profile by the worker) and what the run did not honour of
its provider request (worker.provider_problems: a provider not available in that onnxruntime, or one that
took no node). A finding is flagged in the verdict and the classes table; the analysis goes on."""

from __future__ import annotations

import json

from quantbench import worker
from quantbench.runs.placement import parse, ran_providers
from quantbench.store.hostresults import load_hosts

#: the outputs columns provider_runs reads
COLUMNS = ("host", "fingerprint_id", "session_key", "variant_id", "session_options", "placement")


def provider_runs(hosts, sel: dict, rows: dict, tables_root) -> dict:
    """{host: {variant_id: {"requested", "ran", "placement", "findings"}}} for the selected results of each host
    (`sel`: host -> (fingerprint_id, session_key)), from `rows`: {column: values} of the analysed variants' outputs
    rows (at least COLUMNS, in table order), which the analysis read once. A result stored before placements were
    recorded has an empty placement and no finding."""
    available = _available(hosts, tables_root)
    out: dict = {h: {} for h in hosts}
    for h, fp, sk, vid, sopts, placement in zip(*(rows[c] for c in COLUMNS)):
        if h not in sel or (fp, sk) != tuple(sel[h]) or (vid in out[h] and out[h][vid]["placement"]):
            continue
        requested = list(json.loads(sopts or "{}").get("providers") or ["CPUExecutionProvider"])
        placed = parse(placement)
        findings = worker.provider_problems(requested, available.get((h, fp), requested), placed) if placed else []
        out[h][vid] = {"requested": requested, "ran": ran_providers(placed, requested), "placement": placed,
                       "findings": findings}
    return out


def _available(hosts, tables_root) -> dict:
    """(host, fingerprint_id) -> the providers its onnxruntime lists (from the hosts table's fingerprint)."""
    t = load_hosts(host=list(hosts), tables_root=tables_root, columns=["host", "fingerprint_id", "fingerprint"])
    out = {}
    for h, fp, text in zip(*(t.column(c).to_pylist() for c in ("host", "fingerprint_id", "fingerprint"))):
        ident = json.loads(text or "{}").get("identity", {})
        out[(h, fp)] = list(ident.get("onnxruntime", {}).get("available_providers") or [])
    return out


def class_findings(runs: dict, variant_id: str, hosts) -> list[str]:
    """'pi: requested XnnpackExecutionProvider ...' for each finding of `hosts` on one variant (classes table)."""
    return [f"{h}: requested {f}" for h in hosts for f in runs.get(h, {}).get(variant_id, {}).get("findings", [])]


def class_placements(runs: dict, variant_id: str, hosts) -> dict:
    """{host: {provider: {op type: nodes}}} of `hosts` on one variant (classes table, report)."""
    return {h: runs.get(h, {}).get(variant_id, {}).get("placement", {}) for h in hosts}
