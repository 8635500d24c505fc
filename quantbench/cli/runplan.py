"""The flags of a command that runs hosts, as library parameters: --variants, the fixture flags, --sidecar and
the notes a run plan prints. Only the commands that run hosts import it (run, equiv and the explain commands), so
`quantbench --help` and the other commands never load the variants, the fixtures or the recipe (numpy)."""

from __future__ import annotations

import sys

from quantbench.fixtures import limit_note
from quantbench.hosts.registry import parse_hosts
from quantbench.hosts.runner import plan_run
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


def fixture_params(args) -> dict:
    """The fixture flags (--fixtures, --images, --split, --limit, --sidecar) as hosts.runner.plan_run parameters."""
    return {"labels": args.fixtures, "images": args.images, "split": args.split, "limit": args.limit,
            "sidecar": sidecar_from_args(args)}


def explain_plan(args, hosts, variants, limit: int | None = None):
    """The run plan of an explain command (hosts.runner.plan_run) from its fixture flags: each model parsed once
    and kept on the plan (`models`) for the commands that read its graph; `hosts` its --hosts items, each
    started later under its own session (explain.localize.start_workers), so they are not asked ready here."""
    plan = plan_run([h.spec for h in hosts], variants, labels=args.fixtures, images=args.images, split=args.split,
                    limit=limit, check_hosts=False, keep_models=True)
    note_plan(args, plan)
    return plan


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
