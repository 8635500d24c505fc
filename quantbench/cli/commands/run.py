"""`quantbench run`: every variant x fixture on every host, hashed, into the result tables."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from quantbench import tables
from quantbench.assets import TABLES_DIR
from quantbench.cli.commands import (add_fixture_arguments, add_jobs_argument, add_run_session_arguments, add_shard_argument,
                                 session_from_args)
from quantbench.errors import UserError, render_params
from quantbench.hosts.cluster import connect_plan
from quantbench.fsutil import check_new_file
from quantbench.hosts.imported import export_results
from quantbench.hosts.registry import announce_hosts_file, check_host_name, parse_hosts
from quantbench.hosts.runner import RunFailed, announce_jobs, plan_run, run_plan
from quantbench.cli.runplan import fixture_params, note_plan, variants_from_args

JSON_NATIVE = True  # prints its own --json summary
HELP = "Run every model variant on every eval fixture on each host (local, emulated, ssh, imported) and hash every output."


def add_arguments(p) -> None:
    p.add_argument("--hosts", default="x86",
                   help="comma-separated host names: built-ins (x86, local), emulated presets (pi, pi4, ...) "
                        "or names from the hosts file; `quantbench hosts list` shows them")
    p.add_argument("--variants", nargs="+", metavar="DIR_OR_FILE",
                   help="variant folders (with index.json from calibrate) or .onnx files; default: the latest "
                        "calibrate output, else the bundled fp32 demo models")
    add_fixture_arguments(p, "run")
    add_run_session_arguments(p)
    add_jobs_argument(p)
    p.add_argument("--export", metavar="FILE",
                   help="also write the named hosts' results to FILE, for `kind = \"imported\"` on another machine")
    p.add_argument("--as", dest="as_host", metavar="NAME",
                   help="with --export and one host: export its results under NAME (e.g. arm64 for the local host "
                        "of an arm64 machine)")
    p.add_argument("--force", action="store_true",
                   help="with --export: replace a file already at FILE (else it is an error, before the run)")
    add_shard_argument(p)
    p.add_argument("--hosts-file", metavar="FILE", help="TOML hosts file (default: quantbench.toml if present)")
    p.add_argument("--tables", default=None, metavar="DIR", help="result tables folder (default: results/tables)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
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
    if args.export:  # before the run: a refused file costs no run and writes nothing
        check_new_file(args.export, "export", args.force)
    variants = variants_from_args(args, to_stderr=getattr(args, "json", False))  # the demo says so first
    announce_hosts_file(args.hosts_file, to_stderr=getattr(args, "json", False))  # stdout is the JSON
    jobs = announce_jobs(args.jobs, to_stderr=getattr(args, "json", False))  # capped at the cores
    session = session_from_args(args)
    specs = [h.spec for h in parse_hosts(args.hosts, hosts_file=args.hosts_file, overrides=False)]
    # every host ready, every model read once, before the lock: a refused command writes nothing, not even the lock
    if args.as_host is not None and not args.export:
        raise UserError("--as names the host of an --export; add --export FILE")
    if args.as_host is not None:
        check_host_name(args.as_host, "--as")
    if args.as_host is not None and len(specs) != 1:
        raise UserError(f"--as {args.as_host}: names one host, and --hosts has {len(specs)}")
    plan = plan_run(specs, variants, **fixture_params(args), session=session, command="run", shard=args.shard)
    note_plan(args, plan)
    root = Path(args.tables) if args.tables else TABLES_DIR
    failure, render = None, getattr(args, "_render", render_params)
    cluster = connect_plan(args.cluster, plan) if args.cluster else contextlib.nullcontext()  # checked first
    with cluster, tables.lock(root, wait=not getattr(args, "no_wait", False)), tables.run_scope(plan.run_id):
        try:
            summary = run_plan(plan, require_providers=args.require_providers, progress=not args.no_progress,
                               tables_root=root, jobs=jobs, cluster=cluster if args.cluster else None)
        except RunFailed as exc:
            failure, summary = exc, exc.summary
    manifest = None
    if args.export and failure is None:
        manifest = export_results(args.export, plan.names, [v.variant_id for v in summary.variants],
                                  summary.fixture_ids, root, shard=plan.shard, as_host=args.as_host,
                                  force=args.force)
    if getattr(args, "json", False):
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
            shard = f" (shard {plan.shard['k']}/{plan.shard['n']})" if plan.shard else ""
            print(f"exported {manifest['rows']['outputs']} output rows of host(s) {', '.join(manifest['hosts'])} "
                  f"to {args.export}{shard}")
    if failure is not None:
        for e in summary.errors[1:]:
            print(f"error: {render(e)}")
        raise failure
    return 0
