"""The search's evaluator: every candidate model runs on the hosts' workers, its decisions are counted against fp32.

One evaluation is one candidate run on one host over one set of fixtures; its result is the number of
decision flips against the fp32 model on the same host (analysis.decisions.compare: the numbers
`equiv --gate decision` counts), the fixtures whose decisions flip, and a hash of each fixture's outputs (hosts
whose hashes differ on a fixture computed different bytes there: what localize can explain). Evaluations are
cached by content (the key version, the candidate's semantic hash, its session entries, the host and its
fingerprint, the fixtures, the decoder and the fp32 reference) in an append-only JSON-lines file, one sealed line
per finished evaluation (and per localize walk the search runs), flushed as it is written (explain.search.cache:
a line this machine did not write as it is, or of the wrong types, is a miss): a search killed at any point
resumes from the lines that were written (a torn last line is ignored), and a rerun of the same search runs
nothing again.
"""

from __future__ import annotations

import dataclasses
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from quantbench.analysis import accuracy
from quantbench.analysis.decisions import compare
from quantbench.errors import UserError
from quantbench.explain.lint import fleet_paths
from quantbench.explain.localize import decode_runs, localize
from quantbench.explain.search.cache import append_cache, count, read_cache, strings
from quantbench.explain.search.standins import assign_stand_ins, read_member, run_hashes, told
from quantbench.fsutil import canonical_json, content_key
from quantbench.hosts.keys import session_options
from quantbench.hosts.kinds import KINDS
from quantbench.hosts.requirements import applied
from quantbench.hosts.registry import HostRequest, make_host
from quantbench.hosts.startup import start_workers
from quantbench.hosts.workerclient import JobFailed
from quantbench.inputs.modelio import semantic_sha256

#: the evaluation cache's key version: a line written under another version is never read as this one's
#: (version 2 added the flipping fixtures and the outputs' hashes; 3 the decoder and the fp32 reference)
CACHE_VERSION = "evaluation/3"


def decoder_key(spec) -> str:
    """What decides a decision besides the outputs: the decoder's kind, every key of its decode block, a plug-in's
    SHA-256 (DecodeSpec.as_dict): a changed decoder counts other flips, so it is another key."""
    return content_key([dataclasses.asdict(spec), spec.as_dict()])


def session_with(session: dict, entries: dict | None) -> dict:
    """A host's session with extra config entries (a candidate's session requirements) on top, applied as `equiv`
    applies a variant's requirement (hosts.requirements.applied): the entries the host did not set are named
    required, so a host whose onnxruntime does not know one (session.x64quantprecision on aarch64) cannot run the
    candidate, as it cannot run the written variant, rather than running it with the entry silently ignored."""
    if not entries:
        return session_options(session).wire()
    return applied(session, entries)


@dataclass
class Evaluation:
    host: str
    flips: int | None          # None: the host could not run it (see note)
    fixtures: int
    cached: bool = False
    note: str = ""
    predicted_from: str | None = None   # an imported host's flips: those of the host that stands in for it
    flipped: list | None = None         # the fixture ids whose decisions flip (sorted; None: unknown)
    hashes: dict = field(default_factory=dict)   # {fixture id: hash of its outputs' bytes}
    metric: float | None = None         # with an accuracy plan, over every fixture it scores: the metric's value


