"""`quantbench search`: the recipe that holds on the whole fleet, written as a variant (or why none was found)."""

from __future__ import annotations

from pathlib import Path

from quantbench.analysis.decode import decode_arg, spec_for_variant
from quantbench.analysis.gates import DEFAULT_BUDGET
from quantbench.cli.groups import ExplainArgs
from quantbench.cli.runplan import explain_run
from quantbench.errors import UserError, render_params
from quantbench.explain.search import SPACES, SearchParams, search
from quantbench.explain.searchreport import summary, update_report
from quantbench.inputs.sidecarfile import check_identity
from quantbench.inputs.variantdir import latest_variants, pick_variant

HELP = ("Search recipes (global remedies, calibration, nodes kept in float) for the one that meets a decision budget "
        "on every host, and write it as a variant.")


EXPLAIN = ExplainArgs(variant_required=False)  # default: the last calibrate run's first static variant


def add_arguments(p) -> None:
    EXPLAIN.add(p)
    p.add_argument("--budget", type=int, default=DEFAULT_BUDGET,
                   help="decision flips against fp32 allowed per host (as `equiv --gate decision` counts them)")
    p.add_argument("--max-float-share", type=float, help="ceiling on the share of weights kept in float (0..1)")
    p.add_argument("--max-size", type=int, help="ceiling on the variant's file size, bytes")
    p.add_argument("--max-latency-ms", type=float,
                   help="ceiling on a confirmed candidate's median latency, ms, on every host that measures latency "
                        "(local, ssh); cached, so a rerun walks the same way")
    p.add_argument("--max-evaluations", type=int, default=200, help="fleet evaluations (candidate x host) to spend")
    p.add_argument("--max-seconds", type=float, help="wall time to spend")
    p.add_argument("--space", choices=SPACES, default="all",
                   help="global choices, nodes kept in float, or both (default)")
    p.add_argument("--screen-fixtures", type=int, default=4, help="fixtures nearest the threshold screened first")
    p.add_argument("--error-images", type=int, default=4, help="calibration images per-node error is measured on")
    p.add_argument("--limit", type=int, help="eval fixtures to confirm on (default: every one of the split)")
    p.add_argument("--jobs", type=int, default=1, help="hosts run at once")
    p.add_argument("--name", help="name of the written variant (default: named for what it is)")
    p.add_argument("--decode", type=decode_arg, metavar="KIND", help="decode kind (default: the model's sidecar)")


def _base(text):
    if text:
        return pick_variant(text)
    statics = [v for v in latest_variants() if (v.recipe or {}).get("method") == "static"]
    if not statics:
        raise UserError("the last calibrate run has no static variant to search from; pass --variant")
    return statics[0]


def run(args) -> int:
    ex = EXPLAIN.parse(args)
    base = _base(ex.variant)
    hosts, plan = explain_run(ex, base, args.limit, render=getattr(args, "_render", render_params))
    (vi,) = plan.variants
    fp32 = pick_variant("fp32") if ex.variant is None or not Path(ex.variant).exists() else None
    if fp32 is None:
        raise UserError(f"--variant {ex.variant}: give a variant name of the last calibrate run (the search "
                        "re-makes it from the ranges and prepared model calibrate left beside it)")
    check_identity(fp32)
    spec = spec_for_variant(base, args.decode, vi.outputs)
    if spec is None:
        raise UserError(f"{base.path}: no decoder; search counts decision flips, so pass --decode KIND")
    params = SearchParams(args.budget, args.max_float_share, args.max_size, args.max_latency_ms, args.max_evaluations,
                          args.max_seconds, args.space, args.screen_fixtures, args.error_images, args.jobs, args.name)
    result = search(base, fp32.path, hosts, plan.fixtures_for[vi.variant_id], spec, params, ex.results.folder / "search")
    print(summary(result))
    print(f"report: {update_report(result, ex.results.folder)}")
    return 0 if result.written else 1
