"""Resolved, not requested: which execution provider ran each node, as the run itself reports it.

The worker profiles a session's first run and reads the provider of every kernel event back
(worker.read_placement: {provider: {op type: nodes}}); the session object's provider list is never taken
as evidence (pip onnxruntime accepts an XNNPACK request, warns, and runs the CPU provider). A requested
provider that is not available or took no node is a finding (worker.provider_problems): by default the run
goes on and the finding is flagged in the run summary, the verdict and the classes table; with
`require_providers` the job is refused.

The outputs table keeps each result's placement (canonical JSON) and the providers that ran its nodes.
"""

from __future__ import annotations

import json

from quantbench.fsutil import canonical_json


def ran_providers(placement: dict, requested: list) -> list[str]:
    """The providers that ran at least one node: in the requested order, then any other."""
    ran = [p for p in requested if placement.get(p)]
    return ran + sorted(p for p in placement if p not in ran and placement[p])


def note_placement(summary, variant: str, requested: list, frame: dict, state: dict) -> None:
    """A worker frame carrying a placement (a session frame of a reused session, or a new session's first
    result): the job's `state` (providers, placement JSON for its rows) and the host's summary (placements by
    variant, findings once each). The caller holds the summary's lock."""
    placement = frame["placement"]
    state["providers"] = ran_providers(placement, requested)
    state["placement"] = canonical_json(placement)
    summary.placements.setdefault(variant, placement)
    if state["providers"] not in summary.providers:
        summary.providers.append(state["providers"])
    for problem in frame.get("provider_problems") or []:
        text = f"variant {variant}: requested {problem}"
        if text not in summary.provider_findings:
            summary.provider_findings.append(text)


def parse(text: str | None) -> dict:
    """An outputs row's placement column -> {provider: {op type: nodes}} ({} when the row has none)."""
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def summary_text(placement: dict) -> str:
    """'XnnpackExecutionProvider 5 nodes (Conv 2, Gemm 1, MaxPool 2); CPUExecutionProvider 3 nodes (Relu 3)'."""
    if not placement:
        return "no placement recorded"
    parts = []
    for provider, ops in sorted(placement.items(), key=lambda kv: -sum(kv[1].values())):
        n = sum(ops.values())
        parts.append(f"{provider} {n} node{'s' if n != 1 else ''} ("
                     + ", ".join(f"{op} {c}" for op, c in sorted(ops.items())) + ")")
    return "; ".join(parts)

