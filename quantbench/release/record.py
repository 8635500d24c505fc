"""`quantbench release --tag NAME`: the record attached to a release.

The record holds, per variant, the recipe, the calibration manifest hash, the
builder environment, raw and semantic artifact hashes, and per target host the
fingerprint and the measured behaviour (byte-exact class, flips against fp32),
plus copies of the Parquet rows behind it.

Identity: a *release key* is the SHA-256 of (recipe, builder environment, target)
WITHOUT the artifact hash, because the recipe does not determine the bytes. Keys
are unique across releases: the registry (``results/releases/index.json``) maps
each key to one artifact, and a second, different artifact under an existing key
is refused and reported, never stored. The target is the host fingerprint plus
the session options (both change the numbers; the host's name does not).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from quantbench import SCHEMA_VERSION, __version__
from quantbench.store import partread, partwrite, tableschema
from quantbench.errors import UserError, flag_mark
from quantbench.fsutil import (atomic_write_json, atomic_write_text, canonical_json, check_writable, content_key, kill_point, read_json,
                               sha256_file)
from quantbench.hosts.requirements import host_key, ran_as
from quantbench.store.hostresults import load_hosts, load_outputs
from quantbench.store.resultpaths import check_confined
from quantbench.inputs.modelio import model_hashes, write_self_contained
from quantbench.inputs.sidecarfile import requirements_of, variant_identity
from quantbench.release.commission import release_kits
from quantbench.release.bundledfiles import copy_linked, copy_plugins, copy_report_html, copy_sidecars, markdown_images
from quantbench.textfmt import text_table
from quantbench.inputs.variantdir import check_plain_name, inside, latest_variants, staging_folder

RELEASE_FORMAT = 1
INDEX_FILE = "index.json"
RELEASE_FILE = "release.json"
REPORT_FILE = "report.md"
UNFINISHED = ".unfinished"   # in a release folder until the registry names it (removed then)
TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")

# Recipe fields that are products of the build (or where it was written), not
# inputs: left out of the release key.
ARTIFACT_FIELDS = {"semantic_sha256", "raw_sha256", "variant_id", "artifact_sha256", "ranges_sha256",
                   "ranges_file", "calibrated_tensors", "versions", "path", "folder", "file"}
# Hash-bearing sub-objects whose "path"/"folder" is only where the input lay.
_PATHY = {"path", "folder", "source_model_path"}


def releases_dir(results_dir: str | os.PathLike = "results") -> Path:
    """results/releases, refused when it is a link out of the results folder (resultpaths.check_confined)."""
    return check_confined(Path(results_dir) / "releases")


def key_recipe(recipe: dict) -> dict:
    """The recipe as it enters the release key: inputs only, no artifact hash, no paths."""
    def clean(obj, top):
        if isinstance(obj, dict):
            drop = ARTIFACT_FIELDS if top else _PATHY
            return {k: clean(v, False) for k, v in obj.items() if k not in drop}
        if isinstance(obj, list):
            return [clean(v, False) for v in obj]
        return obj

    out = clean(dict(recipe or {}), True)
    if "source_model" in out:
        # then input_model_sha256 names the pre-processed intermediate, a build product
        out.pop("input_model_sha256", None)
    return out


def environment_of(recipe: dict) -> dict:
    """The builder environment recorded in the recipe (library versions the variant was built with)."""
    env = (recipe or {}).get("versions") or (recipe or {}).get("environment") or {}
    return dict(env) if isinstance(env, dict) else {"text": str(env)}


def release_key(recipe: dict, environment: dict, target: dict) -> str:
    """SHA-256 of (recipe inputs, builder environment, target); the artifact hash is not part of it."""
    body = {"recipe": key_recipe(recipe), "environment": environment, "target": target}
    return content_key(body)


# --- the registry -------------------------------------------------------------

@dataclass
class Collision:
    """A second artifact offered under a key that already names another one."""

    key: str
    variant: str
    host: str
    registered_tag: str
    registered_raw: str
    registered_semantic: str
    new_raw: str
    new_semantic: str

    def line(self) -> str:
        same = ("semantically identical (differs only in non-executing content)"
                if self.registered_semantic == self.new_semantic else "semantically different")
        return (f"release key {self.key[:16]} ({self.variant} on {self.host}) is registered by release "
                f"{self.registered_tag!r} with artifact {self.registered_raw[:16]}; this build is "
                f"{self.new_raw[:16]}, {same}")


@contextlib.contextmanager
def registry_lock(rdir: Path):
    """An exclusive lock on the registry for check-then-write."""
    import fcntl

    target = rdir if rdir.is_dir() else rdir.parent
    if target.is_dir():  # a read-only results folder: one line, nothing written
        check_writable(target, "a release is written into the results folder's releases/")
    rdir.mkdir(parents=True, exist_ok=True)
    with open(rdir / ".index.lock", "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def load_registry(rdir: Path) -> dict:
    path = Path(rdir) / INDEX_FILE
    if not path.exists():
        return {"format": RELEASE_FORMAT, "keys": {}}
    reg = read_json(path, "release registry", "restore it from backup")
    if not isinstance(reg, dict) or not isinstance(reg.get("keys"), dict):
        raise UserError(f"{path}: not a quantbench release registry (no 'keys'); restore it from backup")
    return reg


def check_registry(reg: dict, entries: list[dict], tag: str = "") -> list[Collision]:
    """Entries whose key already names another artifact, in the registry or earlier in this release."""
    out = []
    seen = {k: dict(v, tags=list(v["tags"])) for k, v in reg["keys"].items()}
    for e in entries:
        old = seen.get(e["release_key"])
        if old and old["raw_sha256"] != e["raw_sha256"]:
            out.append(Collision(e["release_key"], e["variant"], e["host"], old["tags"][0], old["raw_sha256"],
                                 old["semantic_sha256"], e["raw_sha256"], e["semantic_sha256"]))
        elif not old:
            seen[e["release_key"]] = {"raw_sha256": e["raw_sha256"], "semantic_sha256": e["semantic_sha256"],
                                      "tags": [f"{tag} (this release)"]}
    return out


def register(reg: dict, entries: list[dict], tag: str) -> dict:
    for e in entries:
        rec = reg["keys"].setdefault(e["release_key"], {
            "raw_sha256": e["raw_sha256"], "semantic_sha256": e["semantic_sha256"], "variant": e["variant"],
            "model": e["model"], "hosts": [], "tags": []})
        if e["host"] not in rec["hosts"]:
            rec["hosts"].append(e["host"])
        if tag not in rec["tags"]:
            rec["tags"].append(tag)
    return reg


# --- behaviour ----------------------------------------------------------------

def _digest(lines) -> str:
    h = hashlib.sha256()
    for line in sorted(lines):
        h.update((" ".join(line) + "\n").encode())
    return h.hexdigest()


def _equiv_behaviour(tables_root: Path, variant_id: str, hosts: set) -> tuple[str | None, dict, dict | None, dict]:
    """From `quantbench equiv`'s tables: (equiv_id, {host: class row}, {host: flip counts} or None
    when that analysis had no fp32 variant, the analysis' settings).

    Of several analyses of this variant, the one covering most release hosts wins
    (ties: the smallest equiv_id, so the choice is deterministic).
    """
    if "classes" not in tableschema.COLUMNS or not partread.parts("classes", tables_root):
        return None, {}, {}, {}
    ct = partread.read("classes", root=tables_root, filter={"variant_id": variant_id}).to_pylist()
    cover = defaultdict(set)
    for r in ct:
        cover[r["equiv_id"]] |= set(r["hosts"] or []) & hosts
    if not cover:
        return None, {}, {}, {}
    eid = sorted(cover, key=lambda e: (-len(cover[e]), e))[0]
    classes = {}
    for r in ct:
        if r["equiv_id"] == eid:
            for h in r["hosts"] or []:
                classes[h] = {"class_label": r["class_label"], "hosts": list(r["hosts"]), "digest": r["digest"],
                              "fixtures": r["fixtures"], "reference": r["reference"]}
    try:
        settings = json.loads(next(r["settings"] for r in ct if r["equiv_id"] == eid) or "{}")
    except (StopIteration, json.JSONDecodeError):
        settings = {}
    if not any(isinstance(v, dict) and v.get("name") == "fp32" for v in settings.get("variants", [])):
        return eid, classes, None, settings  # no fp32 in that analysis: flips against fp32 were not measured
    flips: dict = {}
    if "flips" in tableschema.COLUMNS and partread.parts("flips", tables_root):
        ft = partread.read("flips", root=tables_root, columns=["comparison", "host", "kind", "fixture_id"],
                         filter={"equiv_id": eid, "variant_id": variant_id}).to_pylist()
        for r in ft:
            d = flips.setdefault(r["host"], {}).setdefault(r["comparison"], {"total": 0, "images": set()})
            d["total"] += 1
            d[r["kind"]] = d.get(r["kind"], 0) + 1
            d["images"].add(r["fixture_id"])
        for h in flips:
            for c in flips[h].values():
                c["images"] = len(c["images"])
    return eid, classes, flips, settings


def _scope_to_analysis(targets: list[dict], variant_id: str, settings: dict) -> list[dict]:
    """Only the outputs the equiv analysis compared: its fixtures, and per host its (fingerprint, session).

    Results of earlier runs (other fixtures, another preprocessing, other sessions) stay in
    the results folder but do not enter the release.
    """
    fixtures = set((settings.get("fixtures") or {}).get(variant_id) or [])
    selections = {h: tuple(s) for h, s in (settings.get("selections") or {}).items()}
    out = []
    for t in targets:
        sel = selections.get(t["host"])
        own = host_key(canonical_json(t["session_options"]), t["session_key"])  # the host's own session's key
        if sel is not None and (t["fingerprint_id"], own) != sel:
            continue
        if fixtures and sel is not None:
            t["_lines"] = [x for x in t["_lines"] if x[0] in fixtures]
            t["fixtures"] = len({x[0] for x in t["_lines"]})
            t["outputs"] = len(t["_lines"])
            t["outputs_digest"] = _digest(t["_lines"])
            t["_inherited"] = {f: a for f, a in t.get("_inherited", {}).items() if f in fixtures}
        if t["_lines"]:
            out.append(t)
    return out


# --- building -----------------------------------------------------------------

@dataclass
class ReleaseResult:
    tag: str
    folder: Path
    record: dict = field(default_factory=dict)
    collisions: list[Collision] = field(default_factory=list)
    reused_keys: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    archive: tuple | None = None    # (path, SHA-256) of its archive, when one was written

    @property
    def refused(self) -> bool:
        return bool(self.collisions)


def _filter_of(name: str, sets: dict) -> dict:
    """The tables.read filter of table `name`: the sets of the columns it has."""
    cols = {c for c, _, _ in tableschema.COLUMNS[name]}
    return {col: sorted(values) for col, values in sets.items() if col in cols and values is not None}


def _copy_tables(tables_root: Path, dest: Path, sets: dict) -> dict:
    """Copy the release's rows of every table into dest/tables; {table: {"files": [...], "rows": n}}."""
    out = {}
    for name in tableschema.COLUMNS:
        if not partread.parts(name, tables_root):
            continue
        t = partread.read(name, root=tables_root, filter=_filter_of(name, sets))
        path = partwrite.append(name, t, root=dest / "tables")
        if path is None:
            continue
        out[name] = {"rows": t.num_rows,
                     "files": [{"path": path.relative_to(dest).as_posix(), "sha256": sha256_file(path),
                                "rows": t.num_rows}]}
    return out


