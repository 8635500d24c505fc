"""`quantbench.equiv(...)`: run (or reuse) every variant on every host, then the equivalence classes of
byte-identical hosts, the decision flips against fp32 and the gates (the `equiv` command), written to the results
folder's tables, report and equiv.json."""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from quantbench.store import lazy
from quantbench.store import arrowrows, tablelock
from quantbench.analysis.decode import KINDS, NONE, NONE_HINT, check_outputs, kind_of, replaced_block_note, spec_from_sidecar
from quantbench.analysis.equiv import AnalysisRequest, EquivResult, Selection, VariantRef, analyze, reanalyze
from quantbench.analysis.gates import (DEFAULT_ATOL, DEFAULT_BUDGET, DEFAULT_RTOL, GATES, check_tolerance, parse_budget,
                                      parse_gates)
from quantbench.analysis.predict import attach_pair_kernels, attach_predictions
from quantbench.analysis.resultcache import cache_dir_of
from quantbench.api.confirm import ALL as CONFIRM_ALL, DEFAULT_CONFIRM, check_confirm, run_confirmed  # noqa: F401  (the command's choice)
from quantbench.api.options import (Fixtures, Fleet, Output, Results, Session, check_group, check_groups,
                                    check_path, check_text)
from quantbench.api.plan import fixture_params, note_plan, variants_named
from quantbench.errors import ParameterError, UserError, flag_mark, marked, render_params
from quantbench.runs.cluster import connect_plan
from quantbench.hosts.keys import local_ort_version
from quantbench.hosts.masked import unshowable
from quantbench.hosts.registry import announce_hosts_file, make_host, parse_hosts
from quantbench.runs.runner import RunPlan, announce_jobs, plan_run, run_plan
from quantbench.inputs.variantdir import latest_variants, pick_variant
from quantbench.inputs.sidecarfile import requirements_of, sidecar_for, sidecar_source
from quantbench.report.equivsection import publish_equiv

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy.module("pyarrow")

DEFAULT_HOSTS = "pi,x86"
#: what equiv's parameters take, for a caller and the command line's help: the gates `Gates.gate` names, the
#: built-in decode kinds `decode` takes besides a plug-in, and the one that makes no decisions
GATE_NAMES: tuple = GATES
DECODE_KINDS: tuple = tuple(KINDS)
NO_DECODE: str = NONE
#: the tables an equiv analysis writes, by the result's rows
TABLES = {"classes": "class_rows", "decisions": "decision_rows", "flips": "flip_rows"}


@dataclass
class Equiv:
    """An equiv analysis (analysis.equiv.EquivResult: `.analysis`), the files it wrote, the gates checked and the
    ones that failed, and what ran (`run_line`)."""

    analysis: EquivResult
    files: list
    gates: list
    failures: list
    run_line: str = ""

    def table(self, name: str) -> "pa.Table":
        """This analysis' rows of one of the tables it writes, to filter or join without reading the results folder.

        Parameters
        ----------
        name : str
            ``classes``, ``decisions`` or ``flips``.

        Returns
        -------
        pyarrow.Table
            The rows, in the table's schema (quantbench.store.tableschema).
        """
        if name not in TABLES:
            raise ParameterError("name", f"no equiv table {name!r}; one of {', '.join(TABLES)}", name)
        return arrowrows.to_arrow(name, list(getattr(self.analysis, TABLES[name])))

    @property
    def classes(self) -> "pa.Table":
        """This analysis' `classes` rows: which hosts compute byte-identical outputs, per variant."""
        return self.table("classes")

    @property
    def flips(self) -> "pa.Table":
        """This analysis' `flips` rows: each served decision that changed, per comparison."""
        return self.table("flips")

    @property
    def decisions(self) -> "pa.Table":
        """This analysis' `decisions` rows: every decoded decision on every host."""
        return self.table("decisions")

    def summary(self) -> dict:
        """What equiv.json holds, for a caller that stores or sends it.

        Returns
        -------
        dict
            The analysis id and settings, the hosts' selections, per variant its classes, per comparison its
            flips and gates.
        """
        return self.analysis.summary()

    @property
    def passed(self) -> bool:
        """Whether every gate checked passed (a failed gate is a result: `failures` says which)."""
        return not self.failures


