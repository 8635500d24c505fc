"""`quantbench remedy`: try the known remedies on a variant whose hosts split, report which make one class and their cost."""

from __future__ import annotations

from quantbench.api.remedy import DEFAULT_LIMIT, REMEDIES, remedy
from quantbench.cli.argtypes import decode_arg
from quantbench.cli.groups import OUTPUT, ExplainArgs
from quantbench.errors import render_params

HELP = "Try reduce_range, session.x64quantprecision=1, S8S8 and U8U8 on a split variant: which bring all hosts into one class, at what decision cost."


EXPLAIN = ExplainArgs()


def add_arguments(p) -> None:
    EXPLAIN.add(p)
    p.add_argument("--fp32", metavar="MODEL",
                   help="the float model the variant was quantized from (default: the fp32 variant of the last calibrate run)")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="fixtures to compare on")
    p.add_argument("--remedies", default=",".join(REMEDIES), help="comma-separated remedies to try")

    p.add_argument("--decode", type=decode_arg, metavar="KIND",
                   help="decode kind for decision flips: a built-in kind, none, or a plug-in module:function "
                        "(default: the model's sidecar)")
    p.add_argument("--out", metavar="DIR", help="where remedy variants are written (default: results/remedies/<variant>)")


def run(args) -> int:
    ex = EXPLAIN.parse(args)
    done = remedy(ex.variant, ex.fleet, ex.fixtures, ex.session, ex.results, OUTPUT.parse(args), fp32=args.fp32,
                  limit=args.limit, remedies=args.remedies, decode=args.decode, out=args.out,
                  render=getattr(args, "_render", render_params))
    print(done.text())
    print("remedies that bring every host into one class: " + (", ".join(done.closing) or "none"))
    print(f"remedies table: {done.tables_root / 'remedies'}; remedy variants in {done.out}")
    print(f"report: {done.report}")
    return 0