def _targets_of(tables_root: Path, variant_id: str, hosts: list[str] | None, required: dict) -> list[dict]:
    """One target per (host, fingerprint, session) with results for the variant, run as it is deployed (under its
    session requirement `required`, hosts/requirements.ran_as; none: under no requirement)."""
    t = load_outputs(variant_id=variant_id, host=hosts, tensors=False, tables_root=tables_root)
    groups: dict = defaultdict(list)
    meta = {}
    cols = ["host", "fingerprint_id", "session_key", "session_options", "fixture_id", "output_name", "sha256",
            "inherited"]
    rows = [r for r in zip(*(t.column(c).to_pylist() for c in cols)) if ran_as(r[3], required)]
    measured = {(h, fp, sk, fx, on) for h, fp, sk, _, fx, on, _, inh in rows if inh is None}
    inherited: dict = defaultdict(dict)   # (host, fp, sk) -> {fixture: the host it was inherited from}
    for h, fp, sk, so, fx, on, sha, inh in rows:
        if inh is not None and (h, fp, sk, fx, on) in measured:
            continue   # measured since (a full run): the measured row stands
        groups[(h, fp, sk)].append((fx, on, sha))
        meta[(h, fp, sk)] = so
        if inh is not None:
            inherited[(h, fp, sk)][fx] = inh
    host_rows = {(r["host"], r["fingerprint_id"]): r for r in load_hosts(tables_root=tables_root).to_pylist()}
    targets = []
    for (h, fp, sk), lines in sorted(groups.items()):
        hr = host_rows.get((h, fp), {})
        try:
            fingerprint = json.loads(hr.get("fingerprint") or "{}")
        except json.JSONDecodeError:
            fingerprint = {"text": hr.get("fingerprint")}
        targets.append({
            "host": h, "kind": hr.get("kind", ""), "fingerprint_id": fp, "session_key": sk,
            "session_options": json.loads(meta[(h, fp, sk)] or "{}"), "arch": hr.get("arch", ""),
            "cpu": hr.get("cpu", ""), "isa_flags": list(hr.get("isa_flags") or []),
            "ort_version": hr.get("ort_version", ""), "fingerprint": fingerprint,
            "fixtures": len({x[0] for x in lines}), "outputs": len(lines), "outputs_digest": _digest(lines),
            "_lines": lines, "_inherited": inherited.get((h, fp, sk), {}),
        })
    return targets


