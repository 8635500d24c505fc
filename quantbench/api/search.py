"""`quantbench.search(...)`: the ship search (the `search` command) from a static variant of the last calibrate run
on a fleet: the recipe that meets a decision budget on every host, written into the variants folder as a variant
(explain.search), the report's search section updated."""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quantbench.analysis import accuracy
from quantbench.analysis.decode import spec_for_variant
from quantbench.analysis.gates import DEFAULT_BUDGET
from quantbench.api.options import Fixtures, Fleet, Results, Session
from quantbench.api.plan import explain_hosts
from quantbench.errors import ParameterError, UserError, flag_mark, render_params
from quantbench.explain.search import SearchParams, SearchResult, search as walk_search
from quantbench.explain.searchreport import update_report
from quantbench.hosts.process import stop_spawner
from quantbench.hosts.registry import known_hosts
from quantbench.inputs.sidecarfile import check_identity, input_spec_for, sidecar_for
from quantbench.inputs.variantdir import INDEX_FILE, LATEST_FILE, latest_folder, latest_variants, load_variants
from quantbench.store import lazy

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy.module("pyarrow")

#: the columns of Search.candidates(), in order
CANDIDATE_COLUMNS = ("choice", "exclude", "variant_id", "stage", "passes", "worst", "float_share", "int8_weights",
                     "int8_macs", "size", "note")


@dataclass
class Search:
    """A finished search (explain.search.SearchResult: `.result`) and the report it updated."""

    result: SearchResult
    report: Path

    @property
    def passed(self) -> bool:
        """A candidate with int8 left meets every constraint on every host: a written variant, or the base as
        calibrated (all-float is never an answer)."""
        return self.result.passed

    @property
    def nearest(self) -> dict | None:
        """Where nothing passed: the nearest candidate with int8 left (its row, `name`, the `fixtures` its flips were
        counted on) and `change`, what would change the outcome; None when something passed."""
        return self.result.nearest

    @property
    def identity(self) -> dict:
        """With `identical=True`: {"classes": the answer's one class, or the nearest candidate's classes (host
        lists), "separating": per pair of those classes, the op localize finds first divergent, "candidate"}; {}
        without the constraint."""
        return self.result.identity

    def outcome(self) -> dict:
        """The search's outcome as plain data, for a caller that stores or sends it.

        Returns
        -------
        dict
            What `search --json` prints: passed, the stop line, the nearest candidate, the chosen one and where it
            and the result went.
        """
        r = self.result
        return {"passed": self.passed, "stop": r.stop, "nearest": r.nearest, "chosen": r.chosen,
                "variant": r.variant_name, "written": r.written, "evaluations": r.evaluations,
                "result_file": r.result_file, "report": str(self.report),
                **({"identity": r.identity} if r.identical else {})}

    @property
    def variant(self) -> str | None:
        """The chosen variant's name (the base's own when it meets the budget as calibrated)."""
        return self.result.variant_name

    @property
    def written(self) -> Path | None:
        """The variant file the search wrote; None when it wrote none."""
        return Path(self.result.written) if self.result.written else None

    @property
    def stop(self) -> str:
        """Why the search stopped (an answer, a ceiling reached, the space exhausted), as one line."""
        return self.result.stop

    def candidates(self) -> "pa.Table":
        """Every candidate tried, to see what the search spent its evaluations on.

        Returns
        -------
        pyarrow.Table
            One row per candidate, in the order tried (the result JSON's `tried`, flattened).
        """
        def flat(r: dict) -> dict:
            int8 = r.get("int8") or {}
            return {k: int8.get(k.removeprefix("int8_")) if k.startswith("int8_") else r.get(k)
                    for k in CANDIDATE_COLUMNS}
        return pa.Table.from_pylist([flat(r) for r in self.result.tried])


def _base(variant, results: Results) -> tuple:
    """(the base variant, the fp32 variant of its folder): `variant` a name of the last calibrate run under the
    results folder (None: its first static variant) or the .onnx of a variant in a variants folder calibrate wrote
    (the search re-makes it from the ranges and prepared model calibrate left beside it, and writes its answer
    there)."""
    if variant is not None and (Path(variant).suffix == ".onnx" or Path(variant).exists()):
        variants = _folder_of_file(Path(variant))
        base = next(v for v in variants if Path(v.path).resolve() == Path(variant).resolve())
    else:
        variants = latest_variants(_confined_latest(results.folder))
        statics = [v for v in variants if (v.recipe or {}).get("method") == "static"]
        if variant is None and not statics:
            raise UserError(f"the last calibrate run has no static variant to search from; pass {flag_mark('variant')}")
        base = statics[0] if variant is None else next((v for v in variants if v.name == variant), None)
        if base is None:
            raise UserError(f"{flag_mark('variant')} {variant}: not among the latest variants "
                            f"({', '.join(v.name for v in variants)})")
    fp32 = next((v for v in variants if v.name == "fp32"), None)
    if fp32 is None:
        raise UserError(f"{Path(base.path).parent}: no fp32 variant beside {base.name}; rerun `quantbench calibrate`")
    return base, fp32


