"""The search's latency ceiling: a confirmed candidate's latency on the fleet's hosts that measure latency.

Which hosts measure: those whose host class says a time measured there is a device latency
(``latency_refusal()`` says nothing: local and ssh hosts); an emulated, CPUID-masked or imported host is not
measured. The timing is explain.latency.measure's protocol (warm-up, `repeats` blocks of `runs` timed runs, the
median of the block medians and their spread), with the small fixed numbers of PROTOCOL, on one fixture (the first
by fixture id), under the candidate's session entries. Measurements are cached by content (the candidate's
semantic hash, its session, the host and its worker's fingerprint identity, the fixture, the protocol) in an
append-only JSON-lines file beside the evaluations, sealed like them (explain.search.cache), so a rerun
or a resumed search reads the same times and walks the same candidates.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from quantbench.errors import UserError
from quantbench.explain.latency import measure
from quantbench.explain.search.cache import append_cache, finite, read_cache
from quantbench.explain.search.evaluator import session_with
from quantbench.fsutil import canonical_json, content_key
from quantbench.hosts.kinds import KINDS
from quantbench.hosts.registry import HostSpec, make_host

#: the timing protocol of a search's latency measurement (explain.latency.measure's smallest allowed blocks)
PROTOCOL = {"warmup": 2, "runs": 10, "repeats": 3}
FIELDS = ("median_ms", "spread_ms")


def measures_latency(host) -> bool:
    """Whether a time measured on `host` (a hosts.registry.HostRequest) is a device latency (its class says so)."""
    return not make_host(host.spec).latency_refusal()


def measuring_kinds() -> tuple[list[str], list[str]]:
    """(the host kinds whose times are device latencies, the others), in the kinds table's order."""
    yes = [k for k in KINDS if not make_host(HostSpec(k, k, {})).latency_refusal()]
    return yes, [k for k in KINDS if k not in yes]


def _either(names: list[str], word: str) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {word} {names[-1]}"


def check_fleet(hosts, ceiling: float | None) -> None:
    """A latency ceiling needs at least one host of `hosts` that measures latency: else one line naming them."""
    if ceiling is not None and not any(measures_latency(h) for h in hosts):
        yes, no = measuring_kinds()
        raise UserError(f"hosts {', '.join(h.label for h in hosts)}: a latency ceiling needs a host that measures "
                        f"latency and none of these does; latency is measured on {_either(yes, 'and')} hosts, not "
                        f"on {_either(no, 'or')} ones: add such a host or drop the ceiling")


def over_ceiling(latency_ms: dict, ceiling: float) -> str:
    """The note of a candidate whose median on some host is over `ceiling` ms ("" when it is within)."""
    return "; ".join(f"median {ms:.3g} ms on {host}, over the latency ceiling {ceiling:g} ms"
                     for host, ms in latency_ms.items() if ms > ceiling)


def latency_row(row: dict) -> bool:
    """A latency line's values as the probe writes them: a median over 0 ms and a spread of 0 or more."""
    return row.keys() == set(FIELDS) and finite(row["median_ms"]) and row["median_ms"] > 0 and finite(row["spread_ms"])


@dataclass
class LatencyProbe:
    """The latency of candidates on the measuring hosts of a started fleet (explain.search.evaluator.Evaluator)."""

    fleet: object
    cache_file: Path
    cache: dict = field(default_factory=dict)
    run_count: int = 0
    cached_count: int = 0
    hosts: list = field(default_factory=list)   # the indices of the fleet's hosts that measure latency
    fixture: object = None                      # the one fixture timed (the first by fixture id)

    def __post_init__(self) -> None:
        self.cache = read_cache(self.cache_file, latency_row)
        self.hosts = [i for i, h in enumerate(self.fleet.hosts) if measures_latency(h)]
        self.fixture = min(self.fleet.fixtures, key=lambda fx: fx.fixture_id)

    def measure(self, model_path, variant_id: str, entries: dict) -> dict:
        """{host label: {"median_ms", "spread_ms"}} of the candidate on each measuring host (cached by content)."""
        out = {}
        for i in self.hosts:
            host = self.fleet.hosts[i]
            key = self._key(i, variant_id, entries)
            if key in self.cache:
                self.cached_count += 1
            else:
                row = measure(model_path, dataclasses.replace(host, session=session_with(host.session, entries)),
                              self.fixture, variant_id=variant_id, **PROTOCOL)
                self.cache[key] = {"median_ms": row.median_ms, "spread_ms": row.spread_ms}
                append_cache(self.cache_file, key, self.cache[key])
                self.run_count += 1
            out[host.label] = dict(self.cache[key])
        return out

    def _key(self, i: int, variant_id: str, entries: dict) -> str:
        host = self.fleet.hosts[i]
        ident = self.fleet.workers[i].fingerprint.get("identity", {})
        return content_key(["search-latency/1", variant_id, canonical_json(session_with(host.session, entries)),
                            host.label, ident, self.fixture.fixture_id, PROTOCOL])