def _byte_classes(targets: list[dict], order: Sequence[str] = ()) -> None:
    """Label targets A, B, ... by identical output hashes over the fixtures all of them ran.

    Letters are given in `order` (the equiv analysis's reference first, then its hosts),
    so a release says A where the analysis's classes table says A.
    """
    if not targets:
        return
    common = set.intersection(*({(fx, on) for fx, on, _ in t["_lines"]} for t in targets))
    rank = {h: i for i, h in enumerate(dict.fromkeys(h for h in order if h))}
    labels: dict = {}
    for t in sorted(targets, key=lambda t: (rank.get(t["host"], len(rank)), t["host"])):
        d = _digest(x for x in t["_lines"] if (x[0], x[1]) in common)
        t["byte_class"] = labels.setdefault(d, chr(ord("A") + len(labels)) if len(labels) < 26 else f"C{len(labels)}")
        t["byte_class_digest"] = d
    for t in targets:
        t["byte_class_hosts"] = sorted(u["host"] for u in targets if u["byte_class"] == t["byte_class"])
        t["byte_class_fixtures"] = len({fx for fx, _ in common})


def flips_text(v: dict, t: dict) -> str:
    """Flips against fp32 on the same host: "-" when no equiv analysis measured them."""
    fl = t.get("flips_vs_fp32")
    if fl is None:
        return "- (no equiv with fp32)"
    if (v.get("recipe") or {}).get("method") == "fp32" or v["name"] == "fp32":
        return "fp32 (reference)"
    own = fl.get("own-fp32") or {"total": 0, "images": 0}
    return f"{own['total']} on {own['images']} images"


