"""`quantbench localize`: the first node whose output differs between two hosts (and, with --evidence, which kernels ran)."""

from __future__ import annotations


from quantbench.store import partwrite
from quantbench.cli.groups import OUTPUT, ExplainArgs
from quantbench.errors import render_params
from quantbench.explain import update_report
from quantbench.explain.evidence import run_evidence_for, table
from quantbench.explain.localize import localize, summary
from quantbench.inputs.fixtures import limit_note, pick_balanced, pick_fixture
from quantbench.cli.runplan import explain_run
from quantbench.inputs.variantdir import pick_variant

HELP = "Find the first node whose output differs between two hosts, hashing every intermediate tensor in bounded memory."


EXPLAIN = ExplainArgs()


def add_arguments(p) -> None:
    EXPLAIN.add(p)
    p.add_argument("--fixture", metavar="ID_OR_IMAGE",
                   help="fixture to localise on: a fixture id (prefix) or image file name (default: the first eval fixture)")
    p.add_argument("--opt-level", choices=["disabled", "basic", "extended", "all"],
                   help="graph optimization level to localise at (default: the explained run's; 'basic' or "
                        "'disabled' give per-node fidelity for fp32, but not for QDQ int8 kernels)")
    p.add_argument("--group", type=int, default=8,
                   help="intermediates exposed per run: the memory bound is this many tensors + outputs + arena")
    p.add_argument("--evidence", action="store_true",
                   help="also run the variant on each emulated host under qemu's -d in_asm log and report the "
                        "instruction families that ran")
    p.add_argument("--evidence-fixtures", type=int, default=1, help="fixtures to run for --evidence")


def run(args) -> int:
    ex = EXPLAIN.parse(args)
    root = ex.results.tables
    variant = pick_variant(ex.variant)
    # the model parsed once: its id, its graph, its fixtures
    hosts, plan = explain_run(ex, variant, render=getattr(args, "_render", render_params))
    (vi,) = plan.variants
    fixtures = plan.fixtures_for[vi.variant_id]
    fixture = pick_fixture(fixtures, args.fixture, ex.fixtures.split)
    res = localize(variant.path, hosts, fixture, args.opt_level, args.group, variant.name,
                   progress=OUTPUT.parse(args).bars(), tables_root=root, variant_id=vi.variant_id,
                   model=plan.models[vi.variant_id])
    part = partwrite.append("localize", res.table_rows(), root=root)
    print(summary(res))
    print(f"localize table: {part.parent if part else root / 'localize'}")
    if args.evidence:
        picked = pick_balanced(fixtures, [fx.stratum for fx in fixtures], max(1, args.evidence_fixtures))
        print(f"--evidence-fixtures {len(picked)}: {limit_note(picked)}")
        evs, notes = run_evidence_for(variant, hosts, picked, root, vi.variant_id)
        for note in notes:
            print(note)
        if evs:
            print("instruction families inside onnxruntime (distinct sites; qemu -d in_asm):")
            print(table(evs))
            print(f"evidence table: {root / 'evidence'}")

    print(f"report: {update_report(ex.results.folder, root)}")
    return 0
