"""The flags of a command that runs hosts, as library parameters: --variants, the fixture flags, --sidecar and
the notes a run plan prints. Only the commands that run hosts import it (run, equiv and the explain commands), so
`quantbench --help` and the other commands never load the variants, the fixtures or the recipe (numpy)."""

from __future__ import annotations

import sys

from quantbench.errors import UserError
from quantbench.fixtures import calibration_labels, fixtures_for_variants, limit_note, no_fixtures_message
from quantbench.hosts.registry import parse_hosts
from quantbench.recipe import load_sidecar_file
from quantbench.variants import DEMO_NOTE, is_demo, resolve_variants


def sidecar_from_args(args) -> dict | None:
    """--sidecar FILE -> the sidecar dict (None when not given); a command reads it once and passes it on."""
    path = getattr(args, "sidecar", None)
    return None if not path else load_sidecar_file(path)


def variants_from_args(args, to_stderr: bool = False) -> list:
    """--variants -> the variants; a run on the bundled demo models says so in its first line
    (on stderr when stdout is JSON)."""
    variants = resolve_variants(args.variants, getattr(args, "fp32", None))
    if not args.variants and is_demo(v.path for v in variants):
        print(DEMO_NOTE, file=sys.stderr if to_stderr else sys.stdout, flush=True)
    return variants


def fixtures_from_args(args, variants, limit: int | None = None, sidecar: dict | None = None) -> list:
    """The evaluation fixtures the fixture flags (--fixtures, --images, --split, --sidecar, --limit) select;
    `sidecar`: the --sidecar file the command already read (sidecar_from_args), else it is read here.

    Without --fixtures: the labels the variants were calibrated with (fixtures.calibration_labels),
    set on `args` as if given, so the report, equiv.json and the accuracy read the same labels."""
    if not args.fixtures:
        args.fixtures, args.images = calibration_labels(variants, args.images)
    fixtures, _ = fixtures_for_variants(variants, args.fixtures, args.images, args.split, limit,
                                        sidecar if sidecar is not None else sidecar_from_args(args))
    if not fixtures:
        raise UserError(no_fixtures_message(args.fixtures, args.split))
    if limit is not None:
        print(f"--limit {limit}: {limit_note(fixtures)}", file=sys.stderr if getattr(args, "json", False) else sys.stdout)
    return fixtures


def fixture_params(args) -> dict:
    """The fixture flags (--fixtures, --images, --split, --limit, --sidecar) as hosts.runner.plan_run parameters."""
    return {"labels": args.fixtures, "images": args.images, "split": args.split, "limit": args.limit,
            "sidecar": sidecar_from_args(args)}


def note_plan(args, plan) -> None:
    """After plan_run: the labels it read are set on `args` as if given (the report, equiv.json and the accuracy
    read the same labels), and a --limit says which images it took."""
    args.fixtures, args.images = plan.labels, plan.images
    if plan.shard is not None:
        print(f"--shard {plan.shard['k']}/{plan.shard['n']}: {len(plan.fixtures)} of the run's fixtures (fixture set "
              f"{plan.shard['fixture_set'][:12]})", file=sys.stderr if getattr(args, "json", False) else sys.stdout)
    for note in plan.notes:
        print(f"note: {note}", file=sys.stderr if getattr(args, "json", False) else sys.stdout)
    if plan.limit is not None:
        print(f"--limit {plan.limit}: {limit_note(plan.fixtures)}",
              file=sys.stderr if getattr(args, "json", False) else sys.stdout)


def fleet_from_args(args) -> list:
    """--hosts, --hosts-file -> the fleet's host requests (hosts.registry.parse_hosts); [] when no --hosts."""
    return parse_hosts(args.hosts, None, args.hosts_file) if args.hosts else []
