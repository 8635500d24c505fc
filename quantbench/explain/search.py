"""Ship search: from a static QDQ variant that fails the decision gate somewhere in the fleet, find the recipe that
holds on every host, and write it as a variant like the ones calibrate writes.

The walk (every step measured, none guessed):

1. Global choices (explain.searchspace.Space.choices): the variant as calibrated (meeting the budget, it ends
   the search), x64quantprecision as a session requirement, reduce_range, S8S8 / U8U8, per-channel toggled,
   the other calibration methods whose ranges calibrate left, only the multiply-accumulate ops quantized
   (mac_only). Of those meeting the budget with nothing in float: the fewest worst-host flips, then the
   smallest file, then the earlier choice. None meeting it: pairs of an op type left in float and a numeric
   choice (explain.searchpairs).
2. Mixed precision on each global choice in turn (fewest worst-host flips at screening first; one over budget
   with every node in float passed over at the cost of that candidate) until one has a set that meets the
   budget: nodes ranked by measurement (lint's layers that can diverge on a host of this
   fleet, most saturating pairs first; then the node upstream of the first tensor localize finds divergent
   between two hosts on a fixture the base choice flips; then the SQNR each node loses in onnxruntime's
   qdq_loss_debug against the float model on calibration images, its loss on the flipping fixtures breaking
   ties), grown greedily by rank (prefixes of 1, 2, 4, ... nodes), the
   smallest passing prefix found by bisection, then shrunk: chunks of half, a quarter, ... one node whose
   removal still meets the budget are dropped (least ranked first).

Cost is counted in fleet evaluations (one candidate on one host over a set of fixtures). Each candidate is
screened first on the fast hosts (this machine, plain or CPUID-masked) and the fixtures nearest the decision
threshold (smallest fp32 margin); a candidate over budget there is over budget on the whole set (flips only
add up), so only survivors are confirmed on every host and every fixture; the fixtures a confirmed base choice
flips on join the screening set. A candidate is a pure function of
(choice, nodes in float): same inputs, same walk, same chosen variant on any number of jobs.

Ceilings: the share kept in float and the size are checked before any evaluation; a latency ceiling
(`max_latency_ms`) only on a confirmed survivor, the one kind of candidate that can be chosen, on the hosts that
measure latency (explain.searchlatency): a median over it there and the candidate does not pass (stage
"ceiling"). Latency measurements are cached by content, so a rerun reads the same times and walks the same way.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import numbers
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from quantbench.analysis.gates import Budget, parse_budget
from quantbench.errors import ParameterError, UserError
from quantbench.explain.searchfleet import Fleet, decoder_key
from quantbench.explain import searchidentity as identity
from quantbench.explain.searchimported import recipe_marks, unconfirmed_line
from quantbench.explain.searchlatency import PROTOCOL, LatencyProbe, check_fleet, over_ceiling
from quantbench.explain.searchpairs import pair_phase
from quantbench.explain.searchoutcome import ALL_FLOAT, NO_INT8, NO_INT8_MACS, NOT_DONE, int8_left, nearest, \
    no_answer_tail
from quantbench.explain.searchspace import Choice, Space, error_feeds, error_ranking, lint_ranking, mac_node_of
from quantbench.explain.searchtensors import tensor_phase
from quantbench.explain.searchwrite import write_variant
from quantbench.fsutil import atomic_write_json, check_writable, check_writable_for, clean_stale_tmp, content_key, owner_tag
from quantbench.inputs.modelio import load_model, semantic_sha256
from quantbench.inputs.sidecarfile import requirements_of, variant_identity
from quantbench.inputs.variantdir import is_plain_name, load_variants

SPACES = ("all", "global", "nodes")
#: the share of the evaluation budget localize's runs may take (one run on one host is one evaluation)
LOCALIZE_SHARE = 8
#: the lock file of a results folder's search state (one search at a time)
LOCK_NAME = ".lock"
#: the SQNR that ranks the nodes after lint's layers and the localize node, the other breaking its ties; measured
#: on the demo bench (scripts/bench_search.py --max-evaluations 300): the calibration images' loss leading kept
#: 47.9% of the weights in int8, the flipping fixtures' loss leading 14.2% (the few flipping inputs rank worse)
SQNR_LEAD = ("sqnr_loss_db", "sqnr_loss_db_flipping")


@dataclass
class SearchParams:
    budget: int | str = 0                 # decision flips against fp32 allowed per host, or a share ("1%") of the
    #                                       decisions fp32 serves there (analysis.gates.parse_budget)
    max_float_share: float | None = None  # share of the candidate nodes' weights kept in float
    max_size: int | None = None           # bytes of the variant file
    max_latency_ms: float | None = None   # median ms on every host that measures latency (confirmed candidates)
    max_evaluations: int = 200
    max_seconds: float | None = None
    space: str = "all"
    screen_fixtures: int = 4
    error_images: int = 4
    jobs: int = 1
    name: str | None = None               # the written variant's name (default: named for what it is)
    max_drop: float | None = None         # the accuracy against the labels may fall at most this below fp32's, per host
    identical: bool = False               # the answer must also give byte-identical outputs on every measured host

    def check(self) -> None:
        self._check_types()
        parse_budget(self.budget)
        if self.space not in SPACES:
            raise ParameterError("space", f"unknown {self.space!r}; choose from {', '.join(SPACES)}")
        if self.max_float_share is not None and not 0 <= self.max_float_share <= 1:
            raise ParameterError("max_float_share", f"must be between 0 and 1 (got {self.max_float_share})")
        for key in ("max_evaluations", "screen_fixtures", "error_images", "jobs"):
            if getattr(self, key) < 1:
                raise ParameterError(key, f"must be at least 1 (got {getattr(self, key)})")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ParameterError("max_seconds", f"must be more than 0 (got {self.max_seconds})")
        if self.max_size is not None and self.max_size <= 0:
            raise ParameterError("max_size", f"must be more than 0 bytes (got {self.max_size})")
        if self.max_drop is not None and not 0 <= self.max_drop <= 1:
            raise ParameterError("max_drop", f"must be between 0 and 1 (got {self.max_drop})")
        if self.max_latency_ms is not None and not self.max_latency_ms > 0:
            raise ParameterError("max_latency_ms", f"must be more than 0 ms (got {self.max_latency_ms})")

    def _check_types(self) -> None:
        """Every parameter of the type the command line's flag gives (the API takes any Python value): whole
        numbers for counts, finite numbers for ceilings, a plain name (calibrate's variant-name rule) for `name`."""
        if not (isinstance(self.budget, str) and self.budget.strip().endswith("%")) and not _whole(self.budget):
            raise ParameterError("budget", "must be a whole number of flips or a share of the served decisions "
                                 "(\"1%\")", self.budget)
        for key in ("max_evaluations", "screen_fixtures", "error_images", "jobs", "max_size"):
            value = getattr(self, key)
            if not (value is None and key == "max_size") and not _whole(value):
                raise ParameterError(key, "must be a whole number", value)
        for key in ("max_float_share", "max_seconds", "max_latency_ms", "max_drop"):
            value = getattr(self, key)
            if value is not None and not (_number(value) and math.isfinite(value)):
                raise ParameterError(key, "must be a finite number", value)
        if not isinstance(self.identical, bool):
            raise ParameterError("identical", "must be True or False", self.identical)
        if not isinstance(self.space, str):
            raise ParameterError("space", f"must be one of {', '.join(SPACES)}", self.space)
        if self.name is not None and not is_plain_name(self.name):
            raise ParameterError("name", f"{self.name!r} is not a plain variant name (use letters, digits, '.', '_', "
                                 "'+', '-'; not starting with '.'); nothing was run", self.name, show_value=False)

    @property
    def limit(self) -> Budget:
        return parse_budget(self.budget)

    def key(self) -> dict:
        """What decides the walk (not the evaluation and time budgets, nor jobs: they only stop it or pace it)."""
        out = {"budget": self.limit.value(), "max_float_share": self.max_float_share, "max_size": self.max_size,
               "space": self.space, "screen_fixtures": self.screen_fixtures, "error_images": self.error_images}
        if self.max_latency_ms is not None:   # a search without the ceiling keeps the id it had
            out["max_latency_ms"] = self.max_latency_ms
        if self.max_drop is not None:
            out["max_drop"] = self.max_drop
        if self.identical:   # a search without the constraint keeps the id it had
            out["identical"] = True
        return out


def _whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class Stopped(Exception):
    """The evaluation or time budget ran out (`kind`: evaluations | time); `reason` is the stop line."""

    def __init__(self, reason: str, kind: str):
        super().__init__(reason)
        self.reason, self.kind = reason, kind


@dataclass
class Tried:
    """One candidate and what the fleet measured of it."""

    choice: Choice
    exclude: tuple
    variant_id: str = ""                    # the candidate model's semantic hash (what the fleet measured)
    size: int = 0
    float_share: float = 0.0
    stage: str = ""                         # screen | confirm | not built | ceiling
    flips: dict = field(default_factory=dict)
    passes: bool = False
    note: str = ""
    screen: dict = field(default_factory=dict)   # the screening stage's flips (fast hosts, nearest fixtures)
    path: Path | None = None
    int8: dict = field(default_factory=dict)     # {"weights", "macs"}: the candidate nodes' shares left in int8
    int8_ops: int = 0                            # its QuantizeLinear/DequantizeLinear/integer nodes (0: all float)
    latency_ms: dict = field(default_factory=dict)         # {host: median ms} on the hosts that measure latency
    latency_spread_ms: dict = field(default_factory=dict)  # {host: spread ms} of those medians
    flipped: dict = field(default_factory=dict)  # per host of its last stage: the fixture ids that flip (None: unknown)
    hashes: dict = field(default_factory=dict)   # per host run: {fixture id: hash of its outputs}
    screened_on: list = field(default_factory=list)   # the fixture ids of its screening stage
    accuracy: dict = field(default_factory=dict)      # {host: the metric against the labels} (with a max drop)
    base_requirements: dict = field(default_factory=dict)   # the base variant's session requirement (every host
    #                                                         runs every candidate under it)

    @property
    def requirements(self) -> dict:
        """The session entries a host must set to get this candidate's results: the base's and its choice's."""
        return {**self.base_requirements, **self.choice.entries}

    @property
    def screen_worst(self) -> int | None:
        vals = list(self.screen.values())
        return None if not vals or None in vals else max(vals)

    @property
    def worst(self) -> int | None:
        vals = [v for v in self.flips.values() if v is not None]
        return None if len(vals) < len(self.flips) or not vals else max(vals)

    @property
    def identity(self) -> str:
        """The variant_id the candidate has as a variant: its model under its session requirement
        (variant_identity)."""
        return variant_identity(self.variant_id, self.requirements) if self.variant_id else ""

    def row(self) -> dict:
        return {"choice": self.choice.name, "recipe": self.choice.describe(), "exclude": list(self.exclude),
                "variant_id": self.identity, "semantic_sha256": self.variant_id, "size": self.size,
                "session_requirements": self.requirements,
                "float_share": self.float_share,
                "stage": self.stage, "flips": self.flips, "worst": self.worst, "passes": self.passes,
                "note": self.note, "screen": self.screen, "int8": self.int8, "int8_ops": self.int8_ops,
                "latency_ms": self.latency_ms,
                "latency_spread_ms": self.latency_spread_ms, "flipped": self.flipped,
                "screened_on": self.screened_on, "accuracy": self.accuracy}

    def flipping(self) -> list:
        """The fixture ids that flip on any host of its last stage, sorted."""
        return sorted({f for ids in self.flipped.values() for f in ids or ()})


@dataclass
class Walk:
    """The state of one search: the space, the fleet, the screening set, every candidate tried."""

    space: Space
    fleet: Fleet
    params: SearchParams
    screen_ids: list
    all_ids: list
    started: float
    tried: list = field(default_factory=list)
    evaluations: int = 0
    on_evaluation: object = None
    ranking: list = field(default_factory=list)      # [(node, measurement dict)] in rank order
    kept_because: dict = field(default_factory=dict)  # node -> the candidate without it
    latency: LatencyProbe | None = None               # with a latency ceiling: the measuring hosts' timer
    localize_spent: int = 0                           # evaluations localize's runs took
    localized: list = field(default_factory=list)     # per base choice ranked: localize's evidence (or why none)
    stop_kind: str = ""                               # done | evaluations | time | exhausted
    on_status: object = None                          # callable(line): one line per phase and confirmed candidate
    served: dict = field(default_factory=dict)        # {host: decisions fp32 serves there over every fixture}

    def allowed(self, host: str) -> int:
        """The flips the budget allows on `host` (a share: of the decisions fp32 serves there on every fixture, so
        a screening subset is held to the whole set's count and never rejects what the whole set passes)."""
        return self.params.limit.allowed(self.served.get(host, 0))

    def meets(self, t: "Tried") -> bool:
        """Whether `t`'s flips (its last stage) are within the budget on every host that measured it, and, with a
        max drop, confirmed on every fixture, its accuracy at most that below fp32's on every host run."""
        flips = bool(t.flips) and all(v is not None and v <= self.allowed(h) for h, v in t.flips.items())
        same = not self.params.identical or identity.one_class(t, self.fleet.imported)
        return flips and same and (self.params.max_drop is None or t.stage != "confirm" or not self.dropped(t))

    def dropped(self, t: "Tried") -> list[str]:
        """The hosts where `t`'s accuracy falls more than the max drop below fp32's (or was not measured)."""
        out = []
        for host, ref in zip(self.fleet.hosts, self.fleet.fp32_metric):
            got = t.accuracy.get(host.label)
            if ref is not None and (got is None or ref - got > self.params.max_drop + 1e-12):
                out.append(host.label)
        return out

    def budget_text(self) -> str:
        return self.params.limit.describe(self.served)

    def say(self, line: str) -> None:
        """One status line (a phase begun, a candidate confirmed) to `on_status`, when there is one."""
        if self.on_status is not None:
            self.on_status(f"search: {line}")

    def _confirmed(self, t: "Tried") -> None:
        flips = ", ".join(f"{h} {'cannot run' if v is None else v}" for h, v in t.flips.items())
        verdict = "meets the budget" if self.meets(t) else self._over(t)
        kept = f"{len(t.exclude)} node(s) in float" if t.exclude else "nothing in float"
        self.say(f"confirmed {variant_name(t)} ({t.choice.name}, {kept}; int8 "
                 f"{(t.int8 or {}).get('macs', 1.0):.1%} of the MACs): flips {flips}, {verdict}; "
                 f"{self.evaluations} of {self.params.max_evaluations} evaluations spent")

    def _over(self, t: "Tried") -> str:
        """Why a confirmed candidate does not pass, in its status line: over the budget, or (with the identity
        constraint) within it but split into classes."""
        flips_ok = all(v is not None and v <= self.allowed(h) for h, v in t.flips.items())
        classes = identity.classes_of(t, self.fleet.imported)
        if self.params.identical and flips_ok and len(classes) > 1:
            return f"within the budget but {identity.class_text(classes)}"
        return "over the budget"

    def _spend(self, n: int) -> None:
        p = self.params
        if self.evaluations + n > p.max_evaluations:
            raise Stopped(f"stopped: evaluation budget reached ({self.evaluations} of {p.max_evaluations} "
                          "evaluations spent; the next candidate needs more)", "evaluations")
        if p.max_seconds is not None and time.monotonic() - self.started > p.max_seconds:
            raise Stopped(f"stopped: time budget reached ({p.max_seconds:g} s)", "time")
        self.evaluations += n

    def _stage(self, t: Tried, stage: str, hosts: list[int], fixture_ids: list) -> bool:
        self._spend(len(hosts))
        evs = self.fleet.evaluate(t.path, t.variant_id, t.choice.entries, hosts, fixture_ids)
        t.stage, t.flips = stage, {e.host: e.flips for e in evs}
        t.flipped, t.hashes = {e.host: e.flipped for e in evs}, {e.host: e.hashes for e in evs if e.hashes}
        t.accuracy = {e.host: e.metric for e in evs if e.metric is not None}
        if stage == "screen" or not t.screen:   # a candidate confirmed at once was screened on everything
            t.screen, t.screened_on = dict(t.flips), list(fixture_ids)
        t.note = "; ".join(e.note for e in evs if e.note)
        if stage == "confirm":
            self._confirmed(t)
        if self.on_evaluation is not None:
            self.on_evaluation(self, t)
        return self.meets(t)

    def try_candidate(self, choice: Choice, exclude) -> Tried:
        exclude = tuple(sorted(exclude))
        for t in self.tried:
            if t.choice == choice and t.exclude == exclude:
                return t
        t = Tried(choice, exclude, base_requirements=requirements_of(self.space.base))
        self.tried.append(t)
        built = self.space.build(choice, exclude)
        if built is None:
            t.stage, t.note = "not built", "the quantizer refuses this combination"
            return t
        t.variant_id, t.size, t.float_share, t.path = built.variant_id, built.size, built.float_share, built.path
        t.int8, t.int8_ops = self.space.int8_share(exclude, choice), built.int8_ops
        if not t.int8_ops:   # the float model: the baseline, never evaluated nor chosen
            t.stage, t.note = ALL_FLOAT, NO_INT8
            return t
        why = self._over_ceiling(t)
        if why:
            t.stage, t.note = "ceiling", why
            return t
        every = list(range(len(self.fleet.hosts)))
        if self.fleet.fast() == every and self.screen_ids == self.all_ids:   # screening is the whole fleet
            t.passes = self._stage(t, "confirm", every, self.all_ids)
        elif self._stage(t, "screen", self.fleet.fast(), self.screen_ids):
            t.passes = self._stage(t, "confirm", every, self.all_ids)
        if t.stage == "confirm" and not exclude:
            self._screen_on_flipping(t)
        if t.passes and not int8_left(t):
            t.passes, t.note = False, "; ".join(n for n in (t.note, NO_INT8_MACS) if n)
        if t.passes and self.latency is not None:
            self._time(t)
        return t

    def _screen_on_flipping(self, t: Tried) -> None:
        """A base choice confirmed on every host and fixture: the fixtures that flip on any host join the screening
        set (a subset of every fixture still: its flips never exceed those on the whole set); with the identity
        constraint, the fixtures whose outputs differ between hosts too."""
        split = identity.differing_fixtures(t) if self.params.identical else []
        self.screen_ids = sorted(set(self.screen_ids) | set(t.flipping()) | set(split))

    def _time(self, t: Tried) -> None:
        """A confirmed survivor's latency on the measuring hosts; over the ceiling somewhere, it does not pass."""
        got = self.latency.measure(t.path, t.variant_id, t.choice.entries)
        t.latency_ms = {h: m["median_ms"] for h, m in got.items()}
        t.latency_spread_ms = {h: m["spread_ms"] for h, m in got.items()}
        why = over_ceiling(t.latency_ms, self.params.max_latency_ms)
        if why:
            t.stage, t.passes, t.note = "ceiling", False, "; ".join(n for n in (t.note, why) if n)

    def _over_ceiling(self, t: Tried) -> str:
        p = self.params
        if p.max_float_share is not None and t.float_share > p.max_float_share + 1e-12:
            return f"keeps {t.float_share:.1%} of the weights in float, over the ceiling {p.max_float_share:.1%}"
        if p.max_size is not None and t.size > p.max_size:
            return f"{t.size} bytes, over the size ceiling {p.max_size}"
        return ""


def _best(tried: list) -> Tried | None:
    ok = [t for t in tried if t.passes]
    return min(ok, key=lambda t: (t.float_share, t.worst, t.size, tried.index(t))) if ok else None


def _global_phase(walk: Walk) -> Tried | None:
    """The best global choice that meets the budget; the variant as calibrated at once when it does."""
    choices = walk.space.choices()
    walk.say(f"global choices: {len(choices)} ({', '.join(c.name for c in choices)}) on "
             f"{len(walk.fleet.hosts) + len(walk.fleet.imported)} host(s), {len(walk.all_ids)} fixtures")
    for choice in choices:
        t = walk.try_candidate(choice, ())
        if t.passes and choice.name == "base":
            return t
    pair_phase(walk, choices)
    return _best(walk.tried)


def _mixed_bases(walk: Walk) -> list[Choice]:
    """The global choices mixed precision starts from, in turn: the fewest worst-host flips at screening first,
    the earlier choice on a tie (one that cannot run anywhere last); the variant as calibrated alone when
    searching nodes only."""
    if walk.params.space == "nodes":
        return [walk.space.base_choice()]
    scored = [t for t in walk.tried if not t.exclude and t.stage != "not built" and t.screen]
    big = float("inf")
    scored.sort(key=lambda t: (big if t.screen_worst is None else t.screen_worst, walk.tried.index(t)))
    return [t.choice for t in scored] or [walk.space.base_choice()]


def rank_nodes(walk: Walk, choice: Choice, feeds: list, feeds_from: str) -> list:
    """[(node, measurement)] in rank order: lint's layers that can diverge on a host of this fleet (most
    saturating pairs first), then the node upstream of the first tensor localize finds divergent between two hosts
    on a flipping fixture, then every other node by the SQNR it loses (qdq_loss_debug; SQNR_LEAD: on calibration
    images, then on the flipping fixtures), name on a tie."""
    base = walk.space.build(choice, ())
    if base is None:
        return []
    t = walk.try_candidate(choice, ())
    lint = lint_ranking(base.path, walk.fleet.int8_paths())
    loss = error_ranking(walk.space, base.path, feeds)
    flips = set(t.flipping())
    flipping = sorted((fx for fx in walk.fleet.fixtures if fx.fixture_id in flips),
                      key=lambda fx: fx.fixture_id)[:walk.params.error_images]
    loss_flip = error_ranking(walk.space, base.path, [{fx.input_name: fx.array} for fx in flipping]) if flipping else {}
    evidence = _localize_evidence(walk, t)
    walk.localized.append({"choice": choice.name, **evidence})
    out = []
    for node in walk.space.nodes():
        m = {"node": node, "op_type": walk.space.op_types[node], "sqnr_loss_db": loss.get(node),
             "error_on": feeds_from, "sqnr_loss_db_flipping": loss_flip.get(node),
             "flipping_fixtures": [fx.fixture_id for fx in flipping]}
        if node in lint:
            pairs, hosts, reason = lint[node]
            m.update({"lint_pairs": pairs, "lint_hosts": hosts, "lint": reason})
        if evidence.get("node") == node:
            m["localize_first"] = {k: evidence[k] for k in ("hosts", "fixture", "tensor")}
        out.append((node, m))
    out.sort(key=lambda nm: (0 if "lint" in nm[1] else 1 if "localize_first" in nm[1] else 2,
                             -(nm[1].get("lint_pairs") or 0), *(-(nm[1][k] or 0.0) for k in SQNR_LEAD), nm[0]))
    return out


def localize_pair(t: Tried, labels: list) -> tuple[str, str, str] | None:
    """(worst host, a host whose outputs differ from it, the fixture) of a candidate's last stage: the first flipping
    fixture (sorted) of the worst host (most flips, fleet order on a tie) where another host's outputs hash
    otherwise (fleet order); None when no such pair is known."""
    ran = [h for h in labels if h in t.hashes and t.flips.get(h) is not None]
    if not ran:
        return None
    worst = max(ran, key=lambda h: (t.flips[h], -ran.index(h)))
    for fid in t.flipped.get(worst) or ():
        for other in ran:
            if other != worst and t.hashes[other].get(fid) not in (None, t.hashes[worst].get(fid)):
                return worst, other, fid
    return None


def _localize_evidence(walk: Walk, t: Tried) -> dict:
    """Localize's first divergent tensor of the base candidate `t` and the node upstream of it (its runs counted
    as evaluations, at most 1/LOCALIZE_SHARE of the evaluation budget over the search); {"skipped": why} without."""
    labels = [h.label for h in walk.fleet.hosts]
    pair = localize_pair(t, labels)
    if pair is None:
        return {"skipped": "no two hosts give different outputs on a fixture that flips"}
    p = walk.params
    cap = min(p.max_evaluations // LOCALIZE_SHARE - walk.localize_spent, p.max_evaluations - walk.evaluations)
    if cap // 2 < 2:
        return {"skipped": f"localize's share of the evaluation budget is spent ({walk.localize_spent})"}
    model = load_model(t.path, check=False)   # parsed once: localize walks it, mac_node_of maps its tensor
    first, runs, _ = walk.fleet.localize(t.path, t.variant_id, t.choice.entries,
                                         (labels.index(pair[0]), labels.index(pair[1])), pair[2], cap // 2, model)
    walk.evaluations += 2 * runs
    walk.localize_spent += 2 * runs
    out = {"hosts": list(pair[:2]), "fixture": pair[2], "tensor": first[0] if first else None, "evaluations": 2 * runs}
    if not first:
        return {**out, "skipped": "no divergent tensor found within localize's runs"}
    return {**out, "node": mac_node_of(model, first[0], walk.space.op_types)}


def _grow(walk: Walk, choice: Choice, order: list) -> tuple[int, int] | None:
    """(last failing prefix length, first passing one) of the greedy doubling over the ranked nodes."""
    lo, k = 0, 1
    while True:
        k = min(k, len(order))
        if walk.try_candidate(choice, order[:k]).passes:
            return lo, k
        if k == len(order):
            return None
        lo, k = k, 2 * k


def _bisect(walk: Walk, choice: Choice, order: list, lo: int, hi: int) -> int:
    """The shortest passing prefix in (lo, hi] (hi passes)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if walk.try_candidate(choice, order[:mid]).passes:
            hi = mid
        else:
            lo = mid
    return hi


def shortest_prefix(walk: Walk, choice: Choice, order: list) -> int | None:
    """The fewest leading nodes of `order` kept in float that meet the budget (greedy doubling, then bisection);
    None when even all of them do not."""
    span = _grow(walk, choice, order)
    return None if span is None else _bisect(walk, choice, order, *span)


def _shrink(walk: Walk, choice: Choice, kept: list) -> list:
    """Drop the nodes whose removal still meets the budget: chunks of half the set, then of a quarter, ... down to
    one node, least ranked first (a set of nodes that do not matter goes in one evaluation); record, for each node
    tried alone and kept, the candidate without it (the measurement that keeps it)."""
    kept = list(kept)
    size = max(1, len(kept) // 2)
    while True:
        for end in range(len(kept), 0, -size):
            chunk = kept[max(0, end - size):end]
            if not chunk:
                continue
            without = [n for n in kept if n not in chunk]
            t = walk.try_candidate(choice, without)
            if t.passes:
                kept = without
            elif size == 1:
                walk.kept_because[chunk[0]] = t
        if size == 1:
            return kept
        size = max(1, size // 2)


def _out_of_reach(walk: Walk, choice: Choice) -> bool:
    """Whether `choice` is over budget with every node it can keep in float kept there (measured: evaluated and
    failed, not refused by a ceiling nor by the quantizer). The greedy growth ends at that candidate, so no set of
    its nodes is searched on such a choice: the evaluations ranking and growing would take go to the next one."""
    every = walk.try_candidate(choice, walk.space.nodes())
    return every.stage in ("screen", "confirm") and not walk.meets(every)


def _mixed_phase(walk: Walk, feeds: list, feeds_from: str) -> Tried | None:
    """Nodes kept in float on each base choice in turn (passing over those out of reach), until one has a set that
    meets the budget."""
    scratch = True   # per-node tensor choices grown from one node: once, on the first choice the float walk fails
    for choice in _mixed_bases(walk):
        if _out_of_reach(walk, choice):
            continue
        named = walk.space.named
        walk.say(f"nodes kept in float on choice {choice.name}: ranking {len(walk.space.nodes())} node(s)"
                 + (f" ({len(named)} unnamed, named by op type and output, e.g. {named[0]})" if named else ""))
        walk.ranking, walk.kept_because = rank_nodes(walk, choice, feeds, feeds_from), {}
        plain = walk.try_candidate(choice, ())
        if plain.passes:   # nothing needs keeping in float
            return plain
        order = [n for n, _ in walk.ranking]
        k = shortest_prefix(walk, choice, order) if order else None
        floated = walk.try_candidate(choice, _shrink(walk, choice, order[:k])) if k is not None else None
        if floated is None:
            if not scratch:
                continue
            scratch = False
        # per-node tensor choices (16-bit activations, another method's or symmetric ranges) where they keep more
        formed = tensor_phase(walk, choice, order, floated)
        if formed is not None:
            return formed
    return None


def search_id(base_id: str, fp32_id: str, hosts, fixture_ids, params: SearchParams, imported=(), decoder="") -> str:
    """The search's content key: the base, the fp32 reference, the hosts and their sessions, the fixtures, the
    parameters, the decoder (searchfleet.decoder_key); an imported host's held outputs are part of it (a
    re-exported file is new input)."""
    held = [[m.label, sorted([*k, v] for k, v in m.hashes.items())] for m in imported]
    return content_key(["search/3", base_id, fp32_id, [(h.label, h.session) for h in hosts], sorted(fixture_ids),
                        params.key(), decoder, *([held] if held else [])])


def walk_space(walk: Walk, feeds_of) -> tuple[Tried | None, str]:
    """(the chosen candidate or None, the stop line)."""
    try:
        chosen = _global_phase(walk) if walk.params.space in ("all", "global") else None
        if chosen is None and walk.params.identical:
            chosen = identity.identity_phase(walk)
        if chosen is None and walk.params.space in ("all", "nodes"):
            chosen = _mixed_phase(walk, *feeds_of())
            chosen = chosen if chosen is not None and chosen.passes else None
    except Stopped as stop:
        best = _best(walk.tried)
        walk.stop_kind = stop.kind
        return best, stop.reason + (NOT_DONE if best is not None else "")
    if chosen is None:
        n = len(walk.tried)
        walk.stop_kind = "exhausted"
        return None, (f"stopped: space exhausted ({n} candidate{'' if n == 1 else 's'} tried, none meets the budget of "
                      f"{walk.budget_text()}{' in one class' if walk.params.identical else ''} with int8 left"
                      f"{_latency_tail(walk)}"
                      f"{no_answer_tail(walk.tried)})")
    walk.stop_kind = "done"
    return chosen, "done: a candidate meets the budget on every host and every fixture"


def _latency_tail(walk: Walk) -> str:
    """What the latency ceiling took out of the stop line's count ("" without one)."""
    over = [t for t in walk.tried if t.latency_ms and not t.passes]
    if walk.params.max_latency_ms is None or not over:
        return ""
    return (f" under the latency ceiling {walk.params.max_latency_ms:g} ms: {len(over)} that meet the budget are "
            "over it")


#: the recipe keys make_static writes itself (a written variant takes every other key of the base recipe: its
#: input recipe, calibration set, plug-ins)
MADE_BY_STATIC = ("variant", "model", "method", "quant_format", "calibration_method", "calibration_options",
                  "activation_type", "weight_type", "per_channel", "reduce_range", "exclude_nodes", "exclude_op_types",
                  "op_types_to_quantize", "extra_options", "ranges_sha256", "ranges_file", "calibrated_tensors",
                  "input_model_sha256", "versions", "semantic_sha256", "search", "session_requirements",
                  "quantize_outputs")


@dataclass
class SearchResult:
    search_id: str
    base: str
    hosts: list
    fixtures: int
    budget: int | str          # as given: flips per host, or a share of the served decisions ("1%")
    stop: str
    chosen: dict | None
    written: str | None
    variant_name: str | None
    tried: list
    nodes: list                # per node kept in float: the measurement that put it there
    ranking: list
    evaluations: int
    evaluations_run: int
    evaluations_cached: int
    seconds: float
    result_file: str = ""
    localized: list = field(default_factory=list)   # per base choice ranked: localize's evidence (or why none)
    imported: list = field(default_factory=list)   # per imported host: its stand-in or why it is unconfirmed
    max_latency_ms: float | None = None
    latency_protocol: dict = field(default_factory=dict)   # warmup, runs, repeats of each latency measurement
    latency_measurements: int = 0          # candidate x measuring host timed (not fleet evaluations)
    latency_measurements_run: int = 0
    latency_measurements_cached: int = 0
    passed: bool = False                  # a candidate with int8 left meets every constraint (chosen)
    nearest: dict | None = None           # no candidate passed: the nearest with int8 left, what would change it
    budget_text: str = ""                 # the budget in words, with the count it allows on each host for a share
    allowed: dict = field(default_factory=dict)   # {host: flips the budget allows there}
    holds_on: dict = field(default_factory=dict)  # the answer's fixtures, hosts and the known hosts not checked
    max_drop: float | None = None
    fp32_accuracy: dict = field(default_factory=dict)   # {host: fp32's metric against the labels} (with a max drop)
    metric: str = ""                                    # that metric (top-1, AP, text)
    identical: bool = False                             # the answer had to be one class on every measured host
    identity: dict = field(default_factory=dict)        # its classes, or the nearest's and the ops separating them

    def best(self, n: int = 5) -> list[dict]:
        scored = [r for r in self.tried if (r["worst"] if r["worst"] is not None else _max(r["screen"])) is not None]
        return sorted(scored, key=lambda r: (r["worst"] if r["worst"] is not None else _max(r["screen"]),
                                             r["float_share"], self.tried.index(r)))[:n]


def _max(d: dict):
    vals = list((d or {}).values())
    return None if not vals or None in vals else max(vals)


def variant_name(t: Tried) -> str:
    c = t.choice
    name = f"static-{c.method}" + ("" if c.name in ("base", c.method) else f"-{c.name.replace('_', '')}")
    return name + (f"-float{len(t.exclude)}" if t.exclude else "")


def _kept_nodes(walk: Walk, t: Tried) -> list[dict]:
    rank = dict(walk.ranking)
    out = []
    for node in t.exclude:
        m = dict(rank.get(node, {"node": node}))
        without = walk.kept_because.get(node)
        if without is not None:
            worst_host = max(without.flips, key=lambda h: (without.flips[h] is not None, without.flips[h] or 0))
            m["without_it"] = {"worst": without.worst, "host": worst_host, "stage": without.stage,
                               "flips": without.flips, "note": without.note}
        out.append(m)
    return out


def _write(walk: Walk, t: Tried, params: SearchParams, sid: str, held: dict) -> tuple[str | None, str | None, str]:
    """(written path, name, note) of the chosen candidate; nothing when it is the variant as calibrated."""
    base = walk.space.base
    # the search named the base's unnamed nodes: its own "base" candidate is the calibrated model under new names
    as_calibrated = bool(walk.space.named) and t.choice == walk.space.base_choice() and not t.exclude and not (
        base.recipe.get("exclude_nodes"))
    if as_calibrated or t.identity == variant_identity(base.recipe.get("semantic_sha256", ""), requirements_of(base)):
        return str(base.path), base.name, "the variant as calibrated meets the budget: nothing new written"
    name = params.name or variant_name(t)
    extra = {k: v for k, v in base.recipe.items() if k not in MADE_BY_STATIC}
    extra["search"] = {"search_id": sid, "base_variant": base.name, "base_variant_id": base.recipe.get(
        "semantic_sha256"), "choice": t.choice.name, "budget": params.limit.value(), "hosts": list(t.flips),
        "flips": t.flips, "float_share": t.float_share, "holds_on": held,
        **recipe_marks(walk.fleet.imported, t.flips)}
    if params.identical:   # the hosts it was measured to give one class on
        extra["search"]["one_class"] = identity.classes_of(t, walk.fleet.imported)[0]
    if params.max_latency_ms is not None:
        extra["search"].update({"max_latency_ms": params.max_latency_ms, "latency_ms": t.latency_ms})
    if t.requirements:
        extra["session_requirements"] = t.requirements
    path, state = write_variant(walk.space, t.choice, t.exclude, t.variant_id, name, extra)
    return str(path), name, f"variant {name}: {state}"


@contextlib.contextmanager
def open_walk(base, fp32_path, hosts, fixtures, spec, params: SearchParams, state_root, on_evaluation=None,
              on_status=None, accuracy=None):
    """A Walk over `base`'s space on the started fleet (fp32 run on every host, the screening fixtures picked);
    the workers closed and the candidates' folder removed afterwards."""
    params.check()
    check_fleet(hosts, params.max_latency_ms)
    Space.check(base)
    if not fixtures:
        raise UserError(f"{base.path}: no eval fixtures to count decisions on")
    t0 = time.monotonic()
    state_root = Path(state_root)
    prepare_state(state_root, base)
    fx_ids = sorted(fx.fixture_id for fx in fixtures)
    fleet = Fleet(hosts, fixtures, spec, state_root / "evaluations.jsonl", params.jobs)
    fleet.accuracy = accuracy if params.max_drop is not None else None
    with search_lock(state_root), tempfile.TemporaryDirectory(prefix=f".search.{owner_tag()}.", suffix=".tmp",
                                                              dir=state_root) as work:
        space = Space.open(base, Path(work))
        try:
            fleet.start(fp32_path, base)
            margins = fleet.margins()
            screen = sorted(fx_ids, key=lambda f: (margins.get(f, float("inf")), f))[:params.screen_fixtures]
            latency = (LatencyProbe(fleet, state_root / "latency.jsonl") if params.max_latency_ms is not None
                       else None)
            yield Walk(space, fleet, params, sorted(screen), fx_ids, t0, on_evaluation=on_evaluation,
                       latency=latency, served=fleet.served(), on_status=on_status)
        finally:
            fleet.close()


def prepare_state(state_root: Path, base) -> None:
    """The search's state folder made, before anything runs: never a symlink (the search would write through it),
    taking new files, as the base's variants folder must (the answer is written there); one line else."""
    if state_root.is_symlink() or (state_root.exists() and not state_root.is_dir()):
        raise UserError(f"{state_root}: is a symbolic link or not a folder; the search keeps its state as a folder "
                        "of its own results folder and never writes through a link: remove it")
    check_writable(Path(base.path).parent, "the search writes its answer beside the base variant; nothing was run")
    check_writable_for(state_root, "the search keeps its evaluations there; nothing was run")
    state_root.mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def search_lock(state_root: Path):
    """One search at a time on a results folder (flock on its `search/.lock`; a second is refused in one line,
    not run beside the first, repeating every evaluation); the candidates' folders a killed search left (their
    owner process gone) swept once it is held."""
    try:
        fd = os.open(state_root / LOCK_NAME, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:   # a link in its place (never followed), or a folder
        raise UserError(f"{state_root / LOCK_NAME}: cannot take the search's lock ({exc.strerror or exc}); remove "
                        "it; nothing was run") from None
    with os.fdopen(fd, "w") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"{state_root}: another search is running on this results folder; wait for it to end "
                            "(or search in another results folder); nothing was run") from None
        try:
            clean_stale_tmp(state_root, "search")
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def check_base_unchanged(base) -> None:
    """The base's folder still holds the base searched from (a calibrate run during the search re-made it): else
    one line, nothing written, rather than an answer mixing two calibrations."""
    folder = Path(base.path).parent
    now = next((v for v in load_variants(folder) if v.name == base.name), None)
    keys = ("semantic_sha256", "ranges_sha256")
    if now is None or any((now.recipe or {}).get(k) != (base.recipe or {}).get(k) for k in keys):
        raise UserError(f"{folder}: {base.name} changed during the search (a calibrate run re-made it); the search "
                        "measured the one before, so nothing was written: rerun the search")


def _count_latency(result: SearchResult, walk: Walk) -> None:
    """The latency ceiling, its protocol and the measurements spent on it (none without a ceiling)."""
    probe = walk.latency
    if probe is None:
        return
    result.max_latency_ms, result.latency_protocol = walk.params.max_latency_ms, dict(PROTOCOL)
    result.latency_measurements_run, result.latency_measurements_cached = probe.run_count, probe.cached_count
    result.latency_measurements = probe.run_count + probe.cached_count


def holds_on(walk: Walk, t: Tried, coverage: dict | None) -> dict:
    """Where the answer was measured to hold: its fixtures (the whole eval split, or a limit of it), its hosts, and
    the hosts known here (built in, or in the hosts file) it was not checked on."""
    cov = coverage or {}
    return {"fixtures": len(walk.all_ids), "limit": cov.get("limit"), "hosts": list(t.flips),
            "unchecked_hosts": list(cov.get("unchecked_hosts") or [])}


def confirm_tail(held: dict) -> str:
    """The stop line's note for an answer measured on a limit of the eval split ("" on the whole split)."""
    if held.get("limit") is None:
        return ""
    return (f"; holds on the {held['fixtures']} fixtures searched (a limit of the eval split) on "
            f"{', '.join(held['hosts'])}: confirm with a fresh equiv over the whole split on every host it ships to")


def search(base, fp32_path, hosts, fixtures, spec, params: SearchParams, state_root, on_evaluation=None,
           on_status=None, coverage: dict | None = None, accuracy=None) -> SearchResult:
    """Walk the space of `base` (a static QDQ Variant calibrate wrote) on `hosts` (HostRequests) over
    `fixtures`, decisions decoded by `spec`; write the chosen variant beside `base`; the result and the
    evaluation cache under `state_root` (resumed from on a rerun)."""
    with open_walk(base, fp32_path, hosts, fixtures, spec, params, state_root, on_evaluation, on_status,
                   accuracy) as walk:
        sid = search_id(base.recipe.get("semantic_sha256", ""), semantic_sha256(fp32_path), hosts,
                        walk.all_ids, params, walk.fleet.imported, decoder_key(spec))
        chosen, stop = walk_space(walk, lambda: error_feeds(base, fixtures, params.error_images))
        held = holds_on(walk, chosen, coverage) if chosen is not None else {}
        check_base_unchanged(base)
        written, name, note = _write(walk, chosen, params, sid, held) if chosen is not None else (None, None, "")
        stop += confirm_tail(held)
        same = identity.outcome(walk, chosen) if params.identical else {}
    fleet = walk.fleet
    stop += unconfirmed_line(fleet.imported, name)
    result = SearchResult(sid, base.name, [h.label for h in hosts], len(walk.all_ids), params.limit.value(),
                          stop + (f"; {note}" if note else ""), chosen.row() if chosen else None, written, name,
                          [t.row() for t in walk.tried], _kept_nodes(walk, chosen) if chosen else [],
                          [m for _, m in walk.ranking], walk.evaluations, fleet.run_count, fleet.cached_count,
                          round(time.monotonic() - walk.started, 3), localized=walk.localized,
                          imported=[m.row() for m in fleet.imported], passed=chosen is not None,
                          nearest=nearest(walk, variant_name), budget_text=walk.budget_text(),
                          allowed={h: walk.allowed(h) for h in walk.served}, holds_on=held)
    _count_latency(result, walk)
    result.identical, result.identity = params.identical, same
    if fleet.accuracy is not None:
        result.max_drop, result.metric = params.max_drop, fleet.accuracy[0].metric
        result.fp32_accuracy = {h.label: m for h, m in zip(fleet.hosts, fleet.fp32_metric)}
    result.result_file = str(atomic_write_json(Path(state_root) / sid / "result.json", result.__dict__))
    return result