@dataclass
class Gates:
    """The gates an equiv checks: a failed one is a result (`Equiv.failures`), the command's exit 1.

    Parameters
    ----------
    atol, rtol : float
        The tensor gate's tolerances: an element fails beyond both (Polygraphy's rule).
    budget : int or str
        The decision gate's budget per comparison: a count of flips, or a share of the decisions fp32 serves
        (``"1%"``).
    gate : str, optional
        The gates whose failure fails the analysis, comma-separated: ``tensor``, ``decision``, ``classes`` (None:
        none; every gate is still computed and reported).
    """

    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    budget: int | str = DEFAULT_BUDGET   # flips per comparison, or a share of the decisions fp32 serves ("1%")
    gate: str | None = None

    def __post_init__(self):
        """Checked as the command line checks its flags: finite tolerances >= 0 (nan passed every tensor gate), a
        whole budget >= 0, the gates' names as text."""
        for name in ("atol", "rtol"):
            check_tolerance(name, getattr(self, name))
        share = isinstance(self.budget, str) and self.budget.strip().endswith("%")
        if not share and (isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 0):
            raise ParameterError("budget", "must be a whole number of flips, at least 0, or a share of the "
                                 "decisions fp32 serves (\"1%\")", self.budget)
        parse_budget(self.budget)
        if self.gate is not None and not isinstance(self.gate, str):
            raise ParameterError("gate", "must be comma-separated gate names, e.g. 'decision,classes'", self.gate)


@dataclass
class Prepared:
    """What an equiv invocation analyses, once its hosts have run (or without running, from the tables)."""

    hosts: list
    refs: list
    fixtures_for: dict
    prefer: dict | None
    run_line: str
    duplicates: list
    plan: RunPlan | None = None
    #: host -> why its runtime does not start on its CPU (a result: the host is left out of the classes)
    not_started: dict = field(default_factory=dict)
    #: (host, variant_id) -> why the host's runtime cannot run that variant (left out of that variant's classes)
    cannot_run: dict = field(default_factory=dict)
    #: imported host -> the results its files hold (runner.HostSummary.held): the analysis takes no others of it
    held: dict = field(default_factory=dict)
    #: tier -> its profile's features: tiers this CPU cannot show, predicted (analysis.predict), never run
    predict: dict = field(default_factory=dict)
    #: (host, variant_id) -> the host whose rows it inherited (api.confirm), and the predictions that missed
    inherited: dict = field(default_factory=dict)
    misses: list = field(default_factory=list)


def run_hint(fixtures: Fixtures, session: Session) -> str:
    """The options a hint to run a missing host again repeats, each marked (errors.flag_mark): the command line
    shows their flags, the API their parameters' names."""
    parts = []
    for name, value in (("fixtures", fixtures.labels), ("images", fixtures.images),
                        ("split", None if fixtures.split == "eval" else fixtures.split), ("limit", fixtures.limit),
                        ("graph_opt", session.graph_opt), ("threads", session.threads),
                        ("providers", None if session.providers is None else ",".join(session.providers))):
        if value:
            parts.append(f" {flag_mark(name)} {value}")
    parts += [f" {flag_mark('session_config')} {k}={v}" for k, v in session.config.items()]
    return "".join(parts)


def check_decoder(variant, outputs, override, kind, threshold, override_path=None) -> None:
    """A variant's decode spec (sidecar or decode/threshold) is valid, fits its `outputs`, and runs no plug-in only
    a file names (quantbench.inputs.plugins.require)."""
    spec = spec_from_sidecar(sidecar_for(variant, override), kind, threshold,
                             source=sidecar_source(variant, override_path))
    try:
        check_outputs(spec, outputs)
    except UserError as exc:
        raise UserError(f"model {variant.model}: {marked(exc)}; or {NONE_HINT}") from None


def _measured_specs(fleet: Fleet, reference: str | None) -> tuple[list, dict]:
    """(the host specs to run, tier -> features of the ones only predicted: no machine in reach shows them)."""
    specs = [h.spec for h in parse_hosts(fleet.names(), hosts_file=fleet.hosts_file, overrides=False)]
    unshown = {s.name: f for s in specs if (f := unshowable(s)) is not None}
    if unshown and (reference in unshown or len(unshown) == len(specs)):
        name = reference if reference in unshown else specs[0].name
        why = make_host(next(s for s in specs if s.name == name)).ready()[1]
        raise UserError(f"host {name}: {why}; a tier no machine in reach shows is only predicted, from measured hosts")
    specs = [s for s in specs if s.name not in unshown]
    if reference and reference not in [s.name for s in specs]:
        raise UserError(f"{flag_mark('reference')} {reference}: not one of {flag_mark('hosts')} "
                        f"{','.join(s.name for s in specs)}")
    return specs, unshown


