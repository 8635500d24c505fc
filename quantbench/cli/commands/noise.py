"""`quantbench noise`: per-host noise floors (repeat, threads, batch, graph optimisation, deployed threads, provider),
with decision flips."""

from __future__ import annotations

from quantbench.api.noise import DEFAULT_BATCH, DEFAULT_LIMIT, FACTORS, noise
from quantbench.cli.argtypes import decode_arg
from quantbench.cli.groups import ExplainArgs
from quantbench.errors import render_params

HELP = ("Measure each host's noise floor: repeated runs, threads 1 vs N, batch 1 vs 8, graph optimisation basic vs all, "
        "1 thread vs the host's deployed count, its providers vs the CPU provider.")


EXPLAIN = ExplainArgs()


def add_arguments(p) -> None:
    EXPLAIN.add(p)
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="fixtures to use (batch composition needs 8)")
    p.add_argument("--threads", type=int, default=None,
                   help="N of the threads 1 vs N comparison (default: 4, at most the cores each host runs on; more "
                        "is refused)")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="batch size of the batch-composition comparison")
    p.add_argument("--factors", default=",".join(FACTORS), help="comma-separated factors to measure")

    p.add_argument("--decode", type=decode_arg, metavar="KIND",
                   help="decode kind for decision flips: a built-in kind, none, or a plug-in module:function "
                        "(default: the model's sidecar)")


def run(args) -> int:
    ex = EXPLAIN.parse(args)
    done = noise(ex.variant, ex.fleet, ex.fixtures, ex.session, ex.results, limit=args.limit, threads=args.threads,
                 batch=args.batch, factors=args.factors, decode=args.decode,
                 render=getattr(args, "_render", render_params))
    print(done.text())
    if done.harness_faults:
        print(f"HARNESS FAULT on {', '.join(done.harness_faults)}: repeated runs differ")
    print(f"noise table: {done.tables_root / 'noise'}")
    print(f"report: {done.report}")
    return 1 if done.harness_faults else 0
