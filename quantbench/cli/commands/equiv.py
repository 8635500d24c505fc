"""`quantbench equiv`: equivalence classes across hosts and decision flips against fp32 (quantbench.api.equiv)."""

from __future__ import annotations

from quantbench.api.equiv import CONFIRM_ALL, DECODE_KINDS, DEFAULT_CONFIRM, GATE_NAMES, NO_DECODE, Gates
from quantbench.api.equiv import equiv as api_equiv
from quantbench.cli.argtypes import budget_value, decode_arg
from quantbench.cli.commands import add_jobs_argument, add_shard_argument, finite_float
from quantbench.cli.equivprint import print_equiv
from quantbench.cli.groups import OUTPUT, FixtureArgs, FleetArgs, ResultsArgs, SessionArgs
from quantbench.errors import render_params

HELP = ("Run (or reuse) every variant on every host, then report equivalence classes of byte-identical hosts, "
        "decision flips against fp32, count concealment, margins and the tensor vs decision gates.")


JSON_NATIVE = True  # prints its own --json summary
FLEET = FleetArgs(default="pi,x86")
FIXTURES = FixtureArgs("compare")
SESSION = SessionArgs()
RESULTS = ResultsArgs()


def add_arguments(p) -> None:
    FLEET.add(p)
    p.add_argument("--variants", nargs="+", metavar="DIR_OR_FILE",
                   help="variant folders or .onnx files (one of them the fp32 model); default: the latest calibrate output")
    p.add_argument("--variant", metavar="NAME",
                   help="one variant by name (of the last calibrate run, e.g. the one search wrote) or .onnx file, "
                        "analysed beside that run's fp32 (instead of --variants)")
    p.add_argument("--fp32", metavar="FILE",
                   help="the float model the --variants (an already-quantized file) flip against; without an fp32 "
                        "model, flips count against the same file on the reference host")
    FIXTURES.add(p)
    p.add_argument("--reference", help="reference host for cross-host comparisons (default: the first of --hosts)")
    p.add_argument("--decode", type=decode_arg, metavar="KIND",
                   help=f"how outputs become decisions: {', '.join(DECODE_KINDS)}, {NO_DECODE} (classes and tensor gate only), "
                        "or a plug-in module:function / path/to/file.py:function (default: the model sidecar's "
                        "'decode' block; none without one)")
    p.add_argument("--threshold", type=finite_float, help="decision threshold (default: the sidecar's)")
    p.add_argument("--atol", type=finite_float, default=Gates.atol, help="tensor gate absolute tolerance")
    p.add_argument("--rtol", type=finite_float, default=Gates.rtol, help="tensor gate relative tolerance")
    p.add_argument("--budget", type=budget_value, default=Gates.budget, metavar="N|P%",
                   help="decision gate: flips allowed per comparison, or a share of the decisions fp32 serves in it "
                        "(1%%)")
    p.add_argument("--gate", metavar="NAMES",
                   help=f"comma-separated conditions that make the exit code 1 when they fail: {', '.join(GATE_NAMES)} "
                        "(tensor and decision apply to every comparison; classes: every variant is one class)")
    p.add_argument("--no-run", action="store_true",
                   help="use only results already in the tables (e.g. hosts run with other session options)")
    p.add_argument("--confirm", default=str(DEFAULT_CONFIRM), metavar=f"K|{CONFIRM_ALL}",
                   help="a host predicted (from the fingerprint it reports in this run) to share a class with a "
                        "host run in full runs only K fixtures first (those that separated classes in an earlier "
                        "analysis, then those nearest the threshold there, then by id), and inherits the others when "
                        f"those are byte-identical (else it runs the rest); {CONFIRM_ALL}: every host runs every "
                        "fixture (default: %(default)s)")
    SESSION.add(p)
    add_jobs_argument(p)
    add_shard_argument(p)
    RESULTS.add(p)
    p.add_argument("--no-plots", action="store_true", help="no PNG plots in the report")
    p.add_argument("--no-wait", action="store_true",
                   help="fail at once (exit 2) if another run/equiv holds the tables folder's lock, instead of waiting")


def run(args) -> int:
    output, render = OUTPUT.parse(args), getattr(args, "_render", render_params)
    res = api_equiv(args.variants, FLEET.parse(args), FIXTURES.parse(args), SESSION.parse(args), RESULTS.parse(args),
                    output, Gates(atol=args.atol, rtol=args.rtol, budget=args.budget, gate=args.gate), fp32=args.fp32,
                    reference=args.reference, decode=args.decode, threshold=args.threshold, run=not args.no_run,
                    jobs=args.jobs, cluster=args.cluster, shard=args.shard, plots=not args.no_plots,
                    wait=not args.no_wait, render=render, variant=args.variant,
                    confirm=args.confirm)
    return print_equiv(res.analysis, res.files, res.gates, res.failures, output.json, res.run_line, render)
