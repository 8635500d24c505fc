"""`quantbench verify results/releases/NAME`: does the release still say what it said?

Checks, each a PASS / FAIL / NOT RETAINED / SKIP row:
- every Parquet file recorded in release.json exists, has its recorded SHA-256,
  reads with the declared schema and row count; no file in the folder that release.json does not name;
- report.md and the calibration manifests have their recorded hashes;
- retained artifacts re-hash to the recorded raw and semantic hashes; an artifact
  released with --no-retain is "not retained" (by decision), never "missing";
- the registry still maps each release key to this artifact and holds
  release.json's hash (so editing the record to match a tampered file shows); a
  missing registry is a FAIL unless --no-registry says the release was copied alone;
- each variant's recorded variant_id is the identity of (its artifact's semantic hash, its recorded session
  requirement), and that requirement its recipe's;
- with --host H: a sample of fixtures re-runs on H (through the hosts runner) from
  the artifact's own bytes, and every output hash equals the recorded one.
Every path the record names must lie inside the release folder.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from quantbench import SCHEMA_VERSION
from quantbench.store import partread, tableschema
from quantbench.errors import GateFailed, ParameterError, UserError, flag_mark
from quantbench.inputs.fixtures import Fixture
from quantbench.fsutil import (MAX_EXPANSION, check_writable, expansion_limit, file_kind, read_json, sha256_file,
                               staging_area)
from quantbench.hosts.keys import session_key
from quantbench.hosts.requirements import entries_text, host_session
from quantbench.runs.runner import run_hosts, variant_info
from quantbench.tensorcode import tensor_from_bytes, tensor_sha256
from quantbench.inputs.modelio import model_facts, model_hashes
from quantbench.release.record import INDEX_FILE, RELEASE_FILE, RELEASE_FORMAT, UNFINISHED, load_registry
from quantbench.inputs.sidecarfile import REQUIREMENTS, variant_identity
from quantbench.inputs.variantdir import Variant, inside, staging_folder

PASS, FAIL, NOT_RETAINED, SKIP = "PASS", "FAIL", "NOT RETAINED", "SKIP"


class RecordDamaged(GateFailed):
    """release.json exists but cannot be read as a record: verification fails (exit 1)."""


@dataclass
class Check:
    check: str
    item: str
    status: str
    detail: str = ""


def load_record(folder: str | os.PathLike) -> dict:
    folder = Path(folder)
    if not folder.is_dir():
        if folder.exists():   # a FIFO, a device, a file that is no archive: say what it is (stat only, no open)
            raise UserError(f"{folder}: is {file_kind(folder.stat().st_mode)}, expected a release folder or archive "
                            "(.tar.gz)")
        raise UserError(f"{folder}: no such release folder; releases are under results/releases/<tag>/")
    path = folder / RELEASE_FILE
    if not path.exists():
        raise UserError(f"{path}: missing; {folder} is not a quantbench release folder")
    rec = read_json(path, "release record", "the release record is damaged", error=RecordDamaged)
    if not isinstance(rec, dict) or rec.get("format") != RELEASE_FORMAT or not isinstance(rec.get("variants"), list):
        raise RecordDamaged(f"{path}: not a quantbench release record of format {RELEASE_FORMAT}")
    for v in rec["variants"]:
        ok = (isinstance(v, dict) and {"name", "variant_id", "raw_sha256", "semantic_sha256", "artifact", "targets"} <= set(v)
              and isinstance(v["artifact"], dict) and isinstance(v["targets"], list)
              and all(isinstance(t, dict) and {"host", "release_key", "fingerprint_id", "session_key"} <= set(t)
                      for t in v["targets"]))
        if not ok:
            raise RecordDamaged(f"{path}: variant record {v.get('name', '?') if isinstance(v, dict) else v!r} is "
                            "malformed (missing fields); the release record is damaged")
    tbl = rec.get("tables", {})
    if not isinstance(tbl, dict) or not all(
            isinstance(i, dict) and isinstance(i.get("files"), list)
            and all(isinstance(f, dict) and {"path", "sha256", "rows"} <= set(f) for f in i["files"])
            for i in tbl.values()):
        raise RecordDamaged(f"{path}: 'tables' is malformed; the release record is damaged")
    return rec


def _inside(folder: Path, rel) -> Path | None:
    p = inside(folder, rel)
    return None if p is None or ".." in Path(rel).parts else p


def _check_file(folder: Path, rel: str, want: str | None, what: str) -> Check:
    p = _inside(folder, rel)
    if p is None:
        return Check(what, str(rel), FAIL, "path leads outside the release folder (record tampered)")
    if not p.exists():
        return Check(what, rel, FAIL, "missing")
    got = sha256_file(p)
    if want and got != want:
        return Check(what, rel, FAIL, f"SHA-256 {got[:16]} != recorded {want[:16]} (modified)")
    return Check(what, rel, PASS, f"SHA-256 {got[:16]}")


def _read_table(path: Path):
    """A release's table, decoded no further than fsutil.expansion_limit of its size (partread.DecodedTooLarge):
    its recorded hash and row count vouch for nothing when release.json was forged with it."""
    with open(path, "rb") as fh:
        return partread.read_bounded(fh, expansion_limit(os.fstat(fh.fileno()).st_size))


def check_tables(folder: Path, rec: dict) -> list[Check]:
    out = []
    for name, info in sorted(rec.get("tables", {}).items()):
        for f in info["files"]:
            c = _check_file(folder, f["path"], f["sha256"], "table")
            if c.status == PASS:
                try:
                    t = _read_table(_inside(folder, f["path"]))
                except partread.DecodedTooLarge:
                    size = _inside(folder, f["path"]).stat().st_size
                    c = Check("table", f["path"], FAIL, f"decodes to more than {MAX_EXPANSION} times its {size} "
                                                        "bytes (and 1 MiB): forged or damaged")
                except Exception as exc:
                    c = Check("table", f["path"], FAIL, f"not readable Parquet ({type(exc).__name__})")
                else:
                    want = [col for col, _, _ in tableschema.COLUMNS.get(name, [])]
                    if rec.get("schema_version") != SCHEMA_VERSION:
                        c.detail += (f", {t.num_rows} rows; schema version {rec.get('schema_version')} "
                                     f"(this quantbench reads {SCHEMA_VERSION}): columns not compared")
                        if t.num_rows != f["rows"]:
                            c = Check("table", f["path"], FAIL, f"{t.num_rows} rows, recorded {f['rows']}")
                    elif t.column_names != want:
                        c = Check("table", f["path"], FAIL, f"columns differ from the {name} schema")
                    elif t.num_rows != f["rows"]:
                        c = Check("table", f["path"], FAIL, f"{t.num_rows} rows, recorded {f['rows']}")
                    else:
                        c.detail += f", {t.num_rows} rows, schema {name} ok"
            out.append(c)
    return out


def named_files(rec) -> set[str] | None:
    """Every file a release record names (paths inside its folder), release.json itself included; None when
    `rec` is no record."""
    if not isinstance(rec, dict):
        return None
    out = {RELEASE_FILE}

    def add(entry, key="file"):
        if isinstance(entry, dict) and isinstance(entry.get(key), str):
            out.add(entry[key])

    for info in (rec.get("tables") or {}).values() if isinstance(rec.get("tables"), dict) else ():
        for f in info.get("files") or [] if isinstance(info, dict) else ():
            add(f, "path")
    rep = rec.get("report") if isinstance(rec.get("report"), dict) else {}
    for r in (rep, rep.get("html") if isinstance(rep.get("html"), dict) else {}):
        add(r)
        for att in r.get("attachments") or [] if isinstance(r.get("attachments"), list) else ():
            add(att)
    for v in rec.get("variants") or [] if isinstance(rec.get("variants"), list) else ():
        if isinstance(v, dict):
            add(v.get("sidecar"))
            add(v.get("artifact") if isinstance(v.get("artifact"), dict) and v["artifact"].get("retained") else None)
    for key in ("plugins", "calibration_manifests"):
        for entry in rec.get(key) or [] if isinstance(rec.get(key), list) else ():
            add(entry)
    for kit in rec.get("kits") or [] if isinstance(rec.get("kits"), list) else ():
        for entry in kit.get("files") or [] if isinstance(kit, dict) and isinstance(kit.get("files"), list) else ():
            add(entry)
    return out


MAX_UNNAMED_SHOWN = 5


def check_unnamed(folder: Path, rec: dict) -> list[Check]:
    """A FAIL per file (or link, or special file) in the release folder that release.json does not name, and per
    folder holding no file it names (an empty folder added after release included)."""
    named = named_files(rec) | {UNFINISHED}
    holding = {p.as_posix() for rel in named for p in Path(rel).parents}   # folders a named file lies in
    extra = []
    for root, dirs, files in os.walk(folder):
        here = Path(root)
        for name in files + dirs:
            rel = (here / name).relative_to(folder).as_posix()
            if name in files or (here / name).is_symlink():
                if rel not in named:
                    extra.append(rel)
            elif rel not in holding:   # a folder no named file lies in (an empty one too): added after release
                extra.append(rel + "/")
    out = [Check("unnamed file", rel, FAIL, "not named by release.json (added after release)")
           for rel in sorted(extra)[:MAX_UNNAMED_SHOWN]]
    if len(extra) > MAX_UNNAMED_SHOWN:
        out.append(Check("unnamed file", f"{len(extra) - MAX_UNNAMED_SHOWN} more", FAIL,
                         "not named by release.json (added after release)"))
    return out


def check_carried(folder: Path, rec: dict) -> list[Check]:
    """report.md, report.html and their images, the sidecars and the plug-in files against their hashes."""
    out, seen = [], set()
    rep = rec.get("report") or {}
    for r in (rep, rep.get("html") or {}):
        if r.get("file"):
            out.append(_check_file(folder, r["file"], r.get("sha256"), "report"))
        for att in r.get("attachments", []):
            if att["file"] not in seen:  # an image both reports show: checked once
                seen.add(att["file"])
                out.append(_check_file(folder, att["file"], att["sha256"], "report image"))
    for v in rec["variants"]:
        sc = v.get("sidecar")
        if isinstance(sc, dict):
            out.append(_check_file(folder, sc.get("file"), sc.get("sha256"), "sidecar"))
    for p in rec.get("plugins") or []:
        if isinstance(p, dict) and p.get("file"):
            out.append(_check_file(folder, p["file"], p.get("sha256"), "plug-in"))
        elif isinstance(p, dict):
            out.append(Check("plug-in", str(p.get("ref")), SKIP, str(p.get("note") or "not carried")))
    return out


def check_artifacts(folder: Path, rec: dict) -> list[Check]:
    out = []
    for v in rec["variants"]:
        a = v["artifact"]
        if not a.get("retained"):
            src = Path(a.get("source_path") or "")
            if a.get("source_path") and src.exists():
                same = sha256_file(src) == v["raw_sha256"]
                note = f"source {src} {'still matches' if same else 'has CHANGED since the release'}"
            else:
                note = "source no longer present"
            out.append(Check("artifact", v["name"], NOT_RETAINED, f"{a.get('note', 'deliberately not retained')}; {note}"))
            continue
        p = _inside(folder, a.get("file"))
        if p is None:
            out.append(Check("artifact", v["name"], FAIL, f"{a.get('file')!r} leads outside the release folder"))
            continue
        if not p.exists():
            out.append(Check("artifact", v["name"], FAIL, f"{a['file']} missing (recorded as retained)"))
            continue
        try:
            h = model_hashes(p, tuple(v.get("semantic_strip") or ("doc_string",)))
        except UserError as exc:
            out.append(Check("artifact", v["name"], FAIL, str(exc)))
            continue
        if h["raw_sha256"] != v["raw_sha256"]:
            sem = "semantic hash still matches" if h["semantic_sha256"] == v["semantic_sha256"] else "semantic hash differs too"
            out.append(Check("artifact", v["name"], FAIL, f"raw SHA-256 {h['raw_sha256'][:16]} != recorded "
                                                          f"{v['raw_sha256'][:16]} ({sem})"))
        elif h["semantic_sha256"] != v["semantic_sha256"]:
            out.append(Check("artifact", v["name"], FAIL, "semantic hash differs from the record"))
        elif (why := _identity_mismatch(v, h["semantic_sha256"])) is not None:
            out.append(Check("artifact", v["name"], FAIL, why))
        else:
            out.append(Check("artifact", v["name"], PASS, f"raw {v['raw_sha256'][:16]}, semantic {v['semantic_sha256'][:16]}"))
    return out


def check_kits(folder: Path, rec: dict) -> list[Check]:
    """Each commissioning kit (kits/NAME/): every file re-hashed against the record, one check per kit."""
    out = []
    for kit in rec.get("kits") or [] if isinstance(rec.get("kits"), list) else ():
        files = kit.get("files") if isinstance(kit, dict) and isinstance(kit.get("files"), list) else None
        if not files:
            out.append(Check("kit", str(kit.get("folder") if isinstance(kit, dict) else kit), FAIL, "lists no files"))
            continue
        bad = [c for c in (_check_file(folder, f.get("file"), f.get("sha256") or "(none)", "kit") for f in files) if c.status != PASS]
        out.append(Check("kit", kit.get("folder", ""), FAIL, f"{bad[0].item}: {bad[0].detail}") if bad else
                   Check("kit", kit.get("folder", ""), PASS, f"{len(files)} files as recorded (check.py, expected.json, "
                                                            "fixtures)"))
    return out


def _identity_mismatch(v: dict, semantic: str) -> str | None:
    """Why a variant's record does not hold together (None: it does): its variant_id must be the identity of (its
    artifact's semantic hash, its recorded session requirement), and that requirement the one its recipe records
    (the one a re-run applies)."""
    recorded = v.get("session_requirements", {})
    of_recipe = (v.get("recipe") or {}).get(REQUIREMENTS) or {}
    if not isinstance(recorded, dict) or recorded != of_recipe:
        text = (entries_text(recorded) or "none") if isinstance(recorded, dict) else repr(recorded)
        return f"recorded session requirement {text} is not its recipe's ({entries_text(of_recipe) or 'none'})"
    want = variant_identity(semantic, recorded)
    if v["variant_id"] != want:
        need = f" under its requirement {entries_text(recorded)}" if recorded else ""
        return (f"recorded variant_id {str(v['variant_id'])[:16]} is not the identity {want[:16]} of the artifact's "
                f"semantic hash {semantic[:16]}{need} (the recorded results belong to another model or deployment)")
    return None


def check_registry(folder: Path, rec: dict, required: bool = True) -> list[Check]:
    rdir = folder.resolve().parent   # a release reached through a link: its registry is beside the folder itself
    idx = rdir / INDEX_FILE
    if (folder / UNFINISHED).is_file() and required and not _registered(rdir, rec.get("tag")):
        return [Check("registry", str(idx), FAIL, f"release {rec.get('tag')!r} is unfinished: its release command "
                                                  "was interrupted before it registered the release; run the same "
                                                  "`quantbench release` again to finish it")]
    if not required:
        return [Check("registry", str(idx), SKIP, f"not checked ({flag_mark('no_registry')}): release.json vouches only for itself")]
    if not idx.exists():
        return [Check("registry", str(idx), FAIL, "missing: nothing vouches for release.json (for a release copied "
                                                  f"without its registry, pass {flag_mark('no_registry')})")]
    try:
        reg = load_registry(rdir)
    except UserError as exc:
        return [Check("registry", str(idx), FAIL, str(exc))]
    out = []
    want = (reg.get("releases") or {}).get(rec.get("tag"), {}).get("release_json_sha256")
    got = sha256_file(folder / "release.json")
    if want is None:
        out.append(Check("registry", "release.json", FAIL, f"release {rec.get('tag')!r} is not in {INDEX_FILE}"))
    elif want != got:
        out.append(Check("registry", "release.json", FAIL, f"SHA-256 {got[:16]} != registered {want[:16]} (record edited)"))
    else:
        out.append(Check("registry", "release.json", PASS, f"SHA-256 {got[:16]} as registered"))
    bad, n = [], 0
    for v in rec["variants"]:
        for t in v["targets"]:
            n += 1
            e = reg["keys"].get(t["release_key"])
            if e is None or e["raw_sha256"] != v["raw_sha256"]:
                bad.append(f"{v['name']}@{t['host']}: " + ("not registered" if e is None else
                                                          f"registered to artifact {e['raw_sha256'][:12]}"))
    if bad:
        return out + [Check("registry", INDEX_FILE, FAIL, "; ".join(bad))]
    return out + [Check("registry", INDEX_FILE, PASS, f"{n} release key(s) map to the recorded artifacts")]


def _registered(rdir: Path, tag) -> bool:
    try:
        return tag in (load_registry(rdir).get("releases") or {})
    except UserError:
        return False


def _fixtures(folder: Path, rec: dict, ids: list[str]) -> list:
    t = partread.read("fixtures", root=folder / "tables", filter={"fixture_id": ids}).to_pylist()
    out, bad = [], []
    for r in t:
        arr = tensor_from_bytes(r["tensor"], r["dtype"], r["shape"])
        if tensor_sha256(arr) != r["fixture_id"]:
            bad.append(r["fixture_id"])
            continue
        out.append(Fixture(r["fixture_id"], r["input_name"], arr, r["source"], r["image_sha256"],
                           json.loads(r["labels"] or "[]"), r["stratum"], r["split"],
                           geometry=json.loads(r["geometry"]) if r.get("geometry") else None))
    bad += sorted(set(ids) - {r["fixture_id"] for r in t})
    return out, bad


def rerun(folder: Path, rec: dict, host: str, sample: int, hosts_file=None, scratch: Path | None = None) -> list[Check]:
    """Re-run `sample` fixtures per variant on `host` and compare output hashes with the record.

    One runner call per recorded session (all variants together), so the host's
    worker starts once per session rather than once per variant. The new outputs
    are matched to a variant by the identity of the artifact file that ran (its
    semantic hash computed here from its bytes, under its recipe's session requirement,
    which the run applies), never by the record's variant_id: two records
    that claim one id cannot lend each other their outputs.
    """
    if not any(t["host"] == host for v in rec["variants"] for t in v["targets"]):
        known = sorted({t["host"] for v in rec["variants"] for t in v["targets"]})
        raise ParameterError("host", f"the release has no results for it; recorded hosts: {', '.join(known)}", host)
    out, jobs = _rerun_jobs(folder, rec, host, sample)
    for i, job in enumerate(jobs.values()):
        out += _rerun_job(folder, rec, host, job, hosts_file, Path(scratch or folder.parent) / f"rerun-{i}")
    return out


def _rerun_jobs(folder: Path, rec: dict, host: str, sample: int) -> tuple[list[Check], dict]:
    """-> (checks of the variants that cannot re-run, the re-runs to do: session_key -> {"session": ..., "items":
    [(variant record, target, VariantInfo, wanted hashes {(fixture_id, output): sha256})]})."""
    out: list[Check] = []
    jobs: dict = {}
    for v in rec["variants"]:
        item = f"{v['name']} on {host}"
        targets = [t for t in v["targets"] if t["host"] == host]
        if not targets:
            out.append(Check("re-run", item, SKIP, "no record of this variant on this host"))
            continue
        a = v["artifact"]
        path = _inside(folder, a.get("file")) if a.get("retained") else Path(a.get("source_path") or "")
        if path is None or not path.is_file() or sha256_file(path) != v["raw_sha256"]:
            why = "artifact missing or modified" if a.get("retained") else "not retained and the source is gone or changed"
            out.append(Check("re-run", item, FAIL if a.get("retained") else SKIP, f"cannot re-run: {why}"))
            continue
        try:
            vi = variant_info(Variant(v["name"], path, v["model"], v["recipe"]), model_facts(path, fresh=True))  # from the bytes
        except UserError as exc:
            out.append(Check("re-run", item, FAIL, f"cannot re-run: {exc}"))
            continue
        for t in targets:
            rows = partread.read("outputs", root=folder / "tables",
                                 columns=["fixture_id", "output_name", "sha256", "inherited"],
                               filter={"variant_id": v["variant_id"], "host": host,
                                       "fingerprint_id": t["fingerprint_id"], "session_key": t["session_key"]}
                               ).to_pylist()
            if not rows:
                out.append(Check("re-run", item, FAIL, f"the release's outputs table holds no results of variant_id "
                                                       f"{str(v['variant_id'])[:16]} on {host} to compare with"))
                continue
            # a row the host inherited (equiv's confirm) was never measured on it: those fixtures re-run first,
            # and a fixture measured since counts as measured
            measured = {r["fixture_id"] for r in rows if r["inherited"] is None}
            rows = [r for r in rows if r["inherited"] is None or r["fixture_id"] not in measured]
            ids = sorted({r["fixture_id"] for r in rows}, key=lambda f: (f in measured, f))[:sample]
            want = {(r["fixture_id"], r["output_name"]): r["sha256"] for r in rows if r["fixture_id"] in ids}
            t["_rerun_inherited"] = sum(f not in measured for f in ids)
            # the host's own session: the runner adds the variant's session requirement (its recipe's) again
            own = host_session(t["session_options"] or {})
            job = jobs.setdefault(session_key(own), {"session": own, "items": []})
            job["items"].append((v, t, vi, want))
    return out, jobs


def _rerun_job(folder: Path, rec: dict, host: str, job: dict, hosts_file, td: Path) -> list[Check]:
    """One recorded session's re-run on `host` (all its variants in one runner call, its tables in the new
    folder `td`), compared with the record."""
    ids = sorted({fx for _, _, _, want in job["items"] for fx, _ in want})
    fixtures, bad = _fixtures(folder, rec, ids)
    if bad:
        return [Check("re-run", f"{v['name']} on {host}", FAIL,
                      f"fixture {bad[0][:12]} is missing from the fixtures table or its tensor does not "
                      f"hash to its id ({len(bad)} such)") for v, _, _, _ in job["items"]]
    td.mkdir()
    summary = run_hosts([host], [vi for _, _, vi, _ in job["items"]],  # identities computed once (above)
                        fixtures, session=job["session"], hosts_file=hosts_file, progress=False,
                        tables_root=td, raise_on_error=False)
    new = partread.read("outputs", root=td,
                      columns=["variant_id", "fixture_id", "output_name", "sha256", "fingerprint_id"]).to_pylist()
    return [_compare(v, t, vi, want, new, summary, host) for v, t, vi, want in job["items"]]


def _compare(v: dict, t: dict, vi, want: dict, new: list[dict], summary, host: str) -> Check:
    """One variant's re-run outputs (from its artifact's bytes) against the recorded hashes."""
    item = f"{v['name']} on {host}"
    refused = [h.cannot_run[vi.variant_id] for h in summary.hosts if vi.variant_id in h.cannot_run]
    if refused:   # e.g. its session requirement: the host cannot apply it, so nothing it gives is this release's
        return Check("re-run", item, FAIL, f"{host} cannot run it: {refused[0]}")
    got = {(r["fixture_id"], r["output_name"]): r["sha256"] for r in new if r["variant_id"] == vi.variant_id}
    fp_now = {r["fingerprint_id"] for r in new}
    notes = []
    if fp_now - {t["fingerprint_id"]}:
        notes.append(f"host fingerprint now {','.join(sorted(x[:12] for x in fp_now))}, recorded {t['fingerprint_id'][:12]}")
    if vi.variant_id != v["variant_id"]:
        notes.append(f"the artifact's identity {vi.variant_id[:12]} (its semantic hash under its recipe's session "
                     f"requirement) is not the recorded variant_id {str(v['variant_id'])[:12]}")
    note = "".join(f"; {n}" for n in notes)
    differ = sorted(k for k in want if k in got and got[k] != want[k])
    missing = sorted(k for k in want if k not in got)
    if differ:
        k = differ[0]
        return Check("re-run", item, FAIL, f"{len(differ)} of {len(want)} output hashes differ from the record "
                                           f"(first: fixture {k[0][:12]} output {k[1]}: re-run {got[k][:12]}, "
                                           f"recorded {want[k][:12]}){note}")
    if missing:
        fx = missing[0][0]
        want_names = sorted(o for f, o in want if f == fx)
        got_names = sorted(o for f, o in got if f == fx)
        if got_names:
            what = (f"fixture {fx[:12]}: the re-run produced outputs {', '.join(got_names)}, the record has "
                    f"{', '.join(want_names)}")
        elif summary.errors:
            what = f"fixture {fx[:12]} produced no outputs: {summary.errors[0]}"
        else:
            what = f"fixture {fx[:12]} produced no outputs on {host}"
        return Check("re-run", item, FAIL, f"{len(missing)} of {len(want)} recorded outputs not reproduced ({what}){note}")
    n = len({fx for fx, _ in want})
    extra = sorted({o for (f, o) in got if f in {fx for fx, _ in want}} - {o for _, o in want})
    if extra:
        return Check("re-run", item, FAIL, f"the re-run produced outputs the record lacks ({', '.join(extra)}){note}")
    inherited = t.get("_rerun_inherited") or 0
    what = f" ({inherited} of them inherited in the record, measured on {host} now)" if inherited else ""
    return Check("re-run", item, PASS, f"{n} fixtures{what}, {len(want)} output hashes identical{note}")


def verify(folder: str | os.PathLike, host: str | None = None, sample: int = 4, hosts_file=None,
           registry: bool = True, results_dir: str | os.PathLike = "results") -> list[Check]:
    """The checks of a release folder; with `host`, its re-run writes only in `results_dir`'s staging area."""
    folder = Path(folder)
    rec = load_record(folder)
    if sample < 1:
        raise ParameterError("sample", "must be at least 1", sample)
    checks = check_tables(folder, rec)
    checks += check_carried(folder, rec)
    for m in rec.get("calibration_manifests", []):
        if m.get("file"):
            c = _check_file(folder, m["file"], m.get("sha256"), "calibration manifest")
            if c.status == PASS and m.get("recorded_sha256") and m["sha256"] != m["recorded_sha256"]:
                c = Check("calibration manifest", m["file"], FAIL, "differs from the hash in the variants' recipes")
            checks.append(c)
        else:
            checks.append(Check("calibration manifest", m["name"], SKIP, "manifest was not found at release time"))
    checks += check_artifacts(folder, rec)
    checks += check_kits(folder, rec)
    checks += check_registry(folder, rec, required=registry)
    checks += check_unnamed(folder, rec)
    if host:
        with scratch_folder(results_dir, "verify") as td:
            checks += rerun(folder, rec, host, sample, hosts_file, td)
    return checks


@contextlib.contextmanager
def scratch_folder(results_dir: str | os.PathLike, name: str):
    """A private folder in `results_dir`'s staging area for this run (removed after, or by the next run
    once this one was killed); one UserError when the results folder takes no files."""
    results_dir = Path(results_dir)
    if not results_dir.exists() and results_dir.parent.is_dir():
        with contextlib.suppress(OSError):  # (check_writable words the failure)
            results_dir.mkdir()
    check_writable(results_dir, "verify keeps its temporary files in the results folder's staging area")
    with staging_folder(staging_area(results_dir) / name) as td:
        yield td