def _ran(prep: Prepared, summary) -> None:
    """What the hosts' runs tell the analysis: the selections measured, hosts that do not start or cannot run a
    variant, what an imported host holds."""
    prep.run_line = "runs: " + "; ".join(f"{h.name} {h.ran} ran, {h.cached + h.imported} reused" for h in summary.hosts)
    prep.prefer = {h.name: (h.fingerprint_id, h.session_key) for h in summary.hosts if h.fingerprint_id and h.measured}
    prep.not_started = {h.name: h.does_not_start for h in summary.hosts if h.does_not_start}
    prep.cannot_run = {(h.name, vid): why for h in summary.hosts for vid, why in h.cannot_run.items()}
    prep.held = {h.name: h.held for h in summary.hosts if h.held is not None}
    prep.hosts = [n for n in prep.hosts if n not in prep.not_started]


@dataclass
class _Request:
    """One equiv invocation's choices, as prepare() takes them."""

    fleet: Fleet
    fixtures: Fixtures
    session: Session
    results: Results
    output: Output
    reference: str | None
    decode: str | None
    threshold: float | None
    run: bool
    jobs: int | None
    cluster: str | None
    shard: str | None
    wait: bool
    render: object
    confirm: int | None = None   # analysis.confirm's K; None: every host runs every fixture


def prepare(req: _Request, held: contextlib.ExitStack, variants: list) -> Prepared:
    """Hosts, variants and fixtures of an equiv invocation (runs.runner.plan_run); runs the hosts unless told
    not to, holding the tables lock in `held` through the runs and the table writes after the analysis."""
    jobs = announce_jobs(req.jobs, to_stderr=req.output.json)   # capped at the cores
    specs, unshown = _measured_specs(req.fleet, req.reference)
    params = fixture_params(req.fixtures)

    replaced: dict = {}

    def decoder_fits(v, outputs):   # a bad decode block fails before any run
        check_decoder(v, outputs, params["sidecar"], req.decode, req.threshold, req.fixtures.sidecar)
        note = replaced_block_note(sidecar_for(v, params["sidecar"]), req.decode)
        if note:
            replaced.setdefault(v.model, note)

    # each host runs its own deployed session, the session options given override it; a host that cannot run
    # writes nothing
    plan = plan_run(specs, variants, **params, session=req.session.overrides(), command="equiv",
                    check_hosts=req.run, check_variant=decoder_fits, shard=req.shard)
    note_plan(plan, req.output.json, req.render)
    for model, note in sorted(replaced.items()):
        print(f"note: model {model}: {note}", file=sys.stderr if req.output.json else sys.stdout)
    cluster = held.enter_context(connect_plan(req.cluster, plan)) if req.cluster and req.run else None
    root = req.results.tables
    held.enter_context(tablelock.lock(root, wait=req.wait))
    asked = {str(vi.path.resolve()): v for v, vi in reversed(plan.asked)}   # the first variant asked of each file
    refs = [VariantRef(name=vi.name, variant_id=vi.variant_id, model=vi.model, path=str(vi.path),
                       sidecar=sidecar_for(asked[str(vi.path.resolve())], params["sidecar"]),
                       requirements=requirements_of(vi)) for vi in plan.variants]
    fixtures_for = {vid: sorted({fx.fixture_id for fx in fxs}) for vid, fxs in plan.fixtures_for.items()}
    prep = Prepared(list(plan.names), refs, fixtures_for, None, f"runs: none ({flag_mark('no_run')}: results from the "
                    "tables)", duplicate_variants(plan), plan, predict=unshown)
    if req.run:
        def run(p, board):
            return run_plan(p, progress=req.output.bars(), tables_root=root, jobs=jobs, cluster=cluster,
                            require_providers=req.session.require_providers, confirm=board)

        with arrowrows.run_scope(plan.run_id):
            done = run_confirmed(plan, req.confirm, run, req.reference, root)
        prep.inherited, prep.misses = done.inherited, done.misses
        _ran(prep, done.summary)
    return prep


