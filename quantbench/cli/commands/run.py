"""`quantbench run`: every variant x fixture on every host, hashed, into the result tables (quantbench.api.run)."""

from __future__ import annotations

import json

from quantbench.api.run import run as api_run
from quantbench.cli.commands import add_jobs_argument, add_shard_argument
from quantbench.cli.groups import OUTPUT, FixtureArgs, FleetArgs, ResultsArgs, SessionArgs
from quantbench.errors import render_params

JSON_NATIVE = True  # prints its own --json summary
HELP = "Run every model variant on every eval fixture on each host (local, emulated, ssh, imported) and hash every output."


FLEET = FleetArgs(default="x86")
FIXTURES = FixtureArgs("run")
SESSION = SessionArgs()
RESULTS = ResultsArgs(tables_alias=True)


def add_arguments(p) -> None:
    FLEET.add(p)
    p.add_argument("--variants", nargs="+", metavar="DIR_OR_FILE",
                   help="variant folders (with index.json from calibrate) or .onnx files; default: the latest "
                        "calibrate output, else the bundled fp32 demo models")
    FIXTURES.add(p)
    SESSION.add(p)
    add_jobs_argument(p)
    p.add_argument("--export", metavar="FILE",
                   help="also write the named hosts' results to FILE, for `kind = \"imported\"` on another machine")
    p.add_argument("--as", dest="as_host", metavar="NAME",
                   help="with --export and one host: export its results under NAME (e.g. arm64 for the local host "
                        "of an arm64 machine)")
    p.add_argument("--force", action="store_true",
                   help="with --export: replace a file already at FILE (else it is an error, before the run)")
    add_shard_argument(p)
    RESULTS.add(p)
    p.add_argument("--no-wait", action="store_true",
                   help="fail at once (exit 2) if another run/equiv holds the tables folder's lock, instead of waiting")


def summary_json(summary, root, export, failure, render=render_params) -> dict:
    """The run's summary as plain data (--json): per host what ran, was reused or imported, and errors (their
    flag marks shown by `render`, the CLI's flags)."""
    hosts = [{"host": h.name, "kind": h.kind, "fingerprint_id": h.fingerprint_id, "ran": h.ran, "cached": h.cached,
              "imported": h.imported, "workers": h.workers, "seconds": round(h.seconds, 3), "errors": [render(e) for e in h.errors],
              "notes": h.notes, "does_not_start": h.does_not_start or None, "session": h.session,
              "session_key": h.session_key, "placements": h.placements, "provider_findings": h.provider_findings}
             for h in summary.hosts]
    return {"hosts": hosts, "variants": [{"name": v.name, "variant_id": v.variant_id, "path": str(v.path)}
                                         for v in summary.variants],
            "fixtures": len(summary.fixture_ids), "tables": str(root),
            "export": str(export) if export else None, "failed": render(Exception.__str__(failure)) if failure else None}


def run(args) -> int:
    output, render = OUTPUT.parse(args), getattr(args, "_render", render_params)
    res = api_run(args.variants, FLEET.parse(args), FIXTURES.parse(args), SESSION.parse(args), RESULTS.parse(args),
                  output, jobs=args.jobs, cluster=args.cluster, shard=args.shard, export=args.export,
                  as_host=args.as_host, force=args.force, wait=not args.no_wait, render=render)
    summary, root, manifest, failure = res.summary, res.tables_root, res.manifest, res.failure
    if output.json:
        print(json.dumps(summary_json(summary, root, args.export if manifest else None, failure, render), indent=2,
                         sort_keys=True))
    else:
        print(summary.table())
        for line in summary.session_lines():
            print(line)
        for h in summary.hosts:
            for note in h.notes:
                print(f"note: {note}")
        print(f"{len(summary.variants)} variant(s) x {len(summary.fixture_ids)} fixture(s); tables in {root}/ "
              f"(fixtures, models, hosts, outputs)")
        if manifest:
            shard = f" (shard {res.plan.shard['k']}/{res.plan.shard['n']})" if res.plan.shard else ""
            print(f"exported {manifest['rows']['outputs']} output rows of host(s) {', '.join(manifest['hosts'])} "
                  f"to {args.export}{shard}")
    if failure is not None:
        for e in summary.errors[1:]:
            print(f"error: {render(e)}")
        raise failure
    return 0
