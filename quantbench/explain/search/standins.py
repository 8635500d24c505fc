"""Imported hosts in the search's fleet: results of a machine the search cannot reach stand in for what it cannot run.

An imported host (hosts kind `imported`) holds the outputs of the models it ran, never of the candidates a search
makes. Its file must hold fp32 and the base variant on every fixture of the search (checked as a merge checks it).
Then:

- a host the search runs whose outputs of fp32 AND the base variant are byte-identical to the imported host's on
  those fixtures (one equivalence class over both: analysis.classes.equivalence_classes) stands in for it: each
  candidate's flips there are the stand-in's, marked "predicted from <host> (same outputs on fp32 and <base>)";
- with no such host, its flips of the base variant are known from its rows (they count: the base cannot pass
  where its rows flip, and its flipping fixtures are screened first), but no candidate can be evaluated there: the
  answer is unconfirmed on that host, and the stop line says so and how to confirm it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quantbench.analysis.classes import equivalence_classes
from quantbench.analysis.decisions import compare
from quantbench.analysis.tiers import Int8Path, int8_path
from quantbench.errors import UserError
from quantbench.explain.localize import decode_runs
from quantbench.hosts.imported import held_results
from quantbench.hosts.keys import session_key
from quantbench.hosts.shards import files_of
from quantbench.store.hostresults import tensor_from_row


@dataclass
class ImportedMember:
    """One imported host of the fleet: its fp32 decisions, its base flips, the host that stands in for it."""

    label: str
    base_name: str
    fp32: dict                 # {fixture_id: Decoded}
    base_flips: dict           # {fixture_id: flips of the base variant against fp32 there}
    hashes: dict               # {(variant_id:fixture_id, output_name): sha256} of fp32 and the base variant
    path: Int8Path
    stand_in: int | None = None        # index of the stand-in among the fleet's hosts
    stand_in_label: str | None = None
    flipping: list = field(default_factory=list)

    @property
    def predicted_note(self) -> str:
        return f"predicted from {self.stand_in_label} (same outputs on fp32 and {self.base_name})"

    def row(self) -> dict:
        return {"host": self.label, "stand_in": self.stand_in_label,
                "note": self.predicted_note if self.stand_in_label else "no stand-in: unconfirmed",
                "base_flips": sum(self.base_flips.values()), "flipping_fixtures": self.flipping}


def _by_run(rows: list, fp32_id: str, base_id: str, fixture_ids: list, names: list) -> dict:
    """{(variant_id, fixture_id): {output_name: row}} of the rows, only the search's variants, fixtures and outputs."""
    want = set(fixture_ids)
    out: dict = {}
    for r in rows:
        if r["variant_id"] in (fp32_id, base_id) and r["fixture_id"] in want and r["output_name"] in names:
            out.setdefault((r["variant_id"], r["fixture_id"]), {})[r["output_name"]] = r
    return out


def _missing(label: str, request, base, runs: dict, ids: dict, fixture_ids: list, names: list) -> None:
    """A one-line error when the imported host lacks fp32 or the base variant on some fixture of the search."""
    for what, vid in ids.items():
        lack = [f for f in fixture_ids if set(runs.get((vid, f), {})) != set(names)]
        if lack:
            raise UserError(
                f"host {label}: its results ({', '.join(files_of(request.spec.options))}) lack model {base.model}'s "
                f"{what} on {len(lack)} of {len(fixture_ids)} fixtures of the search; run fp32 and {base.name} on "
                f"that machine over the same fixtures, export the results and name the new file for host {label}")


