"""The run plan's inputs from the option groups: the variants named (or the latest calibrate output, else the
bundled demo), the fixture group as runs.runner.plan_run parameters, and the notes a plan prints."""

from __future__ import annotations

import sys

from quantbench.api.options import Fixtures, Fleet, Session, variant_list
from quantbench.errors import UserError, flag_mark, render_params
from quantbench.hosts.registry import parse_hosts
from quantbench.hosts.requirements import for_hosts
from quantbench.runs.runner import plan_run
from quantbench.inputs.fixtures import limit_note
from quantbench.inputs.sidecarfile import load_sidecar_file
from quantbench.inputs.variantdir import DEMO_NOTE, Variant, is_demo, resolve_variants


def variants_named(variants=None, fp32=None, to_stderr: bool = False) -> list:
    """The variants `variants` names (folders or .onnx files; already resolved Variants are kept; None: the latest
    calibrate output, else the demo models); a run on the bundled demo models says so first (on stderr when stdout
    is JSON)."""
    variants = variant_list(variants)
    if variants and all(isinstance(v, Variant) for v in variants) and fp32 is None:
        return list(variants)
    paths = None if not variants else [str(v) for v in variants]
    out = resolve_variants(paths, fp32)
    if not paths and is_demo(v.path for v in out):
        print(DEMO_NOTE, file=sys.stderr if to_stderr else sys.stdout, flush=True)
    return out


def fixture_params(fixtures: Fixtures) -> dict:
    """The fixture group as runs.runner.plan_run parameters (its sidecar file read once, here)."""
    return {"labels": fixtures.labels, "images": fixtures.images, "split": fixtures.split, "limit": fixtures.limit,
            "sidecar": load_sidecar_file(fixtures.sidecar) if fixtures.sidecar else None}


def note_plan(plan, to_stderr: bool = False, render=render_params) -> None:
    """After plan_run: which fixtures a shard took, the plan's notes, and which images a limit took (the labels
    it read are plan.labels and plan.images: the report, equiv.json and the accuracy read the same). `render`
    shows a parameter's mark (errors.flag_mark): its name, or on the command line its flag."""
    out = sys.stderr if to_stderr else sys.stdout
    if plan.shard is not None:
        print(render(f"{flag_mark('shard')} {plan.shard['k']}/{plan.shard['n']}: {len(plan.fixtures)} of the run's "
                     f"fixtures (fixture set {plan.shard['fixture_set'][:12]})"), file=out)
    for note in plan.notes:
        print(f"note: {render(note)}", file=out)
    if plan.limit is not None:
        print(render(f"{flag_mark('limit')} {plan.limit}: {limit_note(plan.fixtures)}"), file=out)


def explain_plan(fixtures: Fixtures, hosts, variants, limit: int | None = None, render=render_params,
                 to_stderr: bool = False):
    """The run plan of an explain command (runs.runner.plan_run) from its fixture group: each model parsed once
    and kept on the plan (`models`) for the commands that read its graph; `hosts` its --hosts items, each
    started later under its own session (explain.localize.start_workers), so they are not asked ready here. Its
    notes on stderr with `to_stderr` (the command prints JSON on stdout)."""
    plan = plan_run([h.spec for h in hosts], variants, labels=fixtures.labels, images=fixtures.images,
                    split=fixtures.split, limit=limit, check_hosts=False, keep_models=True)
    note_plan(plan, to_stderr, render)
    return plan


def explain_hosts(fleet: Fleet, session: Session, fixtures: Fixtures, variant, limit: int | None = None,
                  render=render_params, requirement: bool = True, compares: bool = False,
                  to_stderr: bool = False) -> tuple[list, object]:
    """(the hosts, the run plan) of an explain command or search on `variant`: `fleet`, each host under `session`
    and, with `requirement`, the variant's session requirement too (hosts.requirements.for_hosts: the variant as
    shipped runs under it; remedy adds it to each remedy instead), and explain_plan's plan of them. `compares`: the
    command compares hosts, so one host is refused before the model is read."""
    hosts = parse_hosts(fleet.names(), session.overrides(), fleet.hosts_file)
    if compares and len(hosts) < 2:
        raise UserError(f"{flag_mark('hosts')}: name at least two hosts to compare")
    if requirement:
        hosts = for_hosts(hosts, variant)
    return hosts, explain_plan(fixtures, hosts, [variant], limit, render, to_stderr)
