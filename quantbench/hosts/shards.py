"""Sharded runs: `--shard K/N` splits a run's fixtures so N machines each run one part, and their N export
files merge into the tables one machine would write.

The split is deterministic and balanced: fixtures are grouped by what decides which variant they fit (input
name, dtype, shape); within a group, by stratum (strata by name), each stratum's fixtures sorted by content id
(the input tensor's SHA-256), and dealt round-robin to the N shards, the deal running on from one stratum to the
next. The same fixtures in any order give the same shards, every shard holds its share of every stratum, and
within a group shard sizes differ by at most one.

An export of a sharded run carries its shard in the manifest: K, N, the fixture set (SHA-256 of every fixture
id of the whole run, sorted) and the shard's own fixture ids. An imported host takes several files
(`file = ["a.qbr", "b.qbr"]`); check_files refuses files of different fixture sets, a shard given twice and a
shard missing, in one line naming them, before anything is merged. Files of whole runs (no shard) may be given
together too (the same run repeated); imported.split_by_fingerprint makes files that ran on different CPU models
separate hosts first.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from quantbench.errors import ParameterError, UserError, flag_mark


@dataclass(frozen=True)
class Shard:
    k: int  # 1-based
    n: int

    def __str__(self) -> str:
        return f"{self.k}/{self.n}"


def parse_shard(text) -> Shard | None:
    """'K/N' (1 <= K <= N) -> Shard; None or '' -> None (the whole run)."""
    if text is None or text == "":
        return None
    if isinstance(text, Shard):
        return text
    k, sep, n = str(text).partition("/")
    if not sep or not k.strip().isdigit() or not n.strip().isdigit() or not 1 <= int(k) <= int(n):
        raise ParameterError("shard", "must be K/N with 1 <= K <= N (e.g. 2/3)", text)
    return Shard(int(k), int(n))


def fixture_set_id(fixture_ids) -> str:
    """SHA-256 of the sorted, distinct fixture ids: the identity of a run's whole fixture set."""
    return hashlib.sha256("\n".join(sorted(set(fixture_ids))).encode()).hexdigest()


def _inputs(fx) -> tuple:
    """What decides which variants a fixture fits: input name, dtype, shape."""
    return (str(fx.input_name), str(fx.array.dtype), tuple(int(d) for d in fx.array.shape))


def _groups(fixtures: list) -> dict:
    """{inputs: {stratum: [fixtures]}} of distinct fixtures."""
    groups: dict = {}
    for fx in fixtures:
        groups.setdefault(_inputs(fx), {}).setdefault(str(getattr(fx, "stratum", "") or ""), []).append(fx)
    return groups


def deal(fixtures: list, n: int) -> list[list]:
    """The fixtures (each id once) dealt to n shards (see the module docstring); each shard in the input order."""
    uniq = list({fx.fixture_id: fx for fx in fixtures}.values())
    shard_of = {}
    for _, strata in sorted(_groups(uniq).items()):
        i = 0
        for _, fxs in sorted(strata.items()):
            for fx in sorted(fxs, key=lambda f: f.fixture_id):
                shard_of[fx.fixture_id] = i % n
                i += 1
    return [[fx for fx in uniq if shard_of[fx.fixture_id] == s] for s in range(n)]


def select(fixtures: list, shard: Shard | None) -> tuple[list, dict | None]:
    """(the fixtures of `shard`, the shard record an export carries); (fixtures, None) without a shard.
    A shard left empty (fewer fixtures than shards) is an error."""
    if shard is None:
        return fixtures, None
    uniq = list({fx.fixture_id: fx for fx in fixtures}.values())
    for (name, dtype, shape), strata in sorted(_groups(uniq).items()):
        count = sum(len(f) for f in strata.values())
        if count < shard.n:
            raise ParameterError("shard", f"input {name} {dtype}{list(shape)} has {count} fixture(s) for {shard.n} "
                                          "shards, so a shard would hold none; use fewer shards", str(shard))
    part = deal(uniq, shard.n)[shard.k - 1]
    record = {"k": shard.k, "n": shard.n, "fixture_set": fixture_set_id(fx.fixture_id for fx in fixtures),
              "fixture_ids": sorted({fx.fixture_id for fx in part})}
    return part, record


def files_of(options: dict) -> list[str]:
    """An imported host's results files: `file` is one path or a list of them."""
    f = options.get("file")
    return [str(x) for x in f] if isinstance(f, (list, tuple)) else [str(f)]