def read_member(request, base, fp32_id: str, base_id: str, fixtures: list, spec, names: list) -> ImportedMember:
    """The imported host `request` (a HostRequest) read from its file(s): fp32 and `base` on the search's
    `fixtures`, decoded as the hosts it runs are (each with its fixture's geometry: decode_runs)."""
    label = request.label
    fixture_ids = sorted(fx.fixture_id for fx in fixtures)
    rows, hosts = held_results(request.spec.options, [fp32_id, base_id])
    if len({h["fingerprint_id"] for h in hosts}) > 1:
        raise UserError(f"host {label}: its files ({', '.join(files_of(request.spec.options))}) ran on several CPU "
                        "models; a search takes one imported host per CPU model (one file list each)")
    skey = session_key(request.session)
    mine = [r for r in rows if r["session_key"] == skey]
    runs = _by_run(mine or rows, fp32_id, base_id, fixture_ids, names)
    if not mine and rows and len({r["session_key"] for r in rows}) > 1:
        raise UserError(f"host {label}: its results were made under several session options, none of them the "
                        "host's own; name the one it deploys in the hosts file")
    _missing(label, request, base, runs, {"fp32": fp32_id, base.name: base_id}, fixture_ids, names)

    def decoded(vid):   # the rows as a worker run's results (fixture_id, outputs: {name: {array}})
        return decode_runs(spec, [{"fixture_id": f, "outputs": {n: {"array": tensor_from_row(runs[(vid, f)][n])}
                                                                for n in names}} for f in fixture_ids],
                           names, fixtures)

    fp32, base_dec = decoded(fp32_id), decoded(base_id)
    flips = {f: len(compare(spec, fp32[f], base_dec[f]).flips) for f in fixture_ids}
    hashes = {(f"{vid}:{f}", n): runs[(vid, f)][n]["sha256"] for vid in (fp32_id, base_id) for f in fixture_ids
              for n in names}
    h = hosts[0] if hosts else {}
    return ImportedMember(label, base.name, fp32, flips, hashes, int8_path(label, h.get("arch", ""),
                                                                          h.get("isa_flags") or []),
                          flipping=sorted(f for f, n in flips.items() if n))


def run_hashes(runs: list, variant_id: str, names: list) -> dict:
    """{(variant_id:fixture_id, output_name): sha256} of one worker run's results."""
    return {(f"{variant_id}:{r['fixture_id']}", n): r["outputs"][n]["sha256"] for r in runs for n in names}


def assign_stand_ins(members: list, labels: list, hashes: list) -> None:
    """Each member's stand-in: the first host of `labels` (the hosts the search runs, with their fp32 and base
    `hashes`) in the member's equivalence class over fp32 and the base variant."""
    for m in members:
        classes = equivalence_classes({**dict(zip(labels, hashes)), m.label: m.hashes})
        mates = next(c.hosts for c in classes if m.label in c.hosts)
        found = [h for h in mates if h != m.label]
        if found:
            m.stand_in, m.stand_in_label = labels.index(found[0]), found[0]


@dataclass
class Told:
    """What an evaluation says of an imported host: its flips (None: not known) and the mark."""

    host: str
    flips: int | None
    note: str
    predicted_from: str | None = None


def told(members: list, base_id: str, variant_id: str, entries: dict, measured: dict, fixture_ids: list) -> list:
    """[Told] of the members for one candidate: predicted from a stand-in that ran it (`measured`: {host index:
    flips}), or the base variant's flips from the member's own rows; a member without either says nothing (the
    candidate is unconfirmed there)."""
    out = []
    for m in members:
        if m.stand_in is not None and m.stand_in in measured:
            out.append(Told(m.label, measured[m.stand_in], m.predicted_note, m.stand_in_label))
        elif m.stand_in is None and variant_id == base_id and not entries:
            out.append(Told(m.label, sum(m.base_flips[f] for f in fixture_ids),
                            f"{m.label}: from its imported results of {m.base_name}"))
    return out


def unconfirmed_line(members: list, variant: str | None) -> str:
    """The stop line's words for the members no host stands in for ('' when every member has one)."""
    lone = [m for m in members if m.stand_in is None]
    if not lone or variant is None:
        return ""
    names = ", ".join(m.label for m in lone)
    return (f"; but unconfirmed on {names}: imported, and no host of the fleet has its outputs on fp32 and "
            f"{lone[0].base_name}, so no candidate could be evaluated there (to confirm: run {variant} on that "
            "machine, export the results, name the file for the imported host and run equiv on it)")


def recipe_marks(members: list, flips: dict) -> dict:
    """The recipe `search` block's words on the imported hosts of the fleet."""
    out: dict = {}
    predicted = {m.label: m.predicted_note for m in members if m.stand_in is not None and m.label in flips}
    if predicted:
        out["predicted"] = predicted
    lone = [m.label for m in members if m.stand_in is None]
    if lone:
        out["unconfirmed"] = lone
    return out