def _report(record: dict, analysis_report: str | None) -> str:
    lines = [f"# Release {record['tag']}", "",
             f"quantbench {record['quantbench_version']}, schema version {record['schema_version']}; "
             f"artifacts {'retained in artifacts/' if record['retain'] else 'not retained (deliberately)'}.", "",
             "Release key = SHA-256 of (recipe, builder environment, target) without the artifact hash.", ""]
    rows = []
    for v in record["variants"]:
        for t in v["targets"]:
            rows.append([v["name"], v["raw_sha256"][:12], v["semantic_sha256"][:12], t["host"],
                         t["fingerprint_id"][:12], t["byte_class"] + " (" + ",".join(t["byte_class_hosts"]) + ")",
                         flips_text(v, t), t["release_key"][:12]])
    lines.append("```")
    lines.append(text_table(["variant", "raw", "semantic", "host", "fingerprint", "byte class",
                             "flips vs fp32 (same host)", "release key"], rows, rule=True))
    lines.append("```")
    lines.append("")
    required = [(v["name"], v.get("session_requirements") or {}) for v in record["variants"]]
    if any(r for _, r in required):   # what a host must set to get the recorded results
        lines += ["Deployment requirements:", ""] + [
            f"- {name}: " + (", ".join(f"{k}={x}" for k, x in sorted(r.items())) or "none") for name, r in required]
        lines.append("")
    if analysis_report:
        lines += ["## Analysis report at release time", "", analysis_report.strip(), ""]
    return "\n".join(lines) + "\n"


