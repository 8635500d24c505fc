"""Localize a divergence: the first node whose output differs between two hosts.

Every intermediate tensor is hashed on each host, in topological order, without
ever holding the tensors of the whole model: the model is rewritten so that a
group of K intermediates becomes extra graph outputs, one run per group, and the
worker returns only their SHA-256 (``return_tensors=False``). Memory bound: the
worker holds at most K exposed intermediates + the model outputs + onnxruntime's
arena at once; the workbench holds hashes only, plus - fetched specifically at
the end - the tensors of the first divergent node and of the outputs (two hosts).

Exposing an intermediate can stop a fusion (a QDQ group, Conv+Relu, NCHWc
layout), which changes what is computed. So each group run also hashes the final
outputs and compares them with the unmodified model at the localisation level;
a tensor whose exposure changes the outputs is marked *not observable* at that
level and left out of the comparison. Separately, the unmodified model at the
localisation level is compared with the run being explained (each host's own
session, and its rows in the outputs table when present): if they differ, the
localisation explains a different computation and the report says so.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from pathlib import Path

from quantbench.analysis.decode import decode
from quantbench.analysis.precision import distance
from quantbench.store.resultpaths import TABLES_DIR
from quantbench.errors import ParameterError, UserError
from quantbench.fsutil import content_key
from quantbench.hosts.keys import session_key
from quantbench.hosts.registry import HostRequest
from quantbench.hosts.startup import parallel, start_workers
from quantbench.store.hostresults import load_outputs
from quantbench.inputs.modelio import load_model, semantic_sha256
from quantbench.textfmt import num

DEFAULT_GROUP = 8


def decode_runs(spec, results: list, names, fixtures=()) -> dict:
    """{fixture_id: Decoded} of one worker run's results, decoded from the tensors of outputs `names`; each with
    the geometry its fixture (of `fixtures`) records, for a decoder that undoes a letterbox or pad (as equiv's)."""
    geometry = {fx.fixture_id: fx.geometry for fx in fixtures if getattr(fx, "geometry", None)}
    return {r["fixture_id"]: decode(spec, {n: r["outputs"][n]["array"] for n in names}, geometry.get(r["fixture_id"]))
            for r in results}


# --------------------------------------------------------------------------- graph rewriting


@dataclass
class Candidate:
    position: int
    node: str
    op_type: str
    tensor: str


def intermediates(model) -> list[Candidate]:
    """Every node output that is not a model output, in the graph's topological order
    (DequantizeLinear outputs included)."""
    graph_outputs = {o.name for o in model.graph.output}
    out = []
    for pos, node in enumerate(model.graph.node):
        for t in node.output:
            if t and t not in graph_outputs:
                out.append(Candidate(pos, node.name or f"{node.op_type}_{pos}", node.op_type, t))
    return out


def value_types(model) -> dict:
    """tensor name -> ValueInfoProto with its type, from shape inference (types are all ORT needs)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    return {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)
            if vi.type.tensor_type.elem_type}


def expose(model, tensors: list[str], types: dict) -> bytes:
    """The model with `tensors` appended as graph outputs (after the original outputs)."""
    m = copy.deepcopy(model)
    for t in tensors:
        if t not in types:
            raise UserError(f"tensor {t!r}: no type from shape inference; cannot expose it as an output")
        vi = copy.deepcopy(types[t])
        vi.type.tensor_type.ClearField("shape")  # shapes can be symbolic; the type is enough
        m.graph.output.append(vi)
    return m.SerializeToString()


# --------------------------------------------------------------------------- the localisation


@dataclass
class TensorRow:
    position: int
    node: str
    op_type: str
    tensor: str
    observable: bool = True
    sha_a: str = ""
    sha_b: str = ""
    same: bool = True
    first_divergent: bool = False
    is_output: bool = False
    bits_mean: float | None = None
    bits_min: float | None = None
    max_abs: float | None = None


@dataclass
class LocalizeResult:
    variant: str
    variant_id: str
    fixture_id: str
    hosts: list
    fingerprints: list
    opt_level: str
    group_size: int
    rows: list = field(default_factory=list)
    first: list = field(default_factory=list)          # rows of the first divergent node
    outputs: list = field(default_factory=list)        # rows of the model outputs
    reproduces: dict = field(default_factory=dict)     # host label -> bool (loc level == explained run)
    table_check: dict = field(default_factory=dict)    # host label -> "match" | "differs" | "no rows"
    unobservable: int = 0
    runs: int = 0
    trend: str = ""
    host_runs: int = 0        # every run on each host, the explained one and the distances' fetch included
    stopped: str = ""         # why the walk stopped before the last group (first_only, max_runs); "" when it did not

    @property
    def localize_id(self) -> str:
        return content_key([self.variant_id, self.fixture_id, self.fingerprints,
                                              self.hosts, self.opt_level])

    def table_rows(self) -> list[dict]:
        base = {"localize_id": self.localize_id, "variant_id": self.variant_id, "variant": self.variant,
                "fixture_id": self.fixture_id, "host_a": self.hosts[0], "host_b": self.hosts[1],
                "fingerprint_a": self.fingerprints[0], "fingerprint_b": self.fingerprints[1],
                "opt_level": self.opt_level, "group_size": self.group_size}
        return [dict(base, **asdict(r)) for r in self.rows]


def _distance_fields(a, b) -> dict:
    d = distance(a, b)
    return {"bits_mean": d.bits_mean, "bits_min": None if d.bits_min is None else float(d.bits_min),
            "max_abs": d.max_abs}


def _check_two(hosts):
    if len(hosts) != 2:
        raise UserError(f"hosts must be exactly two (localize compares a pair), got {len(hosts)} "
                        f"({', '.join(h.label for h in hosts)})")


def localize(model_path, hosts: list[HostRequest], fixture, opt_level: str | None = None, group: int = DEFAULT_GROUP,
             variant_name: str = "", progress: bool = True, tables_root=None, require_providers: bool = False,
             variant_id: str | None = None, model=None, first_only: bool = False, max_runs: int | None = None,
             workers: list | None = None, op_types: tuple | None = None) -> LocalizeResult:
    """Find the first node whose output differs between the two hosts on one fixture (`variant_id`: the
    model's semantic hash, `model` its parsed ModelProto, when the caller has them: the run plan).

    `first_only`: stop after the first group holding a divergent tensor (the first divergent node is then known;
    no distances are fetched, and a host whose session is the localisation level's is not run twice);
    `max_runs`: stop before a group run would exceed that many runs per host; `workers`: started workers of the
    two hosts to run on (left open), instead of starting and closing their own; `op_types`: only the outputs of
    nodes of these op types are compared (e.g. QuantizeLinear: the tensors a fused QDQ group still writes, so
    exposing them keeps the fusion)."""
    _check_two(hosts)
    if group < 1:
        raise ParameterError("group", "must be at least 1", group)
    model = model if model is not None else load_model(model_path, check=False)
    vid = variant_id or semantic_sha256(model)
    cands = intermediates(model)
    types = value_types(model)
    untyped = [c for c in cands if c.tensor not in types]
    cands = [c for c in cands if c.tensor in types and (op_types is None or c.op_type in op_types)]
    levels = {h.session["graph_optimization_level"] for h in hosts}
    level = opt_level or (levels.pop() if len(levels) == 1 else "basic")
    own = workers is None
    workers = start_workers(hosts, require_providers) if own else workers
    res = LocalizeResult(variant=variant_name or Path(model_path).stem, variant_id=vid, fixture_id=fixture.fixture_id,
                         hosts=[h.label for h in hosts], fingerprints=[w.fingerprint_id for w in workers],
                         opt_level=level, group_size=group)
    try:
        _localize_on(res, model, hosts, workers, fixture, types, cands, untyped, tables_root, progress,
                     first_only, max_runs)
    finally:
        if own:
            for w in workers:
                w.close()
    return res


def _localize_on(res: LocalizeResult, model, hosts, workers, fixture, types, cands, untyped, tables_root,
                 progress, first_only, max_runs) -> None:
    outputs = [o.name for o in model.graph.output]
    base_bytes = model.SerializeToString()
    loc_sessions = [dict(h.session, graph_optimization_level=res.opt_level) for h in hosts]

    def run_all(model_bytes, names=None, tensors=False, sessions=None, count=True):
        res.runs += count
        res.host_runs += 1
        return parallel(lambda i: workers[i].run(model_bytes, [fixture], (sessions or loc_sessions)[i], names,
                                                 tensors)[0]["outputs"], [0, 1])

    at_level = run_all(base_bytes)
    same = first_only and all(loc_sessions[i] == hosts[i].session for i in (0, 1))
    explained = at_level if same else run_all(base_bytes, sessions=[h.session for h in hosts], count=False)
    for i, h in enumerate(hosts):
        res.reproduces[h.label] = all(at_level[i][o]["sha256"] == explained[i][o]["sha256"] for o in outputs)
        res.table_check[h.label] = _table_check(h, res.variant_id, fixture.fixture_id, explained[i], tables_root)

    def probe(chunk):
        names = [c.tensor for c in chunk]
        outs = run_all(expose(model, names, types), outputs + names)
        broken = any(outs[i][o]["sha256"] != at_level[i][o]["sha256"] for i in (0, 1) for o in outputs)
        return outs, broken

    def stop(hashes, next_chunk):
        if first_only and any(a != b for a, b in hashes.values()):
            res.stopped = "first_only: the first divergent tensor is known"
        elif max_runs is not None and res.host_runs + len(next_chunk) + (len(next_chunk) > 1) > max_runs:
            res.stopped = f"max_runs: the next group could exceed {max_runs} runs per host"
        return bool(res.stopped)

    hashes, unobservable, seen = _hash_intermediates(cands, res.group_size, probe, progress, stop)
    rows = _tensor_rows(model, cands[:seen], hashes, unobservable, outputs if seen == len(cands) else [], at_level)
    first = _mark_first_divergent(rows)
    if first and not first_only:
        fetch = [r.tensor for r in first if not r.is_output]
        got = run_all(expose(model, fetch, types) if fetch else base_bytes, outputs + fetch,
                      tensors=outputs + fetch)
        _add_distances(rows, got)
    if seen < len(cands):   # the outputs' rows, not a divergence candidate of a walk stopped early
        rows += _tensor_rows(model, [], {}, set(), outputs, at_level)
    res.rows = rows
    res.first = [r for r in rows if r.first_divergent]
    res.outputs = [r for r in rows if r.is_output]
    res.unobservable = len(unobservable)
    res.trend = _trend(res, untyped)


def _hash_intermediates(cands: list, group: int, probe, progress: bool, stop=None) -> tuple[dict, set, int]:
    """Expose `group` candidates at a time; a group whose exposure changes the outputs is retried one by one.

    `probe(chunk)` runs the model with the chunk exposed on both hosts -> (outputs, outputs changed);
    `stop(hashes so far, next chunk)`, asked before each group, ends the walk early when true.
    Returns ({tensor: [sha_a, sha_b]}, tensors that cannot be observed without changing the outputs, how many
    candidates were walked).
    """
    from tqdm import tqdm

    hashes: dict[str, list] = {}
    unobservable: set[str] = set()
    bar = tqdm(total=len(cands), desc="localize", unit="tensor", disable=not progress, leave=False)
    seen = 0
    for chunk in (cands[i:i + group] for i in range(0, len(cands), group)):
        if stop is not None and stop(hashes, chunk):
            break
        seen += len(chunk)
        outs, broken = probe(chunk)
        if broken and len(chunk) > 1:
            for c in chunk:  # find which exposures change the outputs
                one, b1 = probe([c])
                if b1:
                    unobservable.add(c.tensor)
                else:
                    hashes[c.tensor] = [one[i][c.tensor]["sha256"] for i in (0, 1)]
        elif broken:
            unobservable.add(chunk[0].tensor)
        else:
            for c in chunk:
                hashes[c.tensor] = [outs[i][c.tensor]["sha256"] for i in (0, 1)]
        bar.update(len(chunk))
    bar.close()
    return hashes, unobservable, seen


def _tensor_rows(model, cands: list, hashes: dict, unobservable: set, outputs: list, at_level) -> list[TensorRow]:
    """One row per candidate intermediate and per graph output, in topological order (outputs last at a tie)."""
    rows = []
    for c in cands:
        r = TensorRow(c.position, c.node, c.op_type, c.tensor)
        if c.tensor in unobservable:
            r.observable, r.same = False, True
        else:
            r.sha_a, r.sha_b = hashes[c.tensor]
            r.same = r.sha_a == r.sha_b
        rows.append(r)
    out_pos = len(model.graph.node)
    producer = {t: (i, n) for i, n in enumerate(model.graph.node) for t in n.output}
    for o in outputs:
        pos, node = producer.get(o, (out_pos, None))
        r = TensorRow(pos, node.name if node is not None else "", node.op_type if node is not None else "", o,
                      is_output=True, sha_a=at_level[0][o]["sha256"], sha_b=at_level[1][o]["sha256"])
        r.same = r.sha_a == r.sha_b
        rows.append(r)
    rows.sort(key=lambda r: (r.position, r.is_output))
    return rows


def _mark_first_divergent(rows: list[TensorRow]) -> list[TensorRow]:
    """Flag (and return) the observable rows at the first position where the hosts differ."""
    diverging = [r for r in rows if r.observable and not r.same]
    if not diverging:
        return []
    first = [r for r in diverging if r.position == diverging[0].position]
    for r in first:
        r.first_divergent = True
    return first


def _add_distances(rows: list[TensorRow], got) -> None:
    """Remaining precision of the first divergent tensors and the outputs, from the fetched arrays `got`."""
    for r in rows:
        if r.first_divergent or r.is_output:
            a, b = got[0][r.tensor]["array"], got[1][r.tensor]["array"]
            if a.shape == b.shape and a.dtype == b.dtype:
                for k, v in _distance_fields(a, b).items():
                    setattr(r, k, v)


def _table_check(host: HostRequest, variant_id: str, fixture_id: str, explained: dict, tables_root) -> str:
    """Compare the explained run's output hashes with the host's rows in the outputs table, if any."""
    try:
        t = load_outputs(host=host.spec.name, variant_id=variant_id, fixture_id=fixture_id,
                         session_key=session_key(host.session), tensors=False, tables_root=tables_root or TABLES_DIR)
    except UserError:
        return "no rows"
    if t.num_rows == 0:
        return "no rows"
    stored = {}
    for fp, o, s in zip(*(t.column(c).to_pylist() for c in ("fingerprint_id", "output_name", "sha256"))):
        stored.setdefault(fp, {})[o] = s
    now = {o: v["sha256"] for o, v in explained.items()}
    return "match" if any(v == now for v in stored.values()) else "differs"


def _trend(res: LocalizeResult, untyped) -> str:
    if not res.first and res.stopped:
        return f"stopped before a divergent tensor was found ({res.stopped})"
    if not res.first:
        return "no divergence: every observable tensor and every output is byte-identical"
    first_bits = [r.bits_mean for r in res.first if r.bits_mean is not None]
    out_bits = [r.bits_mean for r in res.outputs if r.bits_mean is not None]
    differing_outputs = [r for r in res.outputs if not r.same]
    after = [r for r in res.rows if r.observable and r.position > res.first[0].position and not r.is_output]
    spread = sum(1 for r in after if not r.same)
    if not differing_outputs:
        return (f"attenuates: absorbed before the outputs (outputs byte-identical; {spread}/{len(after)} "
                f"downstream tensors differ)")
    if first_bits and out_bits:
        fb, ob = min(first_bits), min(out_bits)
        word = "grows" if ob < fb else ("attenuates" if ob > fb else "holds")
        return (f"{word}: remaining precision {fb:.1f} bits at the first divergent node, {ob:.1f} at the outputs; "
                f"{spread}/{len(after)} downstream tensors differ")
    return f"reaches the outputs: {len(differing_outputs)} output(s) differ; {spread}/{len(after)} downstream tensors differ"


def summary(res: LocalizeResult) -> str:
    """The few lines a person reads."""
    lines = [f"variant {res.variant} ({res.variant_id[:12]}), fixture {res.fixture_id[:12]}, "
             f"hosts {res.hosts[0]} vs {res.hosts[1]}",
             f"localised at graph optimisation level '{res.opt_level}', {res.group_size} intermediates per run, "
             f"{res.runs} runs per host; memory bound: {res.group_size} intermediates + outputs + arena per worker"]
    for h, ok in res.reproduces.items():
        lines.append(f"  {h}: the unmodified model at '{res.opt_level}' "
                     + ("reproduces the explained run's outputs" if ok else
                        "does NOT reproduce the explained run's outputs (a different computation is being localised)")
                     + f"; outputs table: {res.table_check.get(h, 'no rows')}")
    if res.unobservable:
        lines.append(f"  {res.unobservable} tensor(s) not observable at this level (exposing them changes the outputs)")
    if res.first:
        f0 = res.first[0]
        lines.append(f"first divergent node: {f0.node} ({f0.op_type}, position {f0.position})")
        for r in res.first:
            lines.append(f"  {r.tensor}: remaining bits mean {num(r.bits_mean, '.4g', None)}, "
                         f"min {num(r.bits_min, '.4g', None)}, max |delta| {num(r.max_abs, '.4g', None)}")
    for r in res.outputs:
        lines.append(f"output {r.tensor}: {'same' if r.same else 'differs'}; remaining bits mean {num(r.bits_mean, '.4g', None)}, "
                     f"min {num(r.bits_min, '.4g', None)}, max |delta| {num(r.max_abs, '.4g', None)}")
    lines.append(res.trend)
    return "\n".join(lines)


