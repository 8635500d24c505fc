"""`quantbench latency`: latency and peak memory of each variant on local and ssh hosts, int8 speed-up over fp32."""

from __future__ import annotations


from quantbench.store import partwrite
from quantbench.cli.groups import FixtureArgs, FleetArgs, ResultsArgs
from quantbench.errors import UserError, render_params
from quantbench.explain import update_report
from quantbench.explain.latency import check_counts, check_host, measure, table, with_speedups
from quantbench.hosts.requirements import for_hosts
from quantbench.hosts.registry import parse_hosts
from quantbench.hosts.runner import plan_run
from quantbench.api.plan import note_plan
from quantbench.inputs.variantdir import DEMO_NOTE, is_demo, pick_variant, resolve_variants

HELP = "Measure latency (median of timed runs, spread over repeats) and peak RSS on local/ssh hosts; never under emulation."


FLEET = FleetArgs(default="x86")   # local or ssh hosts: an emulated one is refused
FIXTURES = FixtureArgs("take the timed fixture from", sidecar_and_limit=False)
RESULTS = ResultsArgs(tables_alias=True)


def add_arguments(p) -> None:
    p.add_argument("--variants", default="all",
                   help="comma-separated variant names from the last calibrate run, or .onnx files ('all': every one)")
    p.add_argument("--warmup", type=int, default=3, help="untimed warm-up runs (1 to 100)")
    p.add_argument("--runs", type=int, default=10, help="timed runs per repeat (10 to 1000)")
    p.add_argument("--repeats", type=int, default=3,
                   help="repeats (3 to 20); the spread of their medians is reported")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: each host's deployed count)")
    FLEET.add(p)
    FIXTURES.add(p)
    RESULTS.add(p)


def resolve(names: str):
    if names == "all":
        variants = resolve_variants(None)
        if is_demo(v.path for v in variants):
            print(DEMO_NOTE, flush=True)
        return variants
    picked = [pick_variant(n.strip()) for n in names.split(",") if n.strip()]
    if not picked:   # '' measured nothing and printed an empty table
        raise UserError(f"--variants {names!r}: name at least one variant, or 'all'")
    return picked


def run(args) -> int:
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads {args.threads}: must be at least 1")
    check_counts(args.warmup, args.runs, args.repeats)   # before any host is asked
    given = {} if args.threads is None else {"intra_op_num_threads": args.threads}
    fleet, fixtures, results = FLEET.parse(args), FIXTURES.parse(args), RESULTS.parse(args)
    hosts = parse_hosts(fleet.names(), given, fleet.hosts_file)
    for h in hosts:
        check_host(h)
    variants = resolve(args.variants)
    root = results.tables
    rows = []
    for v in variants:  # the run plan: the model parsed once, its identity and the timed fixture
        plan = plan_run([h.spec for h in hosts], [v], labels=fixtures.labels, images=fixtures.images, split=fixtures.split,
                        limit=1, check_hosts=False)
        note_plan(plan, render=getattr(args, "_render", render_params))
        (vi,) = plan.variants
        fx = plan.fixtures_for[vi.variant_id][0]
        for h in for_hosts(hosts, v):   # each variant under its own session requirement
            rows.append(measure(v.path, h, fx, args.warmup, args.runs, args.repeats, v.name, variant_id=vi.variant_id))
    with_speedups(rows)
    partwrite.append("latency", [r.row() for r in rows], root=root)
    print(table(rows))
    print(f"latency table: {root / 'latency'}")

    print(f"report: {update_report(results.folder, root)}")
    return 0
