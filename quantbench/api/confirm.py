"""`equiv(confirm=K)`: one run in which predicted hosts confirm on a few fixtures (analysis.confirm says why;
runs.confirmboard coordinates the hosts' threads), then the confirmed hosts' inherited rows."""

from __future__ import annotations

import dataclasses
import sys

from quantbench.analysis import confirm as confirm_choice
from quantbench.errors import ParameterError
from quantbench.runs.confirmboard import ConfirmBoard
from quantbench.hosts.keys import run_key
from quantbench.hosts.requirements import host_key
from quantbench.store import partread, partwrite
from quantbench.store.hostresults import load_outputs
from quantbench.runs.runner import RunSummary

ALL = confirm_choice.ALL
DEFAULT_CONFIRM = confirm_choice.DEFAULT_CONFIRM


def check_confirm(confirm) -> int | None:
    """The K of `confirm` (a whole number >= 1: no host inherits unmeasured; or "all": None, every host runs every
    fixture)."""
    if isinstance(confirm, str) and confirm.strip().lower() == ALL:
        return None
    if isinstance(confirm, str) and confirm.strip().isdigit():
        confirm = int(confirm.strip())
    if isinstance(confirm, bool) or not isinstance(confirm, int) or confirm < 1:
        raise ParameterError("confirm", "must be a whole number of fixtures, at least 1, or 'all'", confirm)
    return confirm


def earlier_hints(root, variant_ids) -> tuple[set, dict]:
    """(the fixtures that separated classes in an earlier analysis of these variants in the tables: a ref-same
    flip, their |margins| nearest the threshold there): what ranks the confirming fixtures, read before the run
    (the same tables give the same choice; fresh tables rank by fixture id)."""
    vids = sorted(variant_ids)
    flips = partread.read("flips", root=root, columns=["variant_id", "fixture_id", "comparison"],
                          filter={"variant_id": vids})
    separating = {r["fixture_id"] for r in flips.to_pylist() if r["comparison"] == "ref-same"}
    decisions = partread.read("decisions", root=root, columns=["variant_id", "fixture_id", "margin"],
                              filter={"variant_id": vids})
    return separating, confirm_choice.nearest_margins(decisions.to_pylist())


def _hash_rows(hosts, sel: dict, root, inherited: bool = False) -> list:
    """Outputs rows (hashes) of `hosts` measured (`inherited`: or inherited) under this run's (fingerprint,
    session) (`sel`)."""
    cols = ["host", "fingerprint_id", "session_key", "session_options", "variant_id", "fixture_id", "output_name",
            "sha256", "inherited"]
    t = load_outputs(host=list(hosts), columns=cols, tables_root=root)
    return [r for r in t.to_pylist() if (inherited or r["inherited"] is None) and r["host"] in sel
            and (r["fingerprint_id"], host_key(r["session_options"], r["session_key"])) == sel[r["host"]]]


@dataclasses.dataclass
class Confirmed:
    """What the run did: its summary, (host, variant_id) -> anchor inherited from, the misses."""

    summary: RunSummary
    inherited: dict[tuple[str, str], str]
    misses: list[dict]


def run_confirmed(plan, k: int | None, run, reference: str | None, root) -> Confirmed:
    """Run `plan` once (with `run`: (plan, runs.confirmboard.ConfirmBoard or None) -> RunSummary): the hosts
    predicted from this run's own fingerprints run their confirming fixtures first and the rest only where those
    differ; the confirmed ones' other rows inherited afterwards (written to the outputs table)."""
    if k is None or len(plan.names) < 2:   # one host: nothing to predict, so no board to feed
        return Confirmed(run(plan, None), {}, [])
    full = {vid: sorted(fx.fixture_id for fx in fxs) for vid, fxs in plan.fixtures_for.items()}
    order = plan.names if reference is None else [reference] + [n for n in plan.names if n != reference]
    separating, margins = earlier_hints(root, full)
    first = {v: confirm_choice.confirm_fixtures(k, full[v], v, separating, margins) for v in full}
    paths, memo = {vi.variant_id: str(vi.path) for vi in plan.variants}, {}
    board = ConfirmBoard(order, first, lambda hosts, infos: confirm_choice.predicted_anchors(hosts, infos, paths, memo),
                         confirm_choice.host_info)
    summary = run(plan, board)
    inherited, misses = board.outcome()
    sel = {h.name: (h.fingerprint_id, h.session_key) for h in summary.hosts if h.fingerprint_id}
    held = _inherit(inherited, first, sel, plan, root)
    for m in misses:
        print(f"note: {m['host']} was predicted to share {m['anchor']}'s class, but its confirming fixtures differ: "
              "run in full (a prediction miss, kept in equiv.json)", file=sys.stderr)
    return Confirmed(summary, held, misses)


def _inherit(inherited: dict, first: dict, sel: dict, plan, root) -> dict:
    """Write the rows each confirmed (host, variant) inherits from its anchor (the fixtures it has no row of);
    returns the pairs that hold inherited rows, with their anchor (a host measured in full inherits nothing)."""
    names = {vi.variant_id: vi for vi in plan.variants}
    out = {}
    for (h, v), a in sorted(inherited.items()):
        own = [r for r in _hash_rows([h], sel, root, inherited=True) if r["variant_id"] == v]
        measured = [r for r in own if r["inherited"] is None]
        if not measured:
            continue
        skey, opts = measured[0]["session_key"], measured[0]["session_options"]
        have = {r["fixture_id"] for r in own}
        if any(r["inherited"] is not None for r in own):
            out[(h, v)] = a
        rows = [r for r in load_outputs(host=a, variant_id=v, fingerprint_id=sel[a][0], tables_root=root).to_pylist()
                if r["inherited"] is None and r["fixture_id"] not in have
                and host_key(r["session_options"], r["session_key"]) == sel[a][1]]
        if not rows:
            continue
        fid = sel[h][0]
        new = confirm_choice.inherited_rows(rows, h, fid, skey, opts, lambda vid, fx: run_key(vid, fx, fid, skey))
        partwrite.append("outputs", new, root=root)
        out[(h, v)] = a
        print(f"note: {h} {names[v].name}: byte-identical to {a} on its {len(first[v])} confirming fixtures; "
              f"inherits its other {len({r['fixture_id'] for r in rows})}", file=sys.stderr)
    return out