def _record(path, manifest: dict, outputs_fixtures: set) -> dict | None:
    """The shard record of one checked export, itself checked: its fixtures hold every fixture its outputs name."""
    rec = manifest.get("shard")
    if rec is None:
        return None
    try:
        k, n, fset, ids = int(rec["k"]), int(rec["n"]), str(rec["fixture_set"]), [str(i) for i in rec["fixture_ids"]]
        ok = 1 <= k <= n and len(fset) == 64
    except (TypeError, ValueError, KeyError):
        ok = False
    if not ok:
        raise UserError(f"{path}: its shard record is not K/N with a fixture set; the file was altered or damaged, "
                        "nothing was imported")
    if not outputs_fixtures <= set(ids):
        raise UserError(f"{path}: shard {k}/{n}: holds results for fixtures outside its shard; the file was altered "
                        "or damaged, nothing was imported")
    return {"k": k, "n": n, "fixture_set": fset, "fixture_ids": ids}


def check_files(files: list, read) -> None:
    """The files of one imported host are whole runs, or the shards of one run: the same fixture set and N, each
    K once, none missing, their fixtures together the whole set. `read(path) -> (manifest, tables)` is the checked
    reader (imported.read_export). A one-line UserError otherwise."""
    recs, whole = [], []
    for f in files:
        manifest, parts = read(f)
        rec = _record(f, manifest, set(parts["outputs"].column("fixture_id").to_pylist()))
        (whole.append(f) if rec is None else recs.append((f, rec)))
    if recs and whole:
        raise UserError(f"{whole[0]}: not a shard (exported without {flag_mark('shard')} K/N), so it cannot be merged "
                        f"with {', '.join(Path(f).name for f, _ in recs)}; give it its own imported host")
    if recs:
        _check_set(recs)


def _check_set(recs: list) -> None:
    """[(file, shard record)] are the N shards of one fixture set, each once (check_files)."""
    first, rec0 = recs[0]
    for f, rec in recs:
        if (rec["fixture_set"], rec["n"]) != (rec0["fixture_set"], rec0["n"]):
            raise UserError(f"{f}: shard {rec['k']}/{rec['n']} of fixture set {rec['fixture_set'][:12]}, but {first} "
                            f"is shard {rec0['k']}/{rec0['n']} of fixture set {rec0['fixture_set'][:12]}: not shards "
                            "of one run; export every shard with the same variants and fixtures")
    by_k: dict = {}
    for f, rec in recs:
        by_k.setdefault(rec["k"], []).append(f)
    n = rec0["n"]
    twice = {k: fs for k, fs in sorted(by_k.items()) if len(fs) > 1}
    if twice:
        k, fs = next(iter(twice.items()))
        raise UserError(f"shard {k}/{n} given twice ({', '.join(str(x) for x in fs)}): overlapping shards; "
                        "give each shard once")
    missing = [k for k in range(1, n + 1) if k not in by_k]
    if missing:
        held = ", ".join(f"{k}/{n}" for k in sorted(by_k))
        raise UserError(f"shard(s) {', '.join(f'{k}/{n}' for k in missing)} missing: the imported files "
                        f"({', '.join(str(f) for f, _ in recs)}) hold shards {held}")
    ids = [i for _, rec in recs for i in rec["fixture_ids"]]
    if len(ids) != len(set(ids)) or fixture_set_id(ids) != rec0["fixture_set"]:
        raise UserError(f"{', '.join(str(f) for f, _ in recs)}: the shards' fixtures do not make up their fixture set "
                        f"{rec0['fixture_set'][:12]}; the files were altered or damaged, nothing was imported")


def check_fixture_set(files: list, read, fixture_ids) -> None:
    """Shard files merged into a run over other fixtures (e.g. without the shard jobs' --limit) would leave the
    host short of results: a one-line UserError naming both fixture sets."""
    mine = fixture_set_id(fixture_ids)
    for f in files:
        rec = read(f)[0].get("shard")
        if isinstance(rec, dict) and rec.get("fixture_set") != mine:
            n = sum(len(read(x)[0].get("shard", {}).get("fixture_ids", [])) for x in files)
            raise UserError(f"{f}: a shard of fixture set {str(rec.get('fixture_set'))[:12]} ({n} fixtures in these "
                            f"files), and this run's {len(set(fixture_ids))} fixtures are set {mine[:12]}; select the "
                            f"fixtures the shard jobs ran ({flag_mark('fixtures')}, {flag_mark('split')}, {flag_mark('limit')})")