@dataclass
class Evaluator:
    """Evaluates candidates on the fleet (the API's `Fleet` only names the hosts): the started
    workers of `hosts` (hosts.registry.HostRequest), the fp32 decisions on each, the cache.

    Imported hosts (their kind runs no workers) are taken out of `hosts` into `imported_requests`; after start()
    `imported` holds what their files say (explain.search.standins.ImportedMember) and who stands in for them."""

    hosts: list
    fixtures: list
    spec: object
    cache_file: Path
    jobs: int = 1
    workers: list = field(default_factory=list)
    fp32: list = field(default_factory=list)      # per host: {fixture_id: Decoded}
    cache: dict = field(default_factory=dict)
    run_count: int = 0
    cached_count: int = 0
    imported_requests: list = field(default_factory=list)
    imported: list = field(default_factory=list)
    base_id: str = ""
    reference: str = ""      # the decoder and the fp32 model the flips are counted with (decoder_key, its hash)
    accuracy: tuple | None = None    # (analysis.accuracy Plan, Truth): a max drop's metric against the labels
    fp32_metric: list = field(default_factory=list)   # per host: fp32's value of that metric

    def __post_init__(self) -> None:
        runs = [make_host(h.spec).runs_workers for h in self.hosts]
        self.imported_requests = [h for h, r in zip(self.hosts, runs) if not r]
        self.hosts = [h for h, r in zip(self.hosts, runs) if r]

    @property
    def names(self) -> list:
        return list(self.spec.outputs.values())

    def start(self, fp32_path, base=None) -> None:
        """Start every worker and run fp32 on every host and fixture (the reference; not an evaluation); with
        imported hosts, run `base` (the variant searched from) too and find who stands in for each."""
        if not self.hosts:
            raise UserError(f"hosts {', '.join(h.label for h in self.imported_requests)}: an imported host holds "
                            "results of models it ran; a search needs at least one host it can run candidates on")
        if self.imported_requests and base is None:
            raise UserError("an imported host in the fleet needs the base variant to find the host that stands in "
                            "for it")
        self.cache = read_cache(self.cache_file, evaluation_row)
        self.reference = content_key([decoder_key(self.spec), semantic_sha256(fp32_path)])
        self.workers = start_workers(self.hosts)
        data = Path(fp32_path).read_bytes()
        runs = self._map(lambda i: self.workers[i].run(data, self.fixtures, self.hosts[i].session,
                                                       return_tensors=self.names), range(len(self.hosts)))
        self.fp32 = [decode_runs(self.spec, r, self.names, self.fixtures) for r in runs]
        self.fp32_metric = [self._metric(dec) for dec in self.fp32]
        if self.imported_requests:
            self._read_imported(semantic_sha256(fp32_path), base, runs)

    def _read_imported(self, fp32_id: str, base, fp32_runs: list) -> None:
        """Each imported host's fp32 and base results from its file(s), and its stand-in among the hosts run."""
        self.base_id = semantic_sha256(base.path)
        self.imported = [read_member(r, base, fp32_id, self.base_id, self.fixtures, self.spec, self.names)
                         for r in self.imported_requests]
        data = Path(base.path).read_bytes()
        base_runs = self._map(lambda i: self.workers[i].run(data, self.fixtures, self.hosts[i].session,
                                                            return_tensors=self.names), range(len(self.hosts)))
        hashes = [{**run_hashes(f, fp32_id, self.names), **run_hashes(b, self.base_id, self.names)}
                  for f, b in zip(fp32_runs, base_runs)]
        assign_stand_ins(self.imported, [h.label for h in self.hosts], hashes)

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.workers = []

    def _map(self, fn, items) -> list:
        with ThreadPoolExecutor(max_workers=max(1, self.jobs)) as pool:
            return list(pool.map(fn, list(items)))

    def int8_paths(self) -> list:
        """Every host's int8 path: the started workers', then the imported hosts' (from their files' fingerprints)."""
        return fleet_paths(self.workers) + [m.path for m in self.imported]

    def served(self) -> dict:
        """{host label: the decisions fp32 serves there over every fixture}: what a budget given as a share counts
        against (an imported host's from its file)."""
        out = {h.label: sum(d.total for d in dec.values()) for h, dec in zip(self.hosts, self.fp32)}
        for member in self.imported:
            out[member.label] = sum(d.total for d in member.fp32.values())
        return out

    def fast(self) -> list[int]:
        """The hosts screened first (their kind runs on this machine's own CPU: HostKind.on_this_cpu), else every
        host."""
        out = [i for i, h in enumerate(self.hosts) if KINDS[h.spec.kind].on_this_cpu]
        return out or list(range(len(self.hosts)))

    def margins(self) -> dict:
        """{fixture id: the smallest |fp32 margin| over its decisions and the hosts}: how near the threshold it is."""
        out: dict = {}
        for dec in self.fp32:
            for fid, d in dec.items():
                m = float(min((abs(x) for x in d.margin), default=float("inf")))
                out[fid] = min(out.get(fid, m), m)
        for member in self.imported:   # where an imported host's base flips is as near the threshold as it gets
            for fid, d in member.fp32.items():
                m = -1.0 if member.base_flips.get(fid) else float(min((abs(x) for x in d.margin), default=float("inf")))
                out[fid] = min(out.get(fid, m), m)
        return out

    def evaluate(self, model_path, variant_id: str, entries: dict, host_ix: list[int], fixture_ids: list[str]
                 ) -> list[Evaluation]:
        """One evaluation per host of `host_ix` over `fixture_ids` (cached by content), in host order; then one per
        imported host whose flips are known (explain.search.standins.told: predicted from its stand-in, or its base
        variant's flips from its own rows)."""
        fxs = [fx for fx in self.fixtures if fx.fixture_id in set(fixture_ids)]
        keys = {i: self._key(i, variant_id, entries, fxs) for i in host_ix}
        todo = [i for i in host_ix if keys[i] not in self.cache]
        data = Path(model_path).read_bytes() if todo else b""
        done = dict(zip(todo, self._map(lambda i: self._run_one(i, data, entries, fxs), todo)))
        out = []
        for i in host_ix:
            if i in done:
                self.run_count += 1
                append_cache(self.cache_file, keys[i], done[i])
                self.cache[keys[i]] = done[i]
                out.append(_evaluation(self.hosts[i].label, done[i], len(fxs), False))
            else:
                self.cached_count += 1
                out.append(_evaluation(self.hosts[i].label, self.cache[keys[i]], len(fxs), True))
        measured = dict(zip(host_ix, (e.flips for e in out)))
        for t in told(self.imported, self.base_id, variant_id, entries, measured, [fx.fixture_id for fx in fxs]):
            out.append(Evaluation(t.host, t.flips, len(fxs), False, t.note, t.predicted_from))
        return out

    def localize(self, model_path, variant_id: str, entries: dict, pair: tuple, fixture_id: str, max_runs: int,
                 model=None) -> tuple[dict, int, bool]:
        """(first divergent tensors, runs on each host, cached) of explain.localize on hosts `pair` (two indices)
        over one fixture, comparing QuantizeLinear outputs only (exposing them keeps every QDQ fusion, so no group
        is retried tensor by tensor), stopped at the first group holding a divergent tensor and before `max_runs`
        runs per host; cached like an evaluation (a rerun runs nothing again). `model`: its parsed ModelProto when
        the caller has it."""
        key = content_key(["localize/3", self._key(pair[0], variant_id, entries, []),
                           self._key(pair[1], variant_id, entries, []), fixture_id, max_runs])
        if key in self.cache:
            hit = self.cache[key]
            self.cached_count += hit["evaluations"]
            return hit["first"], hit["runs"], True
        fx = next(fx for fx in self.fixtures if fx.fixture_id == fixture_id)
        hosts = [HostRequest(self.hosts[i].label, self.hosts[i].spec, session_with(self.hosts[i].session, entries))
                 for i in pair]
        res = localize(model_path, hosts, fx, progress=False, variant_id=variant_id, model=model, first_only=True,
                       max_runs=max_runs, workers=[self.workers[i] for i in pair], op_types=("QuantizeLinear",))
        result = {"first": [r.tensor for r in res.first if not r.is_output], "runs": res.host_runs,
                  "evaluations": 2 * res.host_runs}   # one run on one host is one evaluation
        self.run_count += result["evaluations"]
        append_cache(self.cache_file, key, result)
        self.cache[key] = result
        return result["first"], result["runs"], False

    def _metric(self, decoded: dict) -> float | None:
        """The accuracy plan's value over `decoded` ({fixture id: Decoded}); None without a plan or when some
        fixture it scores is not among them (a screening subset)."""
        if self.accuracy is None or not set(self.accuracy[0].fixtures) <= set(decoded):
            return None
        return accuracy.score(self.accuracy[0], decoded, self.accuracy[1])["value"]

    def _key(self, i: int, variant_id: str, entries: dict, fxs: list) -> str:
        ident = self.workers[i].fingerprint.get("identity", {})
        # a line without an accuracy plan holds none
        scored = [accuracy.plan_key(*self.accuracy)] if self.accuracy is not None else []
        return content_key([CACHE_VERSION, variant_id, canonical_json(session_with(self.hosts[i].session, entries)),
                            self.hosts[i].label, ident, sorted(fx.fixture_id for fx in fxs), self.reference,
                            *scored])

    def _run_one(self, i: int, data: bytes, entries: dict, fxs: list) -> dict:
        try:
            runs = self.workers[i].run(data, fxs, session_with(self.hosts[i].session, entries),
                                       return_tensors=self.names)
        except JobFailed as exc:   # onnxruntime cannot make this session there: a result saying so
            if not exc.cannot_run:
                raise
            return {"flips": None, "note": f"onnxruntime cannot make this session on {self.hosts[i].label}: {exc.why}",
                    "flipped": None, "hashes": {}}
        dec = decode_runs(self.spec, runs, self.names, fxs)
        per = {f: len(compare(self.spec, self.fp32[i][f], dec[f]).flips) for f in sorted(dec)}
        hashes = {r["fixture_id"]: content_key([r["outputs"][n]["sha256"] for n in self.names]) for r in runs}
        out = {"flips": sum(per.values()), "note": "", "flipped": [f for f in sorted(per) if per[f]],
               "hashes": dict(sorted(hashes.items()))}
        metric = self._metric(dec)
        return out if metric is None else {**out, "metric": metric}


