"""`quantbench equiv`: equivalence classes across hosts and decision flips against fp32."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

from quantbench import tables
from quantbench.analysis.decode import (KINDS, NONE, NONE_HINT, check_outputs, decode_arg, kind_of, replaced_block_note,
                                        spec_from_sidecar)
from quantbench.analysis.equiv import VariantRef, analyze
from quantbench.analysis.predict import attach_predictions
from quantbench.analysis.resultcache import cache_dir_of
from quantbench.analysis.gates import DEFAULT_ATOL, DEFAULT_BUDGET, DEFAULT_RTOL, GATES, parse_gates
from quantbench.commands import (add_fixture_arguments, add_jobs_argument, add_run_session_arguments, add_shard_argument,
                                 finite_float, session_from_args)
from quantbench.equivcli import finish_equiv
from quantbench.errors import UserError, marked
from quantbench.hosts.cluster import connect_plan
from quantbench.hosts.keys import local_ort_version
from quantbench.hosts.masked import unshowable
from quantbench.hosts.registry import announce_hosts_file, make_host, parse_hosts
from quantbench.hosts.runner import announce_jobs, plan_run, run_plan
from quantbench.recipe import sidecar_for, sidecar_source
from quantbench.runargs import fixture_params, note_plan, variants_from_args

HELP = ("Run (or reuse) every variant on every host, then report equivalence classes of byte-identical hosts, "
        "decision flips against fp32, count concealment, margins and the tensor vs decision gates.")


def add_arguments(p) -> None:
    p.add_argument("--hosts", default="pi,x86",
                   help="comma-separated host names (built-ins, emulated presets, or names from the hosts file)")
    p.add_argument("--variants", nargs="+", metavar="DIR_OR_FILE",
                   help="variant folders or .onnx files (one of them the fp32 model); default: the latest calibrate output")
    p.add_argument("--fp32", metavar="FILE",
                   help="the float model the --variants (an already-quantized file) flip against; without an fp32 "
                        "model, flips count against the same file on the reference host")
    add_fixture_arguments(p, "compare")
    p.add_argument("--reference", help="reference host for cross-host comparisons (default: the first of --hosts)")
    p.add_argument("--decode", type=decode_arg, metavar="KIND",
                   help=f"how outputs become decisions: {', '.join(KINDS)}, {NONE} (classes and tensor gate only), "
                        "or a plug-in module:function / path/to/file.py:function (default: the model sidecar's "
                        "'decode' block; none without one)")
    p.add_argument("--threshold", type=finite_float, help="decision threshold (default: the sidecar's)")
    p.add_argument("--atol", type=finite_float, default=DEFAULT_ATOL, help="tensor gate absolute tolerance")
    p.add_argument("--rtol", type=finite_float, default=DEFAULT_RTOL, help="tensor gate relative tolerance")
    p.add_argument("--budget", type=int, default=DEFAULT_BUDGET, help="decision gate: flips allowed per comparison")
    p.add_argument("--gate", metavar="NAMES",
                   help=f"comma-separated conditions that make the exit code 1 when they fail: {', '.join(GATES)} "
                        "(tensor and decision apply to every comparison; classes: every variant is one class)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of text")
    p.add_argument("--no-run", action="store_true",
                   help="use only results already in the tables (e.g. hosts run with other session options)")
    add_run_session_arguments(p)
    add_jobs_argument(p)
    add_shard_argument(p)
    p.add_argument("--hosts-file", metavar="FILE", help="TOML hosts file (default: quantbench.toml if present)")
    p.add_argument("--results", default="results", metavar="DIR", help="results folder (tables under DIR/tables)")
    p.add_argument("--no-plots", action="store_true", help="no PNG plots in the report")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--no-wait", action="store_true",
                   help="fail at once (exit 2) if another run/equiv holds the tables folder's lock, instead of waiting")


def _run_hint(args) -> str:
    parts = []
    if args.fixtures:
        parts.append(f" --fixtures {args.fixtures}")
    if args.images:
        parts.append(f" --images {args.images}")
    if args.split != "eval":
        parts.append(f" --split {args.split}")
    if args.limit:
        parts.append(f" --limit {args.limit}")
    if args.graph_opt is not None:
        parts.append(f" --graph-opt {args.graph_opt}")
    if args.threads is not None:
        parts.append(f" --threads {args.threads}")
    if args.providers is not None:
        parts.append(f" --providers {args.providers}")
    for e in args.session_config:
        parts.append(f" --session-config {e}")
    return "".join(parts)


def check_decoder(variant, outputs, override, kind, threshold, override_path=None) -> None:
    """A variant's decode spec (sidecar or --decode/--threshold) is valid, fits its `outputs`, and runs no
    plug-in only a file names (quantbench.plugins.require)."""
    spec = spec_from_sidecar(sidecar_for(variant, override), kind, threshold,
                             source=sidecar_source(variant, override_path))
    try:
        check_outputs(spec, outputs)
    except UserError as exc:
        raise UserError(f"model {variant.model}: {marked(exc)}; or {NONE_HINT}") from None


@dataclass
class Prepared:
    """What an equiv invocation analyses, once its hosts have run (or with --no-run, from the tables)."""

    hosts: list
    refs: list
    fixtures_for: dict
    prefer: dict | None
    results: Path
    tables: Path
    run_line: str
    duplicates: list
    #: host -> why its runtime does not start on its CPU (a result: the host is left out of the classes)
    not_started: dict = field(default_factory=dict)
    #: (host, variant_id) -> why the host's runtime cannot run that variant (left out of that variant's classes)
    cannot_run: dict = field(default_factory=dict)
    #: imported host -> the results its files hold (runner.HostSummary.held): the analysis takes no others of it
    held: dict = field(default_factory=dict)
    #: tier -> its profile's features: tiers this CPU cannot show, predicted (analysis.predict), never run
    predict: dict = field(default_factory=dict)


def prepare(args, held: contextlib.ExitStack, variants: list) -> Prepared:
    """Hosts, variants and fixtures of an equiv invocation (hosts.runner.plan_run); runs the hosts unless
    --no-run, holding the tables lock in `held` through the runs and the table writes of finish()."""
    if args.atol < 0 or args.rtol < 0:
        raise UserError(f"--atol {args.atol} / --rtol {args.rtol}: tolerances must be >= 0")
    args.jobs = announce_jobs(args.jobs, to_stderr=getattr(args, "json", False))  # capped at the cores
    specs = [h.spec for h in parse_hosts(args.hosts, hosts_file=args.hosts_file, overrides=False)]
    unshown = {s.name: f for s in specs if (f := unshowable(s)) is not None}  # predicted, not run (analysis.predict)
    if unshown and (args.reference in unshown or len(unshown) == len(specs)):
        name = args.reference if args.reference in unshown else specs[0].name
        why = make_host(next(s for s in specs if s.name == name)).ready()[1]
        raise UserError(f"host {name}: {why}; a tier no machine in reach shows is only predicted, from measured hosts")
    specs = [s for s in specs if s.name not in unshown]
    if args.reference and args.reference not in [s.name for s in specs]:
        raise UserError(f"--reference {args.reference}: not one of --hosts {','.join(s.name for s in specs)}")
    params = fixture_params(args)

    replaced: dict = {}

    def decoder_fits(v, outputs):  # a bad decode block fails before any run
        check_decoder(v, outputs, params["sidecar"], args.decode, args.threshold, args.sidecar)
        note = replaced_block_note(sidecar_for(v, params["sidecar"]), args.decode)
        if note:
            replaced.setdefault(v.model, note)

    # each host runs its own deployed session, the session flags given override it; a host that cannot run writes nothing
    plan = plan_run(specs, variants, **params, session=session_from_args(args), command="equiv",
                    check_hosts=not args.no_run, check_variant=decoder_fits, shard=args.shard)
    note_plan(args, plan)
    for model, note in sorted(replaced.items()):
        print(f"note: model {model}: {note}", file=sys.stderr if getattr(args, "json", False) else sys.stdout)
    cluster = held.enter_context(connect_plan(args.cluster, plan)) if args.cluster and not args.no_run else None
    results = Path(args.results)
    root = results / "tables"
    held.enter_context(tables.lock(root, wait=not getattr(args, "no_wait", False)))
    prefer, not_started, cannot_run, held = None, {}, {}, {}
    run_line = "runs: none (--no-run: results from the tables)"
    if not args.no_run:
        with tables.run_scope(plan.run_id):
            summary = run_plan(plan, progress=not args.no_progress, tables_root=root, jobs=args.jobs, cluster=cluster,
                               require_providers=args.require_providers)
        run_line = "runs: " + "; ".join(f"{h.name} {h.ran} ran, {h.cached + h.imported} reused" for h in summary.hosts)
        prefer = {h.name: (h.fingerprint_id, h.session_key) for h in summary.hosts
                  if h.fingerprint_id and h.measured}
        not_started = {h.name: h.does_not_start for h in summary.hosts if h.does_not_start}
        cannot_run = {(h.name, vid): why for h in summary.hosts for vid, why in h.cannot_run.items()}
        held = {h.name: h.held for h in summary.hosts if h.held is not None}
    asked = {str(vi.path.resolve()): v for v, vi in reversed(plan.asked)}  # the first variant asked of each file
    refs = [VariantRef(name=vi.name, variant_id=vi.variant_id, model=vi.model, path=str(vi.path),
                       sidecar=sidecar_for(asked[str(vi.path.resolve())], params["sidecar"])) for vi in plan.variants]
    fixtures_for = {vid: sorted({fx.fixture_id for fx in fxs}) for vid, fxs in plan.fixtures_for.items()}
    return Prepared([n for n in plan.names if n not in not_started], refs, fixtures_for, prefer, results, root,
                    run_line, duplicate_variants(plan), not_started, cannot_run, held, unshown)


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


def run(args) -> int:
    gates = parse_gates(args.gate)  # a typo in --gate fails before any work
    if "decision" in gates and args.decode is not None and not kind_of(args.decode).decides:
        raise UserError("--gate decision with --decode none: no decisions are compared; drop one of them")
    variants = variants_from_args(args, to_stderr=args.json)  # the demo says so first
    announce_hosts_file(args.hosts_file, to_stderr=args.json)
    with contextlib.ExitStack() as held:  # prepare() takes the tables lock once its inputs are valid
        p = prepare(args, held, variants)
        result = analyze(p.hosts, p.refs, p.fixtures_for, reference=args.reference, decode_kind=args.decode,
                         threshold=args.threshold, atol=args.atol, rtol=args.rtol, budget=args.budget,
                         prefer=p.prefer, run_hint=_run_hint(args), tables_root=p.tables, duplicates=p.duplicates,
                         cache_dir=cache_dir_of(p.results), cannot_run=p.cannot_run, held=p.held)
        result.not_started = p.not_started
        attach_predictions(result, p.refs, p.predict, local_ort_version())
        return finish_equiv(result, args, p.results, p.tables, run_line=p.run_line)