def duplicate_variants(plan) -> list[dict]:
    """Variants asked for whose model is semantically identical to an analysed one (run once, named in the report)."""
    kept = {vi.variant_id: vi for vi in plan.variants}
    analysed = {str(vi.path.resolve()) for vi in plan.variants}
    out = []
    for v, vi in plan.asked:
        if str(Path(v.path).resolve()) in analysed:
            continue
        first = kept.get(vi.variant_id)
        if first is not None and first.name != v.name:
            out.append({"name": v.name, "model": v.model, "path": str(v.path), "duplicate_of": first.name})
    return out


def publish(result, results: Results, gates=None, checked=None, plots: bool = True, labels=None,
            images=None, render=render_params) -> list:
    """Write what an analysis leaves behind (quantbench.report.equivsection.publish_equiv): `gates` are what its verdict lines
    state (default: `checked`, the gates checked); `render` names the parameters the report points at (the
    command line: their flags); returns the files written."""
    result.settings["gates"] = list(gates) if gates else list(checked or [])
    return publish_equiv(result, results.folder, results.tables, plots=plots, fixtures=labels, images=images,
                         render=render)


def rerender(results: Results = Results(), equiv_id: str | None = None, labels=None, images=None,
             plots: bool = True, render=render_params) -> tuple:
    """The report re-rendered from the tables, without running anything (the `report` command): an equiv analysis
    computed again with the settings it ran with, report.md and its plots written.

    Parameters
    ----------
    results : Results
        The results folder whose tables hold the analysis.
    equiv_id : str, optional
        The analysis' id or a prefix of it (None: the last equiv's, else the only one).
    labels, images : str, optional
        Labels and their images for the accuracy (None: the ones that analysis read).
    plots : bool
        Draw the class map and margin histograms (False: faster, text only).
    render : callable
        Names a parameter in the report's hints (the command line: its flag).

    Returns
    -------
    tuple of (EquivResult, list of Path)
        The analysis and the files written.
    """
    check_groups(results=results)
    again = reanalyze(results.folder, equiv_id)
    if not labels:   # the labels that analysis read
        labels, images = again.labels.get("fixtures"), images or again.labels.get("images")
    files = publish(again.result, results, gates=again.result.settings["gates"], plots=plots, labels=labels,
                    images=images, render=render)
    return again.result, files


def _check_request(gates: Gates, decode: str | None) -> list:
    """The gates checked, once the request's tolerances and gates are valid (before any work)."""
    checked = parse_gates(gates.gate)   # a typo in the gates fails before any work
    parse_budget(gates.budget)          # and so does a budget that is neither a count nor a share
    if "decision" in checked and decode is not None and not kind_of(decode).decides:
        raise UserError(f"{flag_mark('gate')} decision with {flag_mark('decode')} none: no decisions are compared; drop one "
                        "of them")
    if gates.atol < 0 or gates.rtol < 0:
        raise UserError(f"{flag_mark('atol')} {gates.atol} / {flag_mark('rtol')} {gates.rtol}: tolerances must be >= 0")
    return checked


def _one_variant(variant, variants):
    """`variants`, or for `variant` (a name of the last calibrate run, or an .onnx file) that variant with the run's
    fp32 beside it (the reference its flips count against; alone when it is fp32 or the run has none)."""
    if variant is None:
        return variants
    if variants:
        raise ParameterError("variant", "give one variant by name or a list of variants, not both", variant)
    chosen = pick_variant(str(variant))
    if chosen.name == "fp32" or Path(str(variant)).suffix == ".onnx":
        return [chosen]
    fp32 = next((v for v in latest_variants() if v.name == "fp32"), None)
    return [chosen] if fp32 is None else [fp32, chosen]


