"""Noise floors per host: which factors move the bytes on one host, before blaming another host.

The protocol of the SKU-attribution study, one factor at a time, on each host on
its own:

* repeat - the same session run twice on every fixture. It must be bit-identical;
  anything else is a harness fault (reported as such, not as noise);
* threads - intra-op threads 1 against N;
* batch - each fixture alone against inside a batch of 8 (batch composition);
  only for models whose batch axis is dynamic (a fixed axis is said in the row);
* opt_level - graph optimisation level basic against all;
* deployed_threads - one intra-op thread against the host's deployed count (its preset or hosts file:
  4 on a Pi 5; on aarch64 the thread count changes fp32 bits);
* provider - the host's execution providers against the CPU provider alone.

Each factor is a row: same bytes or not, how many fixtures differ, and the
decision flips between the two settings (decoded as the model's sidecar says).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from quantbench.analysis.decisions import compare
from quantbench.errors import ParameterError, UserError
from quantbench.explain.localize import decode_runs
from quantbench.hosts.deploy import thread_limit
from quantbench.hosts.startup import open_worker
from quantbench.inputs.modelio import load_model, semantic_sha256
from quantbench.textfmt import text_table

FACTORS = ("repeat", "threads", "batch", "opt_level", "deployed_threads", "provider")


@dataclass
class NoiseRow:
    host: str
    fingerprint_id: str
    variant_id: str
    variant: str
    factor: str
    setting_a: str
    setting_b: str
    fixtures: int
    same_bytes: bool | None
    differing_fixtures: int | None
    flips: int | None
    harness_fault: bool
    note: str = ""

    def row(self) -> dict:
        return asdict(self)


def batch_axis(m) -> str:
    """'dynamic', or the fixed leading dimension of the (single) input of ModelProto `m` as text."""
    init = {i.name for i in m.graph.initializer}
    ins = [i for i in m.graph.input if i.name not in init]
    if len(ins) != 1:
        return f"{len(ins)} inputs"
    dims = ins[0].type.tensor_type.shape.dim
    if not dims:
        return "scalar input"
    d = dims[0]
    return str(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else "dynamic"


def _compare(spec, a: list, b: list, names, fixtures) -> tuple[int, int | None, set]:
    """(differing fixtures, decision flips or None, fixture ids that differ; `fixtures` give the decoder their
    geometry)."""
    ha = {r["fixture_id"]: {k: v["sha256"] for k, v in r["outputs"].items()} for r in a}
    hb = {r["fixture_id"]: {k: v["sha256"] for k, v in r["outputs"].items()} for r in b}
    differ = {f for f in ha if ha[f] != hb.get(f)}
    flips = None
    if spec is not None:
        da, db = decode_runs(spec, a, names, fixtures), decode_runs(spec, b, names, fixtures)
        flips = sum(len(compare(spec, da[f], db[f]).flips) for f in da)
    return len(differ), flips, differ


def _row_note(note: str, fault: bool, no_spec: bool) -> str:
    """A noise row's note: its own, then a harness fault (one session, same inputs, different bytes) and a missing
    decode spec."""
    if fault:
        note = (note + "; " if note else "") + ("HARNESS FAULT: one session, same inputs, different bytes "
                                                "(check preprocessing, threads, the worker)")
    if no_spec:
        note = (note + "; " if note else "") + "no decode spec: flips not counted"
    return note


def _batch_unmeasurable(proto, fixtures) -> str | None:
    """Why batch composition cannot be measured on this model and these fixtures (None: it can)."""
    axis = batch_axis(proto)
    return (f"model batch axis is fixed ({axis}): batch composition not measurable"
            if axis != "dynamic" else "needs at least 2 fixtures" if len(fixtures) < 2 else None)


def _setting(factor: str, base: dict) -> tuple[str, str, dict | None, str]:
    """(setting a: the host's, setting b, the session of b or None when there is nothing to compare, note) of a
    factor that changes one session option against the host's deployed session `base`."""
    if factor == "opt_level":
        lvl = base["graph_optimization_level"]
        other = "basic" if lvl != "basic" else "all"
        return f"graph_opt={lvl}", f"graph_opt={other}", dict(base, graph_optimization_level=other), ""
    if factor == "deployed_threads":
        n = base["intra_op_num_threads"]
        same = "the host deploys 1 intra-op thread: nothing to compare" if n == 1 else ""
        return f"threads={n} (deployed)", "threads=1", None if same else dict(base, intra_op_num_threads=1), same
    providers = list(base["providers"])
    cpu = ["CPUExecutionProvider"]
    same = "the host runs the CPU provider only: nothing to compare" if providers == cpu else ""
    return ("providers=" + ">".join(providers), "providers=CPUExecutionProvider",
            None if same else dict(base, providers=cpu), same)


#: N of the threads factor when none is given: at most the cores a host runs on
DEFAULT_THREADS = 4


def check_threads(threads, hosts) -> int:
    """N of the threads factor (1 thread against N) on `hosts` (hosts.registry.HostRequest): the one given, else
    DEFAULT_THREADS; at most the cores each host runs on (hosts.deploy.thread_limit: onnxruntime starts every
    thread asked for, and 100000 never finished, growing 30 MB/s), at least 2."""
    limit, name = min((thread_limit(h.spec), h.label) for h in hosts)
    if threads is None:
        return max(2, min(DEFAULT_THREADS, limit))
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 2:
        raise ParameterError("threads", "must be at least 2 (the factor compares 1 thread against N)", threads)
    most = max(2, limit)   # on one core the factor still compares 1 thread against 2
    if threads > most:
        raise ParameterError("threads", f"more than the {limit} cores host {name} runs on; use at most {most}",
                             threads)
    return threads


def check_factors(factors) -> list:
    """The factors to measure, each known, at least one (an empty list measured nothing and printed an empty
    table)."""
    factors = list(factors)
    if not factors:
        raise ParameterError("factors", f"name at least one factor of {', '.join(FACTORS)}")
    bad = [f for f in factors if f not in FACTORS]
    if bad:
        raise ParameterError("factors", f"unknown factor(s) {', '.join(bad)}; choose from {', '.join(FACTORS)}")
    return factors


def _check_request(factors, fixtures, batch) -> None:
    check_factors(factors)
    if "batch" in factors and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 2):
        raise ParameterError("batch", "must be at least 2 (each fixture alone against inside a batch of that size)",
                             batch)
    if not fixtures:
        raise UserError("noise: no fixtures")


