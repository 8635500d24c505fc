"""`quantbench verify results/releases/NAME`: re-hash, re-read and re-run a release record."""

from __future__ import annotations

import dataclasses

from quantbench.errors import UserError, render_params
from quantbench.release.archive import verify_archive
from quantbench.release.verify import FAIL, NOT_RETAINED, verify
from quantbench.textfmt import text_table

JSON_NATIVE = True  # prints its own --json summary
HELP = ("Check a release folder or archive (.tar.gz from `release --archive`): re-hash retained artifacts, re-read every Parquet table against its recorded hash, "
        "and with --host re-run a sample of fixtures there and compare output hashes (exit 0 pass, 1 fail).")


def add_arguments(parser) -> None:
    parser.add_argument("release", metavar="RELEASE",
                        help="release folder (results/releases/v1) or archive (results/releases/v1.tar.gz); an archive "
                             "is checked member by member and unpacked only into a private temporary folder")
    parser.add_argument("--host", default=None,
                        help="re-run a sample of fixtures on this host (one the release recorded) and compare hashes")
    parser.add_argument("--sample", type=int, default=4, help="fixtures per variant to re-run with --host")
    parser.add_argument("--hosts-file", default=None, help="hosts file naming ssh/emulated hosts (as for `quantbench run`)")
    parser.add_argument("--results", default="results", metavar="DIR",
                        help="results folder whose staging area (DIR/.staging/) holds an unpacked archive and the "
                             "re-run's tables while verify runs (removed after; nothing goes to the system temp folder)")
    parser.add_argument("--no-registry", action="store_true",
                        help="the release was copied without results/releases/index.json: skip the registry checks "
                             "(then nothing vouches for release.json itself; see docs/trust.md)")


def run(args) -> int:
    from pathlib import Path

    if args.sample < 1:
        raise UserError("--sample: must be at least 1")
    if Path(args.release).is_file():
        checks = verify_archive(args.release, host=args.host, sample=args.sample, hosts_file=args.hosts_file,
                                registry=not args.no_registry, results_dir=args.results)
    else:
        checks = verify(args.release, host=args.host, sample=args.sample, hosts_file=args.hosts_file,
                        registry=not args.no_registry, results_dir=args.results)
    render = getattr(args, "_render", render_params)   # a check's detail may point at a flag (errors.flag)
    checks = [dataclasses.replace(c, detail=render(c.detail)) for c in checks]
    n_fail = sum(c.status == FAIL for c in checks)
    if getattr(args, "json", False):
        import json
        from dataclasses import asdict

        print(json.dumps({"release": str(args.release), "pass": not n_fail, "checks": [asdict(c) for c in checks]},
                         indent=2, sort_keys=True))
        return 1 if n_fail else 0
    print(text_table(["check", "item", "status", "detail"], [[c.check, c.item, c.status, c.detail] for c in checks], rule=True))
    n_nr = sum(c.status == NOT_RETAINED for c in checks)
    print()
    verdict = "FAIL" if n_fail else "PASS"
    extra = f", {n_nr} artifact(s) deliberately not retained" if n_nr else ""
    print(f"verify {args.release}: {verdict} ({len(checks)} checks, {n_fail} failed{extra})")
    return 1 if n_fail else 0
