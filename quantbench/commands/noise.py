"""`quantbench noise`: per-host noise floors (repeat, threads, batch, graph optimisation, deployed threads, provider),
with decision flips."""

from __future__ import annotations

from pathlib import Path

from quantbench import tables
from quantbench.analysis.decode import decode_arg, spec_for_variant
from quantbench.assets import TABLES_DIR
from quantbench.commands import add_explain_arguments, base_session_from_args
from quantbench.explain import update_report
from quantbench.explain.noise import FACTORS, noise_floor, table
from quantbench.hosts.requirements import for_hosts
from quantbench.hosts.registry import parse_hosts
from quantbench.runargs import explain_plan
from quantbench.variants import pick_variant

HELP = ("Measure each host's noise floor: repeated runs, threads 1 vs N, batch 1 vs 8, graph optimisation basic vs all, "
        "1 thread vs the host's deployed count, its providers vs the CPU provider.")


def add_arguments(p) -> None:
    add_explain_arguments(p)
    p.add_argument("--limit", type=int, default=8, help="fixtures to use (batch composition needs 8)")
    p.add_argument("--threads", type=int, default=4, help="N of the threads 1 vs N comparison")
    p.add_argument("--batch", type=int, default=8, help="batch size of the batch-composition comparison")
    p.add_argument("--factors", default=",".join(FACTORS), help="comma-separated factors to measure")

    p.add_argument("--decode", type=decode_arg, metavar="KIND",
                   help="decode kind for decision flips: a built-in kind, none, or a plug-in module:function "
                        "(default: the model's sidecar)")


def run(args) -> int:
    root = Path(args.tables) if args.tables else TABLES_DIR
    variant = pick_variant(args.variant)
    hosts = for_hosts(parse_hosts(args.hosts, base_session_from_args(args), args.hosts_file), variant)
    plan = explain_plan(args, hosts, [variant], args.limit)  # the model parsed once, the limit checked
    (vi,) = plan.variants
    fixtures = plan.fixtures_for[vi.variant_id]
    spec = spec_for_variant(variant, args.decode, vi.outputs)
    factors = [f.strip() for f in args.factors.split(",") if f.strip()]
    rows = []
    for h in hosts:
        rows += noise_floor(variant.path, h, fixtures, spec, args.threads, args.batch, factors, variant.name,
                            variant_id=vi.variant_id, model=plan.models[vi.variant_id])
    tables.append("noise", [r.row() for r in rows], root=root)
    print(table(rows))
    faults = [r for r in rows if r.harness_fault]
    if faults:
        print(f"HARNESS FAULT on {', '.join(sorted({r.host for r in faults}))}: repeated runs differ")
    print(f"noise table: {root / 'noise'}")

    print(f"report: {update_report(root)}")
    return 1 if faults else 0
