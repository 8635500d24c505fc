"""`quantbench localize`: the first node whose output differs between two hosts (and, with --evidence, which kernels ran)."""

from __future__ import annotations

from quantbench.api.localize import localize
from quantbench.cli.groups import OUTPUT, ExplainArgs
from quantbench.errors import render_params

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
    done = localize(ex.variant, ex.fleet, ex.fixtures, ex.session, ex.results, OUTPUT.parse(args),
                    fixture=args.fixture, opt_level=args.opt_level, group=args.group, evidence=args.evidence,
                    evidence_fixtures=args.evidence_fixtures, render=getattr(args, "_render", render_params))
    print(done.summary())
    print(f"localize table: {done.part.parent if done.part else done.tables_root / 'localize'}")
    if args.evidence:
        print(f"--evidence-fixtures {done.evidence_fixtures}")
        for note in done.evidence_notes:
            print(note)
        if done.evidence:
            print("instruction families inside onnxruntime (distinct sites; qemu -d in_asm):")
            print(done.evidence_text())
            print(f"evidence table: {done.tables_root / 'evidence'}")
    print(f"report: {done.report}")
    return 0
