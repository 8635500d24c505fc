"""`quantbench search`: the recipe that holds on the whole fleet, written as a variant (or why none was found)."""

from __future__ import annotations

import json
import sys

from quantbench.analysis.decode import decode_arg
from quantbench.analysis.gates import DEFAULT_BUDGET
from quantbench.api.search import search
from quantbench.cli.argtypes import budget_value
from quantbench.cli.groups import ExplainArgs
from quantbench.errors import render_params
from quantbench.explain.search import SPACES
from quantbench.explain.searchreport import summary

HELP = ("Search recipes (global remedies, calibration, nodes kept in float) for the one that meets a decision budget "
        "on every host, and write it as a variant.")


JSON_NATIVE = True  # prints its own --json outcome (Search.outcome)

EXPLAIN = ExplainArgs(variant_required=False)  # default: the last calibrate run's first static variant


def add_arguments(p) -> None:
    EXPLAIN.add(p)
    p.add_argument("--budget", type=budget_value, default=DEFAULT_BUDGET, metavar="N|P%",
                   help="decision flips against fp32 allowed per host (as `equiv --gate decision` counts them), or a "
                        "share of the decisions fp32 serves on each host (1%%; the count it allows is printed)")
    p.add_argument("--max-drop", type=float, metavar="D",
                   help="the accuracy against the labels (the report's metric: top-1, AP50, text) may fall at most D "
                        "below fp32's on every host (0..1), with the flip budget")
    p.add_argument("--identical", action="store_true",
                   help="the answer must also give byte-identical outputs (one class) on every measured host; "
                        "without one, exit 1 naming the nearest candidate's classes and the ops separating them")
    p.add_argument("--max-float-share", type=float, help="ceiling on the share of weights kept in float (0..1)")
    p.add_argument("--max-size", type=int, help="ceiling on the variant's file size, bytes")
    p.add_argument("--max-latency-ms", type=float,
                   help="ceiling on a confirmed candidate's median latency, ms, on every host that measures latency "
                        "(local, ssh); cached, so a rerun walks the same way")
    p.add_argument("--max-evaluations", type=int, default=200, help="fleet evaluations (candidate x host) to spend")
    p.add_argument("--max-seconds", type=float, help="wall time to spend")
    p.add_argument("--space", choices=SPACES, default="all",
                   help="global choices, nodes kept in float, or both (default)")
    p.add_argument("--screen-fixtures", type=int, default=4, help="fixtures nearest the threshold screened first")
    p.add_argument("--error-images", type=int, default=4, help="calibration images per-node error is measured on")
    p.add_argument("--limit", type=int, help="eval fixtures to confirm on (default: every one of the split)")
    p.add_argument("--jobs", type=int, default=1, help="hosts run at once")
    p.add_argument("--name", help="name of the written variant (default: named for what it is)")
    p.add_argument("--decode", type=decode_arg, metavar="KIND", help="decode kind (default: the model's sidecar)")


def _status(args):
    """The search's status lines (each phase begun, each candidate confirmed on every host) on stderr, one flushed
    line each, so a log or a CI job shows a long search as it goes; none with -q."""
    if getattr(args, "quiet", False):
        return None
    return lambda line: print(line, file=sys.stderr, flush=True)


def run(args) -> int:
    ex = EXPLAIN.parse(args)
    done = search(ex.variant, ex.fleet, ex.fixtures, ex.session, ex.results, budget=args.budget,
                  max_float_share=args.max_float_share, max_size=args.max_size, max_latency_ms=args.max_latency_ms,
                  max_evaluations=args.max_evaluations, max_seconds=args.max_seconds, space=args.space,
                  screen_fixtures=args.screen_fixtures, error_images=args.error_images, jobs=args.jobs,
                  name=args.name, decode=args.decode, limit=args.limit,
                  render=getattr(args, "_render", render_params), on_status=_status(args), max_drop=args.max_drop,
                  identical=args.identical, notes_to_stderr=getattr(args, "json", False))
    if getattr(args, "json", False):
        print(json.dumps(done.outcome(), indent=2, sort_keys=True))
    else:
        print(summary(done.result))
        print(f"report: {done.report}")
    return 0 if done.passed else 1