def equiv(variants=None, fleet: Fleet = Fleet(DEFAULT_HOSTS), fixtures: Fixtures = Fixtures(),
          session: Session = Session(), results: Results = Results(), output: Output = Output(),
          gates: Gates = Gates(), fp32=None, reference: str | None = None, decode: str | None = None,
          threshold: float | None = None, run: bool = True, jobs: int | None = None, cluster: str | None = None,
          shard: str | None = None, plots: bool = True, wait: bool = True, render=render_params,
          variant: str | None = None, confirm: int | str = DEFAULT_CONFIRM) -> Equiv:
    """Run every variant on each host of `fleet`, then analyse: which hosts compute byte-identical outputs
    (classes), which served decisions flip against fp32, and the gates. Writes the tables, report and equiv.json
    under `results` (the `equiv` command).

    Parameters
    ----------
    variants : str, path or list, optional
        Variants folders or .onnx files (None: the latest calibrate output).
    fleet : Fleet
        The hosts.
    fixtures : Fixtures
        The labelled images run (default: the eval split of the labels the variants were calibrated with).
    session : Session
        Session options overriding each host's deployed session.
    results : Results
        Where the tables, report and equiv.json go.
    output : Output
        Progress and what is printed.
    gates : Gates
        Tolerances, budget and the gates whose failure fails the analysis.
    fp32 : str or path, optional
        The float model of already-quantized variants, which their flips count against.
    reference : str, optional
        The reference host every other one is compared with (None: the first).
    decode : str, optional
        How outputs become decisions: a decode kind, a plug-in, or ``none`` (None: the sidecar's).
    threshold : float, optional
        The score threshold of a served decision (None: the sidecar's).
    run : bool
        Run the hosts first (False: analyse what the tables hold, running nothing).
    jobs, cluster, shard : int, str, str, optional
        How the hosts run, as `quantbench.run` takes them: worker processes in total, the Dask scheduler of the
        emulated hosts, this machine's shard ``K/N`` of the fixtures.
    plots : bool
        Draw the report's plots (False: faster, text only).
    wait : bool
        Wait for another command holding the tables (False: refuse at once).
    render : callable
        Names a parameter in a note or hint (the command line: its flag).
    variant : str, optional
        One variant by name (of the last calibrate run) or .onnx file, analysed beside that run's fp32 as the
        reference it flips against (instead of `variants`).
    confirm : int or str
        K: a host predicted, in the run, to share a class with one run in full runs K confirming fixtures first
        and inherits the others when they are byte-identical (analysis.confirm); ``"all"``: every fixture on
        every host.

    Returns
    -------
    Equiv
        The analysis, the files written and the gates that failed (`Equiv.failures`: a failed gate is a result,
        not an exception).
    """
    check_groups(fleet=fleet, fixtures=fixtures, session=session, results=results, output=output)
    check_group("gates", gates, Gates)
    check_path("fp32", fp32)
    check_text("cluster", cluster)
    if variant is not None and not isinstance(variant, (str, os.PathLike)):
        raise ParameterError("variant", "must be a variant name or an .onnx path", variant)
    checked = _check_request(gates, decode)
    k = check_confirm(confirm)
    resolved = variants_named(_one_variant(variant, variants), fp32, to_stderr=output.json)   # the demo says so first
    announce_hosts_file(fleet.hosts_file, to_stderr=output.json)
    req = _Request(fleet, fixtures, session, results, output, reference, decode, threshold, run, jobs, cluster,
                   shard, wait, render, k)
    with contextlib.ExitStack() as held:   # prepare() takes the tables lock once its inputs are valid
        p = prepare(req, held, resolved)
        selection = Selection(hosts=p.hosts, variants=p.refs, fixtures_for=p.fixtures_for, prefer=p.prefer,
                              cannot_run=p.cannot_run, held=p.held)
        result = analyze(AnalysisRequest(
            selection, reference=reference, decode_kind=decode, threshold=threshold, atol=gates.atol,
            rtol=gates.rtol, budget=gates.budget, run_hint=run_hint(fixtures, session), tables_root=results.tables,
            duplicates=p.duplicates, cache_dir=cache_dir_of(results.folder)))
        result.not_started = p.not_started
        names = {r.variant_id: r.name for r in p.refs}
        result.prediction_misses = [dict(m, variant=names.get(m["variant_id"])) for m in p.misses]
        attach_predictions(result, p.refs, p.predict, local_ort_version())
        attach_pair_kernels(result, p.refs, local_ort_version())
        files = publish(result, results, checked=checked, plots=plots, labels=p.plan.labels,
                        images=p.plan.images, render=render)
        failures = result.gate_failures(checked)   # after the files: a gate's refusal still leaves the report
    return Equiv(result, files, checked, failures, p.run_line)