def _release_path(stage: Path, rel: str) -> Path:
    """stage/rel, refusing any path that would resolve outside the release folder."""
    p = inside(stage, rel)
    if p is None or ".." in Path(rel).parts:
        raise UserError(f"release path {rel!r} leads outside the release folder; refusing to write it")
    return p


def build_release(tag: str, *, results_dir: str | os.PathLike = "results", hosts: list[str] | None = None,
                  retain: bool = True, variants=None) -> ReleaseResult:
    """Write results/releases/<tag>/ and register its keys; refuses (writes nothing) on a key collision."""
    if not TAG_RE.fullmatch(tag or ""):  # fullmatch: "$" alone lets "v1\n" through
        raise UserError(f"{flag_mark('tag')} {tag!r}: use letters, digits, '.', '_', '+' or '-' (not starting with a symbol)")
    created_at = release_time()
    results_dir = Path(results_dir)
    rdir = releases_dir(results_dir)
    dest = rdir / tag
    if release_state(rdir, tag) == "finished":
        raise UserError(f"tag {tag}: {dest} already exists; releases are never overwritten, choose a new tag")
    tables_root = results_dir / "tables"
    variants = list(variants) if variants is not None else latest_variants(results_dir)
    if not variants:
        raise UserError("no variants to release; run `quantbench calibrate`")
    _check_names(variants)
    scope = {k: set() for k in ("variant_id", "host", "fixture_id", "fingerprint_id", "equiv_id", "session_key")}
    vrecords, entries = [], []
    for v in variants:
        vr, es = _variant_record(v, *_measured(v, tables_root, hosts), retain, scope)
        vrecords.append(vr)
        entries += es

    record = {"format": RELEASE_FORMAT, "schema_version": SCHEMA_VERSION, "quantbench_version": __version__,
              "created_at": created_at, "tag": tag,
              "retain": bool(retain), "hosts": sorted(scope["host"]), "equiv_ids": sorted(scope["equiv_id"]),
              "variants": vrecords}
    result = ReleaseResult(tag, dest, record)
    with registry_lock(rdir):
        state = release_state(rdir, tag)
        if state == "finished":
            raise UserError(f"tag {tag}: {dest} was just written by another release command; choose a new tag")
        reg = load_registry(rdir)
        result.collisions = check_registry(reg, entries, tag)
        if result.collisions:
            return result
        result.reused_keys = sorted({e["release_key"] for e in entries if e["release_key"] in reg["keys"]})
        if state == "unfinished":
            _discard(dest)
            result.notes.append(f"release {tag} was interrupted before it was registered; made it again")
        with staging_folder(dest) as stage:
            atomic_write_text(stage / UNFINISHED, "this release is not registered yet\n")
            _stage_release(stage, record, variants, results_dir, scope, result.notes)
            kill_point("release-staged")
            os.replace(stage, dest)
        kill_point("release-published")
        reg = register(reg, entries, tag)
        reg.setdefault("releases", {})[tag] = {"release_json_sha256": sha256_file(dest / RELEASE_FILE)}
        atomic_write_json(rdir / INDEX_FILE, reg)
        kill_point("release-registered")
        (dest / UNFINISHED).unlink()
    return result


