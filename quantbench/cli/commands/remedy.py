"""`quantbench remedy`: try the known remedies on a variant whose hosts split, report which make one class and their cost."""

from __future__ import annotations

from pathlib import Path

from quantbench.store import partwrite
from quantbench.analysis.decode import decode_arg, spec_for_variant
from quantbench.cli.groups import OUTPUT, ExplainArgs
from quantbench.errors import UserError, render_params
from quantbench.explain import update_report
from quantbench.explain.remedy import REMEDIES, build_remedies, remedy_matrix, table
from quantbench.inputs.sidecarfile import check_identity
from quantbench.cli.runplan import explain_run
from quantbench.inputs.variantdir import pick_variant

HELP = "Try reduce_range, session.x64quantprecision=1, S8S8 and U8U8 on a split variant: which bring all hosts into one class, at what decision cost."


EXPLAIN = ExplainArgs()


def add_arguments(p) -> None:
    EXPLAIN.add(p)
    p.add_argument("--fp32", metavar="MODEL",
                   help="the float model the variant was quantized from (default: the fp32 variant of the last calibrate run)")
    p.add_argument("--limit", type=int, default=8, help="fixtures to compare on")
    p.add_argument("--remedies", default=",".join(REMEDIES), help="comma-separated remedies to try")

    p.add_argument("--decode", type=decode_arg, metavar="KIND",
                   help="decode kind for decision flips: a built-in kind, none, or a plug-in module:function "
                        "(default: the model's sidecar)")
    p.add_argument("--out", metavar="DIR", help="where remedy variants are written (default: results/remedies/<variant>)")


def run(args) -> int:
    ex = EXPLAIN.parse(args)
    root = ex.results.tables
    variant = pick_variant(ex.variant)
    # the model parsed once, its identity checked; the variant's requirement goes into each remedy (build_remedies)
    hosts, plan = explain_run(ex, variant, args.limit, render=getattr(args, "_render", render_params),
                              requirement=False, compares=True)
    (vi,) = plan.variants
    if args.fp32:
        fp32 = Path(args.fp32)
    else:
        reference = pick_variant("fp32")
        check_identity(reference)  # the reference runs too: it must be the model its recipe names
        fp32 = Path(reference.path)
    spec = spec_for_variant(variant, args.decode, vi.outputs)
    if spec is None:
        raise UserError(f"{variant.path}: no decoder (--decode none, or no decode block in its sidecar); remedy "
                        f"counts decision flips, so pass --decode KIND")
    fixtures = plan.fixtures_for[vi.variant_id]
    stem = Path(variant.path)
    ranges = stem.with_name(stem.stem + ".ranges.json")
    out = Path(args.out) if args.out else ex.results.folder / "remedies" / variant.name
    remedies = [r.strip() for r in args.remedies.split(",") if r.strip()]
    rvs = build_remedies(variant.path, fp32, out, variant.recipe, ranges if ranges.exists() else None,
                         [{fx.input_name: fx.array} for fx in fixtures], remedies)
    rows = remedy_matrix(rvs, fp32, hosts, fixtures, spec, vi.variant_id,
                         progress=OUTPUT.parse(args).bars(), shipped_model=plan.models.get(vi.variant_id))
    partwrite.append("remedies", [r.row() for r in rows], root=root)
    print(table(rows))
    closing = [r.remedy for r in rows if r.one_class]
    print("remedies that bring every host into one class: " + (", ".join(closing) or "none"))
    print(f"remedies table: {root / 'remedies'}; remedy variants in {out}")

    print(f"report: {update_report(ex.results.folder, root)}")
    return 0
