"""`quantbench verify results/releases/NAME`: re-hash, re-read and re-run a release record."""

from __future__ import annotations

import dataclasses

from quantbench.api.release import verify
from quantbench.cli.groups import FleetArgs, ResultsArgs
from quantbench.errors import UserError, render_params

JSON_NATIVE = True  # prints its own --json summary
HELP = ("Check a release folder or archive (.tar.gz from `release --archive`): re-hash retained artifacts, re-read every Parquet table against its recorded hash, "
        "and with --host re-run a sample of fixtures there and compare output hashes (exit 0 pass, 1 fail).")


FLEET = FleetArgs(hosts=False)
RESULTS = ResultsArgs(what="its staging area DIR/.staging/ holds an unpacked archive and the re-run's tables while "
                           "verify runs, removed after; nothing goes to the system temp folder")


def add_arguments(parser) -> None:
    parser.add_argument("release", metavar="RELEASE",
                        help="release folder (results/releases/v1) or archive (results/releases/v1.tar.gz); an archive "
                             "is checked member by member and unpacked only into a private temporary folder")
    parser.add_argument("--host", default=None,
                        help="re-run a sample of fixtures on this host (one the release recorded) and compare hashes")
    parser.add_argument("--sample", type=int, default=None, help="fixtures per variant to re-run with --host (default 4)")
    FLEET.add(parser)
    RESULTS.add(parser)
    parser.add_argument("--no-registry", action="store_true",
                        help="the release was copied without results/releases/index.json: skip the registry checks "
                             "(then nothing vouches for release.json itself; see docs/trust.md)")


def run(args) -> int:
    if args.sample is not None and args.sample < 1:
        raise UserError("--sample: must be at least 1")
    if args.sample is not None and not args.host:   # was: ignored, and the verdict read as if a sample was re-run
        raise UserError(f"--sample {args.sample}: re-runs fixtures on --host, and no --host was given; give one, "
                        "or leave --sample out")
    done = verify(args.release, host=args.host, sample=4 if args.sample is None else args.sample, fleet=FLEET.parse(args),
                  results=RESULTS.parse(args), registry=not args.no_registry)
    render = getattr(args, "_render", render_params)   # a check's detail may point at a flag (errors.flag_mark)
    done = dataclasses.replace(done, checks=[dataclasses.replace(c, detail=render(c.detail)) for c in done.checks])
    if getattr(args, "json", False):
        import json

        print(json.dumps({"release": str(args.release), "pass": done.passed,
                          "checks": [dataclasses.asdict(c) for c in done.checks]}, indent=2, sort_keys=True))
        return 0 if done.passed else 1
    print(done.text())
    print()
    extra = f", {done.not_retained} artifact(s) deliberately not retained" if done.not_retained else ""
    print(f"verify {args.release}: {'PASS' if done.passed else 'FAIL'} ({len(done.checks)} checks, {done.failed} "
          f"failed{extra})")
    return 0 if done.passed else 1
