"""`quantbench release --tag NAME`: write the release record and register its release keys."""

from __future__ import annotations

import argparse

from quantbench.api.release import release
from quantbench.cli.groups import ResultsArgs

JSON_NATIVE = True  # prints its own --json summary
HELP = ("Write results/releases/NAME/ (Parquet tables, report.md, release.json with recipe, environment, "
        "raw and semantic hashes and per-host behaviour) and register its release keys.")


RESULTS = ResultsArgs(what="variants, tables, releases")


def add_arguments(parser) -> None:
    parser.add_argument("--tag", required=True, help="release name; results/releases/NAME/ must not exist yet")
    parser.add_argument("--retain", action=argparse.BooleanOptionalAction, default=True,
                        help="copy the variant ONNX files into the release (--no-retain records them as "
                             "deliberately not retained, which verify reports as such)")
    parser.add_argument("--hosts", default=None,
                        help="comma-separated hosts to include (default: every host with results for the variants)")
    parser.add_argument("--variants", default=None, metavar="DIR",
                        help="variants folder (with index.json); default: the latest `quantbench calibrate` output")
    RESULTS.add(parser)
    parser.add_argument("--archive", nargs="?", const="", default=None, metavar="FILE",
                        help="also write the release as one .tar.gz (manifest, tables, models deduplicated by hash, "
                             "report) to attach to a GitHub release; default FILE: results/releases/NAME.tar.gz. "
                             "The same release folder always gives the same bytes; two releases of the same results "
                             "differ only in their created_at time unless SOURCE_DATE_EPOCH is set (then they are "
                             "byte-identical). `quantbench verify FILE` checks it")
    parser.add_argument("--force", action="store_true",
                        help="with --archive: replace a file already at FILE (else it is an error, nothing written)")


def run(args) -> int:
    done = release(args.tag, RESULTS.parse(args), hosts=args.hosts, retain=args.retain, variants=args.variants,
                   archive=args.archive, force=args.force)
    res = done.result
    if res.refused:
        print(f"release {args.tag} REFUSED: {len(res.collisions)} release key(s) already name another artifact; "
              "nothing was written.")
        for c in res.collisions:
            print(f"  {c.line()}")
        print("A release key is (recipe, builder environment, target) without the artifact hash: the same recipe "
              "built again gave different bytes. Release the registered artifact, or change the recipe.")
        return 1
    archive = res.archive
    if getattr(args, "json", False):
        import json

        print(json.dumps(_json_summary(args.tag, res, archive), indent=2, sort_keys=True))
        return 0
    _print_release(done, archive)
    return 0


def _json_summary(tag: str, res, archive) -> dict:
    """The --json summary of a written release (`archive`: (file, sha256) or None)."""
    rec = res.record
    return {"tag": tag, "folder": str(res.folder), "record": str(res.folder / "release.json"),
            "archive": None if archive is None else {"file": str(archive[0]), "sha256": archive[1]},
            "variants": [{"name": v["name"], "variant_id": v["variant_id"], "raw_sha256": v["raw_sha256"],
                          "targets": [{"host": t["host"], "fingerprint_id": t["fingerprint_id"],
                                       "byte_class": t["byte_class"], "release_key": t["release_key"],
                                       "flips_vs_fp32": t["flips_vs_fp32"]} for t in v["targets"]]}
                         for v in rec["variants"]],
            "hosts": rec["hosts"], "equiv_ids": rec["equiv_ids"],
            "tables": {k: v["rows"] for k, v in rec["tables"].items()},
            "notes": res.notes, "reused_keys": res.reused_keys}


def _print_release(done, archive) -> None:
    """The text summary of a written release: one row per variant x host, then what was written where."""
    res, tag = done.result, done.tag
    rec = res.record
    print(done.targets_text())
    n_rows = sum(t["rows"] for t in rec["tables"].values())
    print()
    print(f"release {tag}: {len(rec['variants'])} variant(s) x {len(rec['hosts'])} host(s), "
          f"{len(rec['tables'])} tables ({n_rows} rows), artifacts "
          f"{'retained' if rec['retain'] else 'NOT retained (deliberately)'}")
    for note in res.notes:
        print(f"note: {note}")
    if res.reused_keys:
        print(f"{len(res.reused_keys)} release key(s) were already registered with the same artifact (re-released)")
    if not rec["equiv_ids"]:
        print("note: no `quantbench equiv` analysis of these variants; flips vs fp32 are not recorded")
    print(f"written: {res.folder}/ (release.json, report.md, tables/{', artifacts/' if rec['retain'] else ''}); "
          f"registry: {res.folder.parent / 'index.json'}")
    if archive is not None:
        print(f"archive: {archive[0]} (SHA-256 {archive[1]}; publish this hash beside the file)")