def noise_floor(model_path, host, fixtures, spec=None, threads: int | None = None, batch: int = 8,
                factors=FACTORS, variant_name: str = "", require_providers: bool = False,
                variant_id: str | None = None, model=None) -> list[NoiseRow]:
    """The noise rows of one host (a hosts.registry.HostRequest) for one variant; `spec` a DecodeSpec or None;
    `variant_id` its semantic hash and `model` its parsed ModelProto when the caller has them (the run plan:
    the file is not parsed again)."""
    _check_request(factors, fixtures, batch)
    proto = model if model is not None else load_model(model_path, check=False)  # the variant id, the batch axis
    data = Path(model_path).read_bytes()   # the bytes each run sends
    vid = variant_id or semantic_sha256(proto)
    vname = variant_name or Path(model_path).stem
    names = list(spec.outputs.values()) if spec is not None else []
    want = names or False
    base = dict(host.session)
    rows: list[NoiseRow] = []
    w = open_worker(host, require_providers)
    try:
        def row(factor, sa, sb, a, b, note=""):
            differ, flips, _ = _compare(spec, a, b, names, fixtures)
            fault = factor == "repeat" and differ > 0
            note = _row_note(note, fault, spec is None)
            rows.append(NoiseRow(host.label, w.fingerprint_id, vid, vname, factor, sa, sb, len(a), differ == 0, differ,
                                 flips, fault, note))

        first = w.run(data, fixtures, base, return_tensors=want, repeat=2 if "repeat" in factors else 1)
        ref = [r for r in first if r["repeat"] == 0]
        fell_back = "; ".join(f"requested {p}" for p in w.provider_problems)  # the host's own providers' run
        if "repeat" in factors:
            again = [r for r in first if r["repeat"] == 1]
            row("repeat", "run 1", "run 2", ref, again)
        if "threads" in factors:
            n = check_threads(threads, [host])
            a_t = base["intra_op_num_threads"]
            other = n if a_t == 1 else 1
            res = w.run(data, fixtures, dict(base, intra_op_num_threads=other), return_tensors=want)
            row("threads", f"threads={a_t}", f"threads={other}", ref, res)
        if "batch" in factors:
            unmeasurable = _batch_unmeasurable(proto, fixtures)
            if unmeasurable:
                rows.append(NoiseRow(host.label, w.fingerprint_id, vid, vname, "batch", "batch=1", f"batch={batch}",
                                     len(ref), None, None, None, False, unmeasurable))
            else:
                b = min(int(batch), len(fixtures))
                res = w.run(data, fixtures, dict(base, batch=b), return_tensors=want)
                row("batch", "batch=1", f"batch={b}", ref, res)
        for factor in ("opt_level", "deployed_threads", "provider"):
            if factor in factors:
                sa, sb, other, note = _setting(factor, base)
                if other is None:
                    rows.append(NoiseRow(host.label, w.fingerprint_id, vid, vname, factor, sa, sb, len(ref), None,
                                         None, None, False, note))
                else:
                    res = w.run(data, fixtures, other, return_tensors=want)
                    row(factor, sa, sb, ref, res, fell_back if factor == "provider" else "")
    finally:
        w.close()
    return rows


def table(rows: list[NoiseRow]) -> str:
    head = ("host", "factor", "a", "b", "fixtures", "same bytes", "differ", "flips", "note")
    return text_table(head, [(r.host, r.factor, r.setting_a, r.setting_b, r.fixtures,
                              None if r.same_bytes is None else ("yes" if r.same_bytes else "NO"),
                              r.differing_fixtures, r.flips, r.note) for r in rows])