def _folder_of_file(path: Path) -> list:
    """The variants of the folder holding the variant file `path` (calibrate's index.json beside it)."""
    if not path.is_file():
        raise UserError(f"{flag_mark('variant')} {path}: not found (a variant name, or the .onnx file of a variant)")
    variants = load_variants(path.parent) if (path.parent / INDEX_FILE).is_file() else []
    if not any(Path(v.path).resolve() == path.resolve() for v in variants):
        raise UserError(f"{flag_mark('variant')} {path}: not a variant of a variants folder calibrate wrote (none "
                        "lists it in an index.json beside it); the search re-makes its base from the ranges and "
                        "prepared model calibrate leaves there: give a variant name or a variant's .onnx there")
    return variants


def _confined_latest(results_dir: Path) -> Path:
    """`results_dir`, once its variants/latest.json names a folder inside the working folder or the results
    folder: the search writes its answer into that folder, and a latest.json (a file a shared results folder can
    bring) naming one elsewhere is refused."""
    folder = latest_folder(results_dir).resolve()
    if not any(folder == root or root in folder.parents for root in (Path.cwd().resolve(), results_dir.resolve())):
        raise UserError(f"{Path(results_dir) / 'variants' / LATEST_FILE}: names the variants folder {folder}, outside "
                        "the working folder and the results folder; the search writes its answer there, so it "
                        f"takes such a folder only by its variant's path ({flag_mark('variant')} "
                        f"{folder}/NAME.onnx); nothing was run")
    return results_dir


def _check_groups(variant, fleet, fixtures, session, results) -> None:
    """The option groups of their types (the command line builds them; a Python caller may pass anything)."""
    if variant is not None and not isinstance(variant, (str, os.PathLike)):
        raise ParameterError("variant", "must be a variant name or an .onnx path (or None: the last calibrate "
                             "run's first static variant)", variant)
    for param, value, kind, example in (("fleet", fleet, Fleet, "Fleet('x86,x86-avx2')"),
                                        ("fixtures", fixtures, Fixtures, "Fixtures()"),
                                        ("session", session, Session, "Session()"),
                                        ("results", results, Results, "Results('results')")):
        if not isinstance(value, kind):
            raise ParameterError(param, f"must be a quantbench.{kind.__name__}, e.g. {example}", value)


def _check_session(fleet: Fleet, session: Session) -> None:
    """A session setting the answer would not carry is refused: the figures of a search hold under the session
    they were measured in, and its answer (a variant) records only session config entries, as its requirement.
    An entry to deploy with belongs in the base's recipe (its session requirement, recorded at calibrate): the
    search then runs every host under it and its answer carries it."""
    if session.config:
        raise ParameterError("session_config", "the search's answer carries only the session entries its variant "
                             f"records; record {', '.join(repr(f'{k}={v}') for k, v in session.config.items())} as the "
                             "variant's session requirement at calibrate (the search then runs every host under it "
                             "and its answer carries it), or search without it; nothing was run")
    if session.graph_opt is not None:
        raise ParameterError("graph_opt", "a variant cannot record a graph optimization level, so an answer found "
                             "under one would ship without it; the search runs every host at its deployed level: "
                             "search without it; nothing was run", session.graph_opt)
    per_host = [item for item in (fleet.names() or "").split(",") if "+" in item]
    if per_host:
        raise ParameterError("hosts", f"{per_host[0].strip()!r}: a per-host session override gives one host a "
                             "session the answer would not carry; name the host alone (an entry to deploy with is "
                             "recorded as the variant's session requirement at calibrate); nothing was run")


def _accuracy(base, spec, fixtures, plan, max_drop: float) -> tuple:
    """(the accuracy plan, the truth) a max drop holds candidates to: the report's metric against the labels the
    fixtures were made from (top-1, AP, text); one line when there is none."""
    truth = accuracy.truth_of_fixtures(fixtures, input_spec_for(base), plan.labels, plan.images)
    scored = accuracy.plan(spec, sidecar_for(base), truth, [fx.fixture_id for fx in fixtures])
    if isinstance(scored, str):
        raise UserError(f"{flag_mark('max_drop')} {max_drop:g}: no accuracy against labels to hold the candidates "
                        f"to ({scored})")
    return scored, truth