def evaluation_row(row: dict) -> bool:
    """An evaluation line's values as the fleet writes them (flips a count, or None with the note saying why), or a
    localize line's (its first divergent tensors, its runs on each host and the evaluations they took)."""
    if row.keys() == {"first", "runs", "evaluations"}:
        return strings(row["first"]) and count(row["runs"]) and count(row["evaluations"]) and row["evaluations"] == 2 * row["runs"]
    if row.keys() - {"metric"} != {"flips", "note", "flipped", "hashes"} or not isinstance(row["note"], str):
        return False
    if "metric" in row and not (isinstance(row["metric"], (int, float)) and not isinstance(row["metric"], bool)
                                and math.isfinite(row["metric"])):
        return False
    hashes = row["hashes"]
    if not (isinstance(hashes, dict) and all(isinstance(v, str) for v in hashes.values())):
        return False
    if row["flips"] is None:
        return bool(row["note"]) and row["flipped"] is None
    return count(row["flips"]) and strings(row["flipped"]) and len(row["flipped"]) <= row["flips"]


def _evaluation(host: str, result: dict, fixtures: int, cached: bool) -> Evaluation:
    return Evaluation(host, result["flips"], fixtures, cached, result["note"], flipped=result.get("flipped"),
                      hashes=result.get("hashes") or {}, metric=result.get("metric"))
