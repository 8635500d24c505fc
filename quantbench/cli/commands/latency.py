"""`quantbench latency`: latency and peak memory of each variant on local and ssh hosts, int8 speed-up over fp32."""

from __future__ import annotations

from quantbench.api.latency import latency
from quantbench.cli.groups import FixtureArgs, FleetArgs, ResultsArgs
from quantbench.errors import render_params

HELP = "Measure latency (median of timed runs, spread over repeats) and peak RSS on local/ssh hosts; never under emulation."


FLEET = FleetArgs(default="x86")   # local or ssh hosts: an emulated one is refused (the API's default too)
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


def run(args) -> int:
    done = latency(args.variants, FLEET.parse(args), FIXTURES.parse(args), RESULTS.parse(args), warmup=args.warmup,
                   runs=args.runs, repeats=args.repeats, threads=args.threads,
                   render=getattr(args, "_render", render_params))
    print(done.text())
    print(f"latency table: {done.tables_root / 'latency'}")
    print(f"report: {done.report}")
    return 0
