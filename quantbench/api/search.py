"""`quantbench.search(...)`: the ship search (the `search` command) from a static variant of the last calibrate run
on a fleet: the recipe that meets a decision budget on every host, written into the variants folder as a variant
(explain.search), the report's search section updated."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quantbench.analysis import accuracy as A
from quantbench.analysis.decode import spec_for_variant
from quantbench.analysis.gates import DEFAULT_BUDGET
from quantbench.api.options import Fixtures, Fleet, Results, Session
from quantbench.api.plan import explain_hosts
from quantbench.errors import UserError, flag_mark, render_params
from quantbench.explain.search import SearchParams, search as walk_search
from quantbench.explain.searchreport import update_report
from quantbench.hosts.registry import known_hosts
from quantbench.inputs.sidecarfile import check_identity, input_spec_for, sidecar_for
from quantbench.inputs.variantdir import latest_variants, pick_variant
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

    result: object
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

    def outcome(self) -> dict:
        """What `search --json` prints: passed, the stop line, the nearest candidate, the chosen one and where it
        and the result went."""
        r = self.result
        return {"passed": self.passed, "stop": r.stop, "nearest": r.nearest, "chosen": r.chosen,
                "variant": r.variant_name, "written": r.written, "evaluations": r.evaluations,
                "result_file": r.result_file, "report": str(self.report)}

    @property
    def variant(self) -> str | None:
        """The chosen variant's name (the base's own when it meets the budget as calibrated)."""
        return self.result.variant_name

    @property
    def written(self) -> Path | None:
        return Path(self.result.written) if self.result.written else None

    @property
    def stop(self) -> str:
        return self.result.stop

    def candidates(self) -> "pa.Table":
        """Every candidate tried, in the order tried (the result JSON's `tried`, flattened)."""
        def flat(r: dict) -> dict:
            int8 = r.get("int8") or {}
            return {k: int8.get(k.removeprefix("int8_")) if k.startswith("int8_") else r.get(k)
                    for k in CANDIDATE_COLUMNS}
        return pa.Table.from_pylist([flat(r) for r in self.result.tried])


def _base(variant):
    if variant:
        return pick_variant(str(variant))
    statics = [v for v in latest_variants() if (v.recipe or {}).get("method") == "static"]
    if not statics:
        raise UserError(f"the last calibrate run has no static variant to search from; pass {flag_mark('variant')}")
    return statics[0]


def _accuracy(base, spec, fixtures, plan, max_drop: float) -> tuple:
    """(the accuracy plan, the truth) a max drop holds candidates to: the report's metric against the labels the
    fixtures were made from (top-1, AP, text); one line when there is none."""
    truth = A.truth_of_fixtures(fixtures, input_spec_for(base), plan.labels, plan.images)
    scored = A.plan(spec, sidecar_for(base), truth, [fx.fixture_id for fx in fixtures])
    if isinstance(scored, str):
        raise UserError(f"{flag_mark('max_drop')} {max_drop:g}: no accuracy against labels to hold the candidates "
                        f"to ({scored})")
    return scored, truth


def search(variant, fleet: Fleet, fixtures: Fixtures = Fixtures(), session: Session = Session(),
           results: Results = Results(), *, budget: int | str = DEFAULT_BUDGET, max_float_share: float | None = None,
           max_size: int | None = None, max_latency_ms: float | None = None, max_evaluations: int = 200,
           max_seconds: float | None = None, space: str = "all", screen_fixtures: int = 4, error_images: int = 4,
           jobs: int = 1, name: str | None = None, decode: str | None = None, limit: int | None = None,
           render=render_params, on_status=None, max_drop: float | None = None) -> Search:
    """Search from `variant` (a static variant name of the last calibrate run; None: its first static one) on
    `fleet` (any mix of host kinds; imported ones are predicted from a host with their outputs) for the recipe meeting `budget` (decision flips against fp32 per host, or a share of the decisions fp32 serves there: "1%") within the ceilings; the answer
    is written beside the base (named for what it is, or `name`). The evaluations are cached under the results
    folder's `search/` and a rerun resumes from them."""
    params = SearchParams(budget, max_float_share, max_size, max_latency_ms, max_evaluations, max_seconds, space,
                          screen_fixtures, error_images, jobs, name, max_drop)
    params.check()
    base = _base(variant)
    hosts, plan = explain_hosts(fleet, session, fixtures, base, limit, render)
    (vi,) = plan.variants
    fp32 = pick_variant("fp32") if variant is None or not Path(str(variant)).exists() else None
    if fp32 is None:
        raise UserError(f"{flag_mark('variant')} {variant}: give a variant name of the last calibrate run (the search "
                        "re-makes it from the ranges and prepared model calibrate left beside it)")
    check_identity(fp32)
    spec = spec_for_variant(base, decode, vi.outputs)
    if spec is None:
        raise UserError(f"{base.path}: no decoder; search counts decision flips, so pass {flag_mark('decode')} KIND")
    unchecked = sorted(set(known_hosts(fleet.hosts_file)) - {h.spec.name for h in hosts})
    fxs = plan.fixtures_for[vi.variant_id]
    scored = _accuracy(base, spec, fxs, plan, max_drop) if max_drop is not None else None
    result = walk_search(base, fp32.path, hosts, fxs, spec, params, results.folder / "search", on_status=on_status,
                         coverage={"limit": plan.limit, "unchecked_hosts": unchecked}, accuracy=scored)
    return Search(result, update_report(result, results.folder))
