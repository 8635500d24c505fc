"""`quantbench ci`: write a GitHub Actions workflow and a .gitlab-ci.yml that run the release check on real ARM and
x86 runners (each x86 runner also running the masked x86 tiers its CPU shows) and emulated hosts in shards, then
merge, gate and release."""

from __future__ import annotations

import shlex
import sys

from quantbench.cli.argtypes import budget_value
from quantbench.errors import ParameterError, UserError
from quantbench.hosts.keys import local_ort_version
from quantbench.release.ci import GITHUB_RUNNERS, GITHUB_FILE, CIParams, write_ci

HELP = ("Write a CI workflow (GitHub Actions and .gitlab-ci.yml): native ARM and x86 runners (and the masked x86 tiers "
        "each runner's CPU shows) and emulated hosts in shards, one job merging them, equiv with your gate and the "
        "release archive.")


def add_arguments(p) -> None:
    p.add_argument("--hosts", default="pi",
                   help="comma-separated emulated hosts, each run in --shards jobs (default pi)")
    p.add_argument("--shards", type=int, default=3, help="jobs per emulated host (default 3)")
    p.add_argument("--runners", default=",".join(f"{k}={v}" for k, v in GITHUB_RUNNERS.items()),
                   help="comma-separated LABEL=NAME: native runner labels whose local host is exported as NAME")
    p.add_argument("--native-shards", type=int, default=1, help="shard jobs per native runner label (default 1)")
    p.add_argument("--native-runs", type=int, default=1,
                   help="whole-run jobs per native runner label (default 1): runners of one label can differ (Intel "
                        "or AMD), and each CPU model that ran becomes its own host")
    p.add_argument("--tiers", default=None, metavar="TIERS",
                   help="comma-separated masked x86 tiers each native job runs after its own run where its CPU shows "
                        "them (decided on the runner), each a host NAME-TIER; 'none' for no tier step (default: every "
                        "tier)")
    p.add_argument("--variants", metavar="DIR", help="committed variants folder (default: the bundled demo models)")
    p.add_argument("--calibrate", metavar="ARGS", help="calibrate in the first job with these quantbench calibrate "
                                                        "arguments (one quoted string) instead of --variants")
    p.add_argument("--fixtures", metavar="LABELS", help="labels file in the repository (default: the bundled corpus)")
    p.add_argument("--images", metavar="DIR", help="images folder in the repository (with --fixtures)")
    p.add_argument("--limit", type=int, help="evaluate on this many images, balanced over strata")
    p.add_argument("--split", default=None, help="labels split to evaluate on (default eval)")
    p.add_argument("--gate", metavar="NAMES", help="the merge job's equiv --gate (e.g. decision)")
    p.add_argument("--budget", type=budget_value, metavar="N|P%",
                   help="the merge job's equiv --budget: flips per comparison, or a share of the decisions fp32 "
                        "serves (1%%)")
    p.add_argument("--install", default=".[plots]", metavar="SPEC",
                   help="what pip installs in every job (default: this repository's checkout, '.[plots]')")
    p.add_argument("--onnxruntime", default=None, metavar="VERSION", help="onnxruntime pinned in every job "
                                                                           "(default: the local version)")
    p.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                   help="Python version of the jobs (default: this interpreter's)")
    p.add_argument("--out", default="results/ci", metavar="DIR",
                   help=f"folder for {GITHUB_FILE} and .gitlab-ci.yml (default results/ci)")
    p.add_argument("--force", action="store_true", help="overwrite files already there")


def _runners(text: str) -> dict:
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        label, sep, name = item.partition("=")
        if not sep or not label or not name:
            raise UserError(f"--runners {item}: must be LABEL=NAME (e.g. ubuntu-24.04-arm=gh-arm64)")
        out[label] = name
    return out


#: `--tiers none`: no tier step (a word of this option, not the decoder kind of the same name)
NO_TIERS = "none"


def _tiers(text: str) -> list:
    return [] if text.strip() == NO_TIERS else [t.strip() for t in text.split(",") if t.strip()]


#: CIParams parameters whose option has another name here
_OPTION_OF = {"labels": "fixtures", "emulated": "hosts"}


def run(args) -> int:
    try:
        return _write(args)
    except ParameterError as exc:
        if exc.param not in _OPTION_OF:
            raise
        raise ParameterError(_OPTION_OF[exc.param], exc.problem, exc.value, exc.show_value) from None


def _calibrate_args(text: str | None) -> list | None:
    if not text:
        return None
    try:
        return shlex.split(text)
    except ValueError as exc:   # an unclosed quote: shlex says which
        raise UserError(f"--calibrate {text}: not a shell argument list ({exc}); nothing was written") from None


def _write(args) -> int:
    params = CIParams(onnxruntime=args.onnxruntime or local_ort_version(), python=args.python,
                      emulated=[h.strip() for h in args.hosts.split(",") if h.strip()], shards=args.shards,
                      runners=_runners(args.runners), native_shards=args.native_shards,
                      native_runs=args.native_runs, variants=args.variants,
                      calibrate=_calibrate_args(args.calibrate), labels=args.fixtures,
                      images=args.images, limit=args.limit, split=args.split, gate=args.gate, budget=args.budget,
                      install=args.install,
                      **({} if args.tiers is None else {"tiers": _tiers(args.tiers)}))
    for path in write_ci(params, args.out, force=args.force):
        print(f"wrote {path}")
    print(f"copy {args.out}/{GITHUB_FILE} to .github/workflows/ (or .gitlab-ci.yml to the repository root)")
    return 0
