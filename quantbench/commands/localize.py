"""`quantbench localize`: the first node whose output differs between two hosts (and, with --evidence, which kernels ran)."""

from __future__ import annotations

from pathlib import Path

HELP = "Find the first node whose output differs between two hosts, hashing every intermediate tensor in bounded memory."


def add_common(p, hosts_default: str | None = None) -> None:
    """Options shared by the explain commands (variant, hosts, fixtures, session, tables)."""
    p.add_argument("--variant", required=True,
                   help="variant name from the last `quantbench calibrate` (fp32, dynamic, static-minmax, ...) or an .onnx file")
    p.add_argument("--hosts", required=hosts_default is None, default=hosts_default,
                   help="comma-separated hosts; NAME+KEY=VALUE sets a session option or config entry for that host, "
                        "e.g. x86,x86+session.x64quantprecision=1")
    p.add_argument("--fixtures", metavar="LABELS.json", help="COCO labels of the evaluation images (default: the bundled corpus)")
    p.add_argument("--images", metavar="DIR", help="folder of the images named in --fixtures")
    p.add_argument("--split", default="eval", help="image split (train, val, eval, or 'all')")
    p.add_argument("--session-config", action="append", default=[], metavar="KEY=VALUE",
                   help="session config entry for every host (repeatable)")
    p.add_argument("--graph-opt", default="all", choices=["disabled", "basic", "extended", "all"],
                   help="graph optimization level of the run being explained")
    p.add_argument("--hosts-file", metavar="FILE", help="TOML hosts file (default: quantbench.toml if present)")
    p.add_argument("--tables", metavar="DIR", help="result tables folder (default: results/tables)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_arguments(p) -> None:
    add_common(p)
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


def base_session(args) -> dict:
    from quantbench.commands.run import config_entries

    return {"graph_optimization_level": args.graph_opt, "config_entries": config_entries(args.session_config)}


def pick_variant(text: str):
    """A variant by name (from the last calibrate run) or by .onnx path."""
    from quantbench import variants as V
    from quantbench.errors import UserError

    p = Path(text)
    if p.suffix == ".onnx" or p.exists():
        from quantbench.commands.run import resolve_variants
        from quantbench.modelio import load_model

        v = resolve_variants([str(p)])[0]
        if v.name == "fp32" and p.stem != "fp32":  # a bare file: name a quantized one after the file, not "fp32"
            ops = {n.op_type for n in load_model(v.path, check=False).graph.node}
            if ops & {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "MatMulInteger",
                      "ConvInteger", "DynamicQuantizeLinear"}:
                v.name = p.stem
        return v
    try:
        found = V.latest_variants()
    except UserError:
        raise UserError(f"--variant {text}: no calibrate run yet; run `quantbench calibrate` or pass an .onnx file") from None
    for v in found:
        if v.name == text:
            return v
    raise UserError(f"--variant {text}: not among the latest variants ({', '.join(v.name for v in found)})")


def pick_fixtures(args, variant, limit: int | None = None) -> list:
    from quantbench.commands.run import build_run_fixtures

    fixtures, _ = build_run_fixtures([variant], args.fixtures, args.images, args.split, limit)
    return fixtures


def pick_fixture(args, variant):
    from quantbench.errors import UserError

    fixtures = pick_fixtures(args, variant)
    if not fixtures:
        raise UserError(f"--split {args.split}: no fixtures")
    if not args.fixture:
        return fixtures[0]
    for fx in fixtures:
        if fx.fixture_id.startswith(args.fixture) or Path(fx.source).name == args.fixture or fx.source == args.fixture:
            return fx
    raise UserError(f"--fixture {args.fixture}: no fixture with that id prefix or image name in split {args.split}")


def run(args) -> int:
    from quantbench import tables
    from quantbench.assets import TABLES_DIR
    from quantbench.explain.localize import localize, parse_hosts, summary

    root = Path(args.tables) if args.tables else TABLES_DIR
    variant = pick_variant(args.variant)
    hosts = parse_hosts(args.hosts, base_session(args), args.hosts_file)
    fixture = pick_fixture(args, variant)
    res = localize(variant.path, hosts, fixture, args.opt_level, args.group, variant.name,
                   progress=not args.no_progress, tables_root=root)
    part = tables.append("localize", res.table_rows(), root=root)
    print(summary(res))
    print(f"localize table: {part.parent if part else root / 'localize'}")
    if args.evidence:
        from quantbench.explain.evidence import run_evidence_for, table

        evs, notes = run_evidence_for(variant, hosts, pick_fixtures(args, variant, limit=max(1, args.evidence_fixtures)),
                                      root)
        for note in notes:
            print(note)
        if evs:
            print("instruction families inside onnxruntime (distinct sites; qemu -d in_asm):")
            print(table(evs))
            print(f"evidence table: {root / 'evidence'}")
    from quantbench.explain import update_report

    print(f"report: {update_report(root)}")
    return 0