def release_state(rdir: Path, tag: str) -> str:
    """"absent", "unfinished" (published by a release that was killed before it registered it: its
    marker file is there and the registry does not name the tag) or "finished"."""
    dest = Path(rdir) / tag
    if not dest.exists() and not dest.is_symlink():
        return "absent"
    if (dest / UNFINISHED).is_file() and tag not in (load_registry(rdir).get("releases") or {}):
        return "unfinished"
    return "finished"


def _discard(dest: Path) -> None:
    """Remove an unfinished release folder (moved into a staging folder first: a kill midway leaves only
    a leftover the next run removes)."""
    with staging_folder(dest) as trash:
        os.replace(dest, trash / "unfinished")


def release_time() -> str:
    """The time a release records (ISO 8601, UTC, seconds): SOURCE_DATE_EPOCH when it is set (the
    reproducible-builds convention: the same results then give the same bytes), else now."""
    from datetime import datetime, timezone

    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    if not epoch:
        return datetime.now(timezone.utc).isoformat(timespec="seconds")
    if not epoch.isascii() or not epoch.isdigit() or int(epoch) > 253402300799:   # (up to the year 9999)
        raise UserError(f"SOURCE_DATE_EPOCH={epoch!r}: not a whole number of seconds since 1970-01-01 UTC "
                        "(the reproducible-builds convention); unset it or fix it")
    return datetime.fromtimestamp(int(epoch), timezone.utc).isoformat(timespec="seconds")


def _check_names(variants) -> None:
    """Every name below becomes a path inside the release folder."""
    for v in variants:
        check_plain_name(v.name, f"{v.path}: variant name")
        calib = (v.recipe or {}).get("calibration_set") or {}
        if calib.get("folder"):
            check_plain_name(calib.get("name"), f"{v.path}: recipe's calibration set name")


def _measured(v, tables_root: Path, hosts) -> tuple:
    """What the results say of variant `v`: (its hashes, its targets with byte classes, equiv id, classes, flips)."""
    hashes = model_hashes(v.path)
    sem = hashes["semantic_sha256"]
    recorded = (v.recipe or {}).get("semantic_sha256")
    if recorded and recorded != sem:
        raise UserError(f"{v.path}: variant {v.name} changed since it was built (semantic hash {sem[:12]}, "
                        f"recipe says {recorded[:12]}); rerun `quantbench calibrate`")
    vid = variant_identity(sem, requirements_of(v))   # its results' key: the model under its requirement
    targets = _targets_of(tables_root, vid, hosts, requirements_of(v))
    if hosts:
        missing = sorted(set(hosts) - {t["host"] for t in targets})
        if missing:
            raise UserError(f"hosts: no results of variant {v.name} on {', '.join(missing)}; run "
                            f"`quantbench run {flag_mark('hosts')} {','.join(missing)}` first")
    if not targets:
        raise UserError(f"variant {v.name} ({v.path}) has no results in {tables_root}; run `quantbench run` first")
    eid, eclasses, eflips, esettings = _equiv_behaviour(tables_root, vid, {t["host"] for t in targets})
    if eid:
        targets = _scope_to_analysis(targets, vid, esettings)
    _byte_classes(targets, [esettings.get("reference"), *esettings.get("hosts", [])] if eid else ())
    return hashes, targets, eid, eclasses, eflips


