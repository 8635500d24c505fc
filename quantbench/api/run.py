"""`quantbench.run(...)`: every variant x fixture on every host, hashed, into the result tables (the `run` command)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from quantbench.store import lazy
from quantbench.store import arrowrows, partread, tablelock, tableschema
from quantbench.api.options import Fixtures, Fleet, Output, Results, Session, check_groups, check_path, check_text
from quantbench.api.plan import fixture_params, note_plan, variants_named
from quantbench.errors import UserError, flag_mark, render_params
from quantbench.fsutil import check_new_file
from quantbench.runs.cluster import connect_plan
from quantbench.hosts.imported import export_results
from quantbench.hosts.registry import announce_hosts_file, check_host_name, parse_hosts
from quantbench.runs.runner import RunFailed, RunPlan, RunSummary, announce_jobs, plan_run, run_plan

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy.module("pyarrow")

DEFAULT_HOSTS = "x86"


@dataclass
class RunResult:
    """A run: its summary (runs.runner.RunSummary), the plan it ran, where its tables are, the export written
    (its manifest) and the failure that ended it (runs.runner.RunFailed, raised by check())."""

    summary: RunSummary
    plan: RunPlan
    tables_root: Path
    manifest: dict | None = None
    failure: Exception | None = None
    notes: list[str] = field(default_factory=list)

    def outputs(self, tensors: bool = False) -> "pa.Table":
        """The outputs this run's hosts, variants and fixtures have in the tables (run now or reused).

        Parameters
        ----------
        tensors : bool
            Also the tensors themselves (large); without: their hashes only.

        Returns
        -------
        pyarrow.Table
            The `outputs` table's rows.
        """
        columns = [c for c, _, _ in tableschema.COLUMNS["outputs"] if tensors or c != "tensor"]
        return partread.read("outputs", root=self.tables_root, columns=columns,
                           filter={"host": [h.name for h in self.summary.hosts],
                                   "variant_id": [v.variant_id for v in self.summary.variants],
                                   "fixture_id": list(self.summary.fixture_ids)})

    def check(self) -> "RunResult":
        """The run as a gate: a host that could not run fails it.

        Returns
        -------
        RunResult
            This result, when every host ran; else the failure that ended the run (RunFailed) is raised.
        """
        if self.failure is not None:
            raise self.failure
        return self


def _check_export(export, as_host, specs) -> None:
    """`as_host` names the one host of an export."""
    if as_host is not None and not export:
        raise UserError(f"{flag_mark('as_host')} names the host of an {flag_mark('export')}; add {flag_mark('export')} FILE")
    if as_host is not None:
        check_host_name(as_host, flag_mark("as_host"))
    if as_host is not None and len(specs) != 1:
        raise UserError(f"{flag_mark('as_host')} {as_host}: names one host, and {flag_mark('hosts')} has {len(specs)}")


def run(variants=None, fleet: Fleet = Fleet(DEFAULT_HOSTS), fixtures: Fixtures = Fixtures(),
        session: Session = Session(), results: Results = Results(), output: Output = Output(),
        jobs: int | None = None, cluster: str | None = None, shard: str | None = None, export=None,
        as_host: str | None = None, force: bool = False, wait: bool = True, render=render_params) -> RunResult:
    """Run every variant on every fixture on each host of `fleet`, into `results`' tables, without analysing (the
    `run` command): results already in the tables are reused, so a later equiv runs nothing again.

    Parameters
    ----------
    variants : str, path or list, optional
        Variants folders or .onnx files (None: the latest calibrate output, else the demo models).
    fleet : Fleet
        The hosts.
    fixtures : Fixtures
        The labelled images run.
    session : Session
        Session options overriding each host's deployed session.
    results : Results
        Where the tables go.
    output : Output
        Progress and what is printed.
    jobs : int, optional
        Worker processes in total (None: the core count; at most that).
    cluster : str, optional
        The Dask scheduler (``tcp://HOST:8786``) that runs the emulated hosts; the others run here.
    shard : str, optional
        ``K/N``: run only shard K of N of the fixtures, to export and merge on one imported host.
    export : str or path, optional
        Also write the hosts' results to this file, for an imported host on another machine.
    as_host : str, optional
        The name the one exported host takes there.
    force : bool
        Replace a file already at `export` (else refused before the run).
    wait : bool
        Wait for another command holding the tables (False: refuse at once).
    render : callable
        Names a parameter in a note (the command line: its flag).

    Returns
    -------
    RunResult
        The run's summary and plan; a host that could not run is in `failure` (RunResult.check raises it).
    """
    check_groups(fleet=fleet, fixtures=fixtures, session=session, results=results, output=output)
    check_path("export", export)
    check_text("cluster", cluster)
    if export:   # before the run: a refused file costs no run and writes nothing
        check_new_file(export, "export", force)
    resolved = variants_named(variants, to_stderr=output.json)   # the demo says so first
    announce_hosts_file(fleet.hosts_file, to_stderr=output.json)
    jobs = announce_jobs(jobs, to_stderr=output.json)   # capped at the cores
    specs = [h.spec for h in parse_hosts(fleet.names(), hosts_file=fleet.hosts_file, overrides=False)]
    _check_export(export, as_host, specs)   # every host ready before the lock: a refusal writes nothing
    plan = plan_run(specs, resolved, **fixture_params(fixtures), session=session.overrides(), command="run",
                    shard=shard)
    note_plan(plan, output.json, render)
    root = results.tables
    failure = None
    held = connect_plan(cluster, plan) if cluster else contextlib.nullcontext()   # checked first
    with held, tablelock.lock(root, wait=wait), arrowrows.run_scope(plan.run_id):
        try:
            summary = run_plan(plan, require_providers=session.require_providers, progress=output.bars(),
                               tables_root=root, jobs=jobs, cluster=held if cluster else None)
        except RunFailed as exc:
            failure, summary = exc, exc.summary
    manifest = None
    if export and failure is None:
        manifest = export_results(export, plan.names, [v.variant_id for v in summary.variants], summary.fixture_ids,
                                  root, shard=plan.shard, as_host=as_host, force=force)
    return RunResult(summary, plan, root, manifest, failure)