def search(variant, fleet: Fleet, fixtures: Fixtures = Fixtures(), session: Session = Session(),
           results: Results = Results(), *, budget: int | str = DEFAULT_BUDGET, max_float_share: float | None = None,
           max_size: int | None = None, max_latency_ms: float | None = None, max_evaluations: int = 200,
           max_seconds: float | None = None, space: str = "all", screen_fixtures: int = 4, error_images: int = 4,
           jobs: int = 1, name: str | None = None, decode: str | None = None, limit: int | None = None,
           render=render_params, on_status=None, max_drop: float | None = None, identical: bool = False,
           notes_to_stderr: bool = False) -> Search:
    """Search for the int8 recipe that holds on the whole fleet: global remedies, then nodes kept in float chosen by
    measurement, within the budget and the ceilings; the answer is written beside the base as a variant. The
    evaluations are cached under the results folder's `search/`, so a rerun resumes from them.

    Parameters
    ----------
    variant : str or path, optional
        A static variant name of the last calibrate run (None: its first static one), or a variant's .onnx in a
        variants folder calibrate wrote.
    fleet : Fleet
        The hosts, any mix of kinds (an imported one is predicted from a host with its outputs).
    fixtures : Fixtures
        The labelled images candidates are confirmed on.
    session : Session
        Session options for every host.
    results : Results
        The results folder (the search's cache and the report).
    budget : int or str
        Decision flips against fp32 allowed per host, or a share of the decisions fp32 serves there (``"1%"``).
    max_float_share : float, optional
        Ceiling on the share of weights kept in float (0..1).
    max_size : int, optional
        Ceiling on the variant's file size, bytes.
    max_latency_ms : float, optional
        Ceiling on a confirmed candidate's median latency on every host that measures latency (local, ssh).
    max_evaluations : int
        Fleet evaluations (candidate x host) to spend.
    max_seconds : float, optional
        Wall time to spend.
    space : str
        ``global`` choices, ``nodes`` kept in float, or ``all`` (both).
    screen_fixtures : int
        Fixtures nearest the threshold screened first, so a failing candidate costs little.
    error_images : int
        Calibration images the per-node error is measured on.
    jobs : int
        Hosts run at once.
    name : str, optional
        The written variant's name (None: named for what it is).
    decode : str, optional
        How outputs become decisions (None: the sidecar's).
    limit : int, optional
        Eval fixtures to confirm on (None: every one of the split).
    render : callable
        Names a parameter in a note (the command line: its flag).
    on_status : callable, optional
        Called with one line per phase begun and candidate confirmed, for progress.
    max_drop : float, optional
        The accuracy against the labels may fall at most this much below fp32's on every host (0..1).
    identical : bool
        The answer must also give byte-identical outputs (one class) on every measured host; without one, the
        nearest candidate's classes and the ops separating them (`Search.identity`).
    notes_to_stderr : bool
        The plan's notes (the images a limit took) on stderr, for a caller printing JSON on stdout.

    Returns
    -------
    Search
        The outcome: whether a candidate passed, the chosen or nearest one, the variant written and the report.
    """
    _check_groups(variant, fleet, fixtures, session, results)
    _check_session(fleet, session)
    params = SearchParams(budget, max_float_share, max_size, max_latency_ms, max_evaluations, max_seconds, space,
                          screen_fixtures, error_images, jobs, name, max_drop, identical)
    params.check()
    base, fp32 = _base(variant, results)
    hosts, plan = explain_hosts(fleet, session, fixtures, base, limit, render, to_stderr=notes_to_stderr)
    (vi,) = plan.variants
    check_identity(fp32)
    spec = spec_for_variant(base, decode, vi.outputs)
    if spec is None:
        raise UserError(f"{base.path}: no decoder; search counts decision flips, so pass {flag_mark('decode')} KIND")
    unchecked = unchecked_hosts(known_hosts(fleet.hosts_file), [h.spec for h in hosts])
    fxs = plan.fixtures_for[vi.variant_id]
    scored = _accuracy(base, spec, fxs, plan, max_drop) if max_drop is not None else None
    with _caller_process_kept():
        result = walk_search(base, fp32.path, hosts, fxs, spec, params, results.folder / "search",
                             on_status=on_status, coverage={"limit": plan.limit, "unchecked_hosts": unchecked},
                             accuracy=scored)
    return Search(result, update_report(result, results.folder))


def unchecked_hosts(known: dict, searched: list) -> list[str]:
    """The known hosts (name -> HostSpec) the search did not run, sorted: another name for a host it ran (`local`
    for `x86`: the same kind, options and session) is that host, not one left unchecked."""
    def same(spec):
        return (spec.kind, sorted(spec.options.items()), sorted(spec.session.items()))

    ran = [same(s) for s in searched]
    return sorted(n for n, spec in known.items() if n not in {s.name for s in searched} and same(spec) not in ran)


@contextlib.contextmanager
def _caller_process_kept():
    """The caller's process as it was: onnxruntime's quantizer logs with logging.warning(), which gives a root
    logger without a handler a stderr handler for good (basicConfig), so its warnings go through Python's last
    resort handler meanwhile instead (shown as without a handler, nothing left on the root logger); and the thread
    that started the workers stops once they are all closed."""
    root = logging.getLogger()
    bare = not root.handlers
    if bare:
        root.addHandler(logging.lastResort)
    try:
        yield
    finally:
        if bare:
            root.removeHandler(logging.lastResort)
        stop_spawner()