def _variant_record(v, hashes: dict, targets: list, eid, eclasses: dict, eflips, retain: bool,
                    scope: dict) -> tuple[dict, list]:
    """(the variant's entry in release.json, its registry entries); adds what it touches to `scope`."""
    sem = hashes["semantic_sha256"]
    if eid:
        scope["equiv_id"].add(eid)
    env = environment_of(v.recipe)
    entries = []
    for t in targets:
        lines, inherited = t.pop("_lines"), t.pop("_inherited", {})
        # equiv --confirm: fixtures whose rows the host inherited from a host predicted (and confirmed) to share
        # its class; measured_fixtures never counts them
        t["measured_fixtures"] = len({x[0] for x in lines} - set(inherited))
        t["inherited"] = ({"fixtures": len(inherited), "from": sorted(set(inherited.values()))}
                          if inherited else None)
        scope["fixture_id"] |= {x[0] for x in lines}
        scope["fingerprint_id"].add(t["fingerprint_id"])
        scope["session_key"].add(t["session_key"])
        scope["host"].add(t["host"])
        t["equiv"] = dict(eclasses[t["host"]], equiv_id=eid) if t["host"] in eclasses else None
        t["flips_vs_fp32"] = eflips.get(t["host"], {}) if eid and eflips is not None else None
        t["release_key"] = release_key(v.recipe, env, {"fingerprint_id": t["fingerprint_id"],
                                                       "session_key": t["session_key"]})
        entries.append({"release_key": t["release_key"], "raw_sha256": hashes["raw_sha256"],
                        "semantic_sha256": sem, "variant": v.name, "model": v.model, "host": t["host"]})
    vid = variant_identity(sem, requirements_of(v))
    scope["variant_id"].add(vid)
    calib = (v.recipe or {}).get("calibration_set") or {}
    return {
        "name": v.name, "model": v.model, "variant_id": vid, "raw_sha256": hashes["raw_sha256"],
        "semantic_sha256": sem, "semantic_strip": hashes["semantic_strip"], "bytes": Path(v.path).stat().st_size,
        "session_requirements": requirements_of(v),
        "recipe": v.recipe, "calibration_manifest_sha256": calib.get("manifest_sha256"),
        "calibration_set": calib.get("name"), "environment": env,
        "artifact": {"retained": bool(retain), "file": f"artifacts/{v.name}.onnx" if retain else None,
                     "source_path": str(v.path),
                     "note": "copied into the release" if retain else "deliberately not retained (--no-retain)"},
        "targets": targets,
    }, entries


def _stage_release(stage: Path, record: dict, variants, results_dir: Path, scope: dict, notes: list) -> None:
    """Fill the staging folder: tables, artifacts, calibration manifests, report (and report.html), sidecars,
    plug-in files (quantbench.release.bundledfiles), release.json (last)."""
    record["tables"] = _copy_tables(results_dir / "tables", stage, scope)
    for v, vr in zip(variants, record["variants"]):
        if vr["artifact"]["retained"]:
            (stage / "artifacts").mkdir(exist_ok=True)
            write_self_contained(v.path, _release_path(stage, vr["artifact"]["file"]))  # with its external data
    record["calibration_manifests"] = _copy_manifests(stage, variants)
    record["kits"] = release_kits(stage, record, variants, results_dir / "tables")   # commissioning kits
    analysis = results_dir / "report.md"
    text = analysis.read_text(encoding="utf-8") if analysis.exists() else None
    report = _report(record, text)
    atomic_write_text(stage / REPORT_FILE, report)
    record["report"] = {"file": REPORT_FILE, "sha256": sha256_file(stage / REPORT_FILE),
                        "attachments": copy_linked(markdown_images(report), results_dir, stage, notes),
                        "html": copy_report_html(results_dir, stage, notes)}
    copy_sidecars(stage, variants, record["variants"])
    record["plugins"] = copy_plugins(stage, variants, notes)
    atomic_write_json(stage / RELEASE_FILE, record)


def _copy_manifests(stage: Path, variants) -> list[dict]:
    """Each calibration set's manifest once, as recorded in the recipes (file None when it is gone)."""
    manifests = []
    for v in variants:
        calib = (v.recipe or {}).get("calibration_set") or {}
        src = Path(calib.get("folder", "")) / "manifest.parquet" if calib.get("folder") else None
        if src is not None and calib.get("name") not in {m["name"] for m in manifests}:
            entry = {"name": calib["name"], "recorded_sha256": calib.get("manifest_sha256"), "file": None}
            if src.exists():
                rel = f"calibration/{calib['name']}/manifest.parquet"
                _release_path(stage, rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, _release_path(stage, rel))
                entry.update(file=rel, sha256=sha256_file(stage / rel))
            manifests.append(entry)
    return manifests
