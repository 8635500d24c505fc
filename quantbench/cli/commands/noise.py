"""`quantbench noise`: per-host noise floors (repeat, threads, batch, graph optimisation, deployed threads, provider),
with decision flips."""

from __future__ import annotations


from quantbench.store import partwrite
from quantbench.analysis.decode import decode_arg, spec_for_variant
from quantbench.cli.groups import ExplainArgs
from quantbench.errors import render_params
from quantbench.explain import update_report
from quantbench.explain.noise import FACTORS, check_factors, check_threads, noise_floor, table
from quantbench.cli.runplan import explain_run
from quantbench.inputs.variantdir import pick_variant

HELP = ("Measure each host's noise floor: repeated runs, threads 1 vs N, batch 1 vs 8, graph optimisation basic vs all, "
        "1 thread vs the host's deployed count, its providers vs the CPU provider.")


EXPLAIN = ExplainArgs()


def add_arguments(p) -> None:
    EXPLAIN.add(p)
    p.add_argument("--limit", type=int, default=8, help="fixtures to use (batch composition needs 8)")
    p.add_argument("--threads", type=int, default=None,
                   help="N of the threads 1 vs N comparison (default: 4, at most the cores each host runs on; more "
                        "is refused)")
    p.add_argument("--batch", type=int, default=8, help="batch size of the batch-composition comparison")
    p.add_argument("--factors", default=",".join(FACTORS), help="comma-separated factors to measure")

    p.add_argument("--decode", type=decode_arg, metavar="KIND",
                   help="decode kind for decision flips: a built-in kind, none, or a plug-in module:function "
                        "(default: the model's sidecar)")


def run(args) -> int:
    ex = EXPLAIN.parse(args)
    root = ex.results.tables
    factors = check_factors(f.strip() for f in args.factors.split(",") if f.strip())
    variant = pick_variant(ex.variant)
    # the model parsed once, the limit checked
    hosts, plan = explain_run(ex, variant, args.limit, render=getattr(args, "_render", render_params))
    (vi,) = plan.variants
    fixtures = plan.fixtures_for[vi.variant_id]
    spec = spec_for_variant(variant, args.decode, vi.outputs)
    threads = check_threads(args.threads, hosts)   # every host's cores, before any host runs
    rows = []
    for h in hosts:
        rows += noise_floor(variant.path, h, fixtures, spec, threads, args.batch, factors, variant.name,
                            variant_id=vi.variant_id, model=plan.models[vi.variant_id])
    partwrite.append("noise", [r.row() for r in rows], root=root)
    print(table(rows))
    faults = [r for r in rows if r.harness_fault]
    if faults:
        print(f"HARNESS FAULT on {', '.join(sorted({r.host for r in faults}))}: repeated runs differ")
    print(f"noise table: {root / 'noise'}")

    print(f"report: {update_report(ex.results.folder, root)}")
    return 1 if faults else 0
