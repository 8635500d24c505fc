"""`quantbench commission --variant V --out DIR`: a commissioning kit, so a device in the field can check itself.

After an `equiv` that ran V, the kit holds what a device needs with nothing but Python 3.8+, numpy and
onnxruntime: the variant's model (inside a release: a reference to its artifact by SHA-256), N fixtures as input
tensors (those that separated the classes and those nearest the decision threshold, alternately), expected.json
(per measured class: its hosts with their fingerprints and session options, the per-fixture SHA-256 of every
output, and for a built-in simple decoder the served decisions) and check.py (release/kitscript.py), which
re-hashes the kit, runs the fixtures under the recorded sessions and says which class the device is in.

The kit is written into a temporary folder beside DIR and moved into place when complete.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from quantbench import __version__
from quantbench.analysis import decode
from quantbench.errors import ParameterError, UserError, flag_mark
from quantbench.fsutil import atomic_write_bytes, atomic_write_json, atomic_write_text, canonical_json, replace_dir, \
    sha256_file
from quantbench.hosts.requirements import host_key
from quantbench.inputs.modelio import model_hashes, write_self_contained
from quantbench.inputs.sidecarfile import sidecar_for, variant_identity
from quantbench.inputs.variantdir import latest_variants, resolve_variants, staging_folder
from quantbench.release import kitcheck, kitscript
from quantbench.store import partread, tableschema
from quantbench.store.hostresults import load_hosts, load_outputs, tensor_from_row

KIT_FORMAT = 1
DEFAULT_COUNT = 16
CHECK_FILE = "check.py"
MODEL_FILE = "model.onnx"


@dataclass
class Analysis:
    """The equiv analysis a kit is made from: its id and settings, the variant's entry there, its class rows."""

    equiv_id: str
    settings: dict
    variant: dict
    classes: list


@dataclass
class KitResult:
    """A written kit: its folder, expected.json's content and the notes worth printing."""

    folder: Path
    expected: dict
    notes: list = field(default_factory=list)


def commission(variant: str, out, count: int = DEFAULT_COUNT, results_dir="results", force: bool = False,
               tables_root=None) -> KitResult:
    """Write the commissioning kit of `variant` (a variant name, or MODEL/NAME) to the folder `out`, from the equiv
    analysis in `results_dir` (its tables in `tables_root`, default results_dir/tables) that ran it; `force`
    replaces an earlier kit there."""
    out = _check_out(Path(out), Path(results_dir), force)
    count = _check_count(count)
    tables_root = Path(tables_root) if tables_root is not None else Path(results_dir) / "tables"
    an = find_analysis(tables_root, variant)
    model = _model_file(an, Path(results_dir))
    if _within(out, Path(model).parent):
        raise ParameterError("out", f"is inside the variants folder {Path(model).parent}; write the kit elsewhere",
                             str(out))
    with staging_folder(out) as stage:
        kit = stage / "kit"
        kit.mkdir()
        expected, notes = write_kit(kit, an, tables_root, count, model_file=model)
        replace_dir(kit, out)
    return KitResult(out, expected, notes)


def _within(path: Path, folder: Path) -> bool:
    """`path` is `folder` or lies under it (links followed; neither need exist)."""
    p, f = path.resolve(), folder.resolve()
    return p == f or f in p.parents


def _check_count(count) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ParameterError("count", "must be a whole number of fixtures, at least 1", count)
    return count


def _check_out(out: Path, results_dir: Path, force: bool) -> Path:
    """`out` may take a new kit: not in the variants folder, not a file, empty or (with `force`) an earlier kit."""
    if _within(out, results_dir / "variants"):
        raise ParameterError("out", f"is inside the variants folder {results_dir / 'variants'}; write the kit "
                                    "elsewhere", str(out))
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ParameterError("out", "exists and is not a folder", str(out))
    if not out.parent.is_dir():
        raise ParameterError("out", f"its folder {out.parent} does not exist", str(out))
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ParameterError("out", f"exists and is not empty; {flag_mark('force')} replaces an earlier kit there",
                                 str(out))
        if not ((out / kitcheck.EXPECTED).is_file() and (out / CHECK_FILE).is_file()):
            raise ParameterError("out", "holds no commissioning kit (no expected.json and check.py); quantbench never "
                                        "replaces it: choose an empty or new folder", str(out))
    return out


# --- the analysis -------------------------------------------------------------------------------------------------

def find_analysis(tables_root: Path, variant: str) -> Analysis:
    """The equiv analysis of `variant` (name or MODEL/NAME): of several, the one covering most hosts (ties: the
    smallest equiv_id, as a release chooses)."""
    if "classes" not in tableschema.COLUMNS or not partread.parts("classes", tables_root):
        raise UserError(f"no equiv analysis in {tables_root}: run `quantbench equiv` on the variant first")
    rows = partread.read("classes", root=tables_root, columns=["equiv_id", "variant_id", "variant", "model",
                                                              "class_label", "hosts", "reference", "settings"]).to_pylist()
    model, _, name = variant.rpartition("/")
    mine = [r for r in rows if r["variant"] == name and (not model or r["model"] == model)]
    if not mine:
        known = sorted({f"{r['model']}/{r['variant']}" for r in rows})
        raise ParameterError("variant", f"no equiv analysis ran it (analysed: {', '.join(known)}); run `quantbench "
                                        "equiv` with it first", variant)
    models = sorted({r["model"] for r in mine})
    if len(models) > 1:
        raise ParameterError("variant", f"several models have a variant of this name ({', '.join(models)}); name one "
                                        f"as MODEL/{name}", variant)
    cover = defaultdict(set)
    for r in mine:
        cover[(r["equiv_id"], r["variant_id"])] |= set(r["hosts"] or [])
    eid, vid = sorted(cover, key=lambda k: (-len(cover[k]), k))[0]
    chosen = sorted((r for r in mine if (r["equiv_id"], r["variant_id"]) == (eid, vid)), key=lambda r: r["class_label"])
    settings = json.loads(chosen[0]["settings"])
    entry = next(v for v in settings["variants"] if v["variant_id"] == vid)
    return Analysis(eid, settings, entry, chosen)


def analysis_of(tables_root: Path, equiv_id: str, variant_id: str) -> Analysis:
    """The analysis `equiv_id` of variant `variant_id` (the one a release recorded)."""
    rows = partread.read("classes", root=tables_root, columns=["equiv_id", "variant_id", "variant", "model",
                                                              "class_label", "hosts", "reference", "settings"],
                         filter={"equiv_id": equiv_id, "variant_id": variant_id}).to_pylist()
    rows.sort(key=lambda r: r["class_label"])
    settings = json.loads(rows[0]["settings"])
    return Analysis(equiv_id, settings, next(v for v in settings["variants"] if v["variant_id"] == variant_id), rows)


def _model_file(an: Analysis, results_dir: Path) -> str:
    """The variant's ONNX file as equiv ran it: the path equiv recorded (relative to where it ran: tried as given and
    beside the results folder), else the latest calibrate output's variant of that name; its identity checked (a
    file changed since is refused)."""
    path = an.variant["path"]
    tried = [Path(path), results_dir.parent / path] if not Path(path).is_absolute() else [Path(path)]
    with contextlib.suppress(UserError):
        tried += [Path(v.path) for v in latest_variants(results_dir) if v.name == an.variant["name"]]
    required = an.variant.get("session_requirements") or {}
    found = [p for p in dict.fromkeys(tried) if p.is_file()]
    for p in found:
        if variant_identity(model_hashes(p)["semantic_sha256"], required) == an.variant["variant_id"]:
            return str(p)
    if found:
        raise UserError(f"{found[0]}: variant {an.variant['name']} changed since equiv ran it; run `quantbench equiv` "
                        "again before commissioning it")
    raise UserError(f"{path}: the model of variant {an.variant['name']} that equiv ran is gone; run `quantbench "
                    "calibrate` and `quantbench equiv` again")


def host_runs(tables_root: Path, an: Analysis) -> dict:
    """Per host of the analysis: its fingerprint, recorded session and {fixture: {output: sha256}} as equiv
    compared them (its selected fingerprint and session, its fixtures)."""
    vid = an.variant["variant_id"]
    hosts = [h for c in an.classes for h in c["hosts"]]
    fixtures = set(an.settings["fixtures"][vid])
    sel = {h: tuple(s) for h, s in an.settings["selections"].items()}
    cols = ["host", "fingerprint_id", "session_key", "session_options", "fixture_id", "output_name", "sha256"]
    t = load_outputs(variant_id=vid, host=hosts, tables_root=tables_root, columns=cols)
    runs: dict = {}
    for h, fp, sk, so, fx, on, sha in zip(*(t.column(c).to_pylist() for c in cols)):
        if fx not in fixtures or (fp, host_key(so, sk)) != sel.get(h):
            continue
        run = runs.setdefault(h, {"fingerprint_id": fp, "session_key": sk, "session": json.loads(so), "hashes": {}})
        run["hashes"].setdefault(fx, {})[on] = sha
    missing = sorted(set(hosts) - set(runs))
    if missing:
        raise UserError(f"{tables_root}: the outputs equiv compared for {', '.join(missing)} are gone; run "
                        "`quantbench equiv` again")
    return runs


def _margins(tables_root: Path, an: Analysis) -> dict:
    """{fixture: smallest |margin| of the reference host's decisions} (empty: equiv made no decisions)."""
    if not partread.parts("decisions", tables_root):
        return {}
    t = partread.read("decisions", root=tables_root, columns=["fixture_id", "margin"],
                      filter={"equiv_id": an.equiv_id, "variant_id": an.variant["variant_id"],
                              "host": an.settings["reference"]})
    out: dict = {}
    for fx, m in zip(t.column("fixture_id").to_pylist(), t.column("margin").to_pylist()):
        if m is not None and math.isfinite(m):
            out[fx] = min(out.get(fx, math.inf), abs(m))
    return out


def choose_fixtures(ids, class_hashes: list, margins: dict, count: int) -> list:
    """[(fixture id, why)]: alternately the fixtures that separate classes and those nearest the threshold (each
    list by smallest margin, then id), until `count`."""
    near = sorted(ids, key=lambda f: (margins.get(f, math.inf), f))
    separating = [f for f in near if len({canonical_json(h[f]) for h in class_hashes}) > 1]
    chosen: dict = {}
    for pair in zip(separating + [None] * len(near), near):
        for f, why in zip(pair, ("separates classes", _near(margins, pair[1]))):
            if f is not None and f not in chosen and len(chosen) < count:
                chosen[f] = why
    return list(chosen.items())


def _near(margins: dict, f: str) -> str:
    return f"near the threshold (margin {margins[f]:.4g})" if f in margins else "one of the analysis's fixtures"


# --- writing ------------------------------------------------------------------------------------------------------

def write_kit(kit: Path, an: Analysis, tables_root: Path, count: int, model_file: str | None = None,
              model_ref: tuple | None = None) -> tuple[dict, list]:
    """Fill the empty folder `kit`: the model (`model_file` copied, or `model_ref` (path from the kit, SHA-256) by
    reference), the fixtures, expected.json, check.py. Returns (expected.json's content, notes)."""
    runs = host_runs(tables_root, an)
    vid = an.variant["variant_id"]
    class_hashes = [runs[c["hosts"][0]]["hashes"] for c in an.classes]
    ids = sorted(an.settings["fixtures"][vid])
    chosen = choose_fixtures(ids, class_hashes, _margins(tables_root, an), count)
    notes = [] if len(chosen) == count else [f"the analysis compared {len(ids)} fixtures; the kit holds them all"]
    if model_ref is None:
        write_self_contained(model_file, kit / MODEL_FILE)
        model_ref = (MODEL_FILE, sha256_file(kit / MODEL_FILE))
    spec = _decode_spec(an, model_file, next(iter(class_hashes[0].values())))
    expected = {"format": KIT_FORMAT, "quantbench_version": __version__, "equiv_id": an.equiv_id,
                "variant": {k: an.variant.get(k) for k in ("name", "model", "variant_id")},
                "model": {"file": model_ref[0], "sha256": model_ref[1]},
                "fixtures": _write_fixtures(kit, tables_root, chosen),
                "decode": None if spec is None else {"decoder": kitscript.simple_decoder(spec), "spec": spec.as_dict()},
                "classes": _classes(tables_root, an, runs, [f for f, _ in chosen], spec)}
    atomic_write_json(kit / kitcheck.EXPECTED, expected)
    atomic_write_text(kit / CHECK_FILE, kitscript.render(sha256_file(kit / kitcheck.EXPECTED)))
    os.chmod(kit / CHECK_FILE, 0o755)
    return expected, notes


def _write_fixtures(kit: Path, tables_root: Path, chosen: list) -> list:
    """fixtures/NN.bin (the canonical tensor bytes) and their entries in expected.json, in the chosen order."""
    t = partread.read("fixtures", root=tables_root, columns=["fixture_id", "input_name", "dtype", "shape", "source",
                                                           "tensor"], filter={"fixture_id": [f for f, _ in chosen]})
    rows = {}
    for r in t.to_pylist():
        rows.setdefault(r["fixture_id"], r)
    (kit / "fixtures").mkdir()
    width = max(2, len(str(len(chosen))))
    out = []
    for i, (fx, why) in enumerate(chosen, 1):
        r = rows.get(fx)
        if r is None:
            raise UserError(f"{tables_root}: fixture {fx[:16]} that equiv compared is not in the fixtures table")
        rel = f"fixtures/{i:0{width}d}.bin"
        atomic_write_bytes(kit / rel, r["tensor"])
        out.append({"index": i, "file": rel, "sha256": sha256_file(kit / rel), "fixture_id": fx,
                    "input_name": r["input_name"], "dtype": r["dtype"], "shape": list(r["shape"]),
                    "source": r["source"], "why": why})
    return out


def _decode_spec(an: Analysis, model_file: str | None, first_outputs: dict):
    """The analysis's decode spec when its decoder is a built-in simple rule the device can re-apply, else None."""
    path = model_file or an.variant["path"]
    try:
        v = resolve_variants([path])[0]
        spec = decode.spec_from_sidecar(sidecar_for(v), an.settings.get("decode"), an.settings.get("threshold"),
                                        source=str(path))
        spec = decode.check_outputs(spec, sorted(first_outputs))
    except (UserError, ValueError):   # a plug-in, or a sidecar gone since: no decisions in the kit, said so
        return None
    return spec if kitscript.simple_decoder(spec) else None


def _classes(tables_root: Path, an: Analysis, runs: dict, fixtures: list, spec) -> list:
    """expected.json's classes: label, reference, hosts (fingerprint, session), per-fixture hashes and decisions."""
    fps = {(r["host"], r["fingerprint_id"]): r["fingerprint"] for r in load_hosts(
        host=sorted(runs), tables_root=tables_root, columns=["host", "fingerprint_id", "fingerprint"]).to_pylist()}
    out = []
    for c in an.classes:
        hosts = [{"host": h, "fingerprint_id": runs[h]["fingerprint_id"], "session": runs[h]["session"],
                  "fingerprint": json.loads(fps.get((h, runs[h]["fingerprint_id"])) or "{}").get("identity", {})}
                 for h in c["hosts"]]
        rep = runs[c["hosts"][0]]
        out.append({"label": c["class_label"], "reference": bool(c["reference"]), "hosts": hosts,
                    "outputs": [rep["hashes"][f] for f in fixtures],
                    "decisions": None if spec is None else _decisions(tables_root, an, c["hosts"][0], rep, fixtures,
                                                                      spec)})
    return out


def _decisions(tables_root: Path, an: Analysis, host: str, run: dict, fixtures: list, spec) -> list:
    """The served decisions of one host per fixture, from its stored outputs, by kitcheck.served."""
    t = load_outputs(host=host, variant_id=an.variant["variant_id"], fingerprint_id=run["fingerprint_id"],
                     session_key=run["session_key"], fixture_id=fixtures, tables_root=tables_root)
    arrays: dict = defaultdict(dict)
    for r in t.to_pylist():
        arrays[r["fixture_id"]][r["output_name"]] = tensor_from_row(r)
    return [kitcheck.served(decode.decode(spec, arrays[f])) for f in fixtures]


# --- in a release ---------------------------------------------------------------------------------------------------

def release_kits(stage: Path, record: dict, variants, tables_root: Path, count: int = DEFAULT_COUNT) -> list:
    """kits/NAME/ in a release's staging folder for each variant an equiv analysis measured (the analysis the release
    recorded), its model a reference to the release's artifact by SHA-256 (none retained: by SHA-256 alone); the
    record's entries, every file with its SHA-256 (verify re-hashes them)."""
    out = []
    for v, vr in zip(variants, record["variants"]):
        eid = next((t["equiv"]["equiv_id"] for t in vr["targets"] if t.get("equiv")), None)
        if eid is None:
            continue
        kit = stage / "kits" / v.name
        kit.mkdir(parents=True)
        art = vr["artifact"]
        ref = (f"../../{art['file']}", sha256_file(stage / art["file"])) if art["retained"] else (None, vr["raw_sha256"])
        write_kit(kit, analysis_of(tables_root, eid, vr["variant_id"]), tables_root, count, model_file=str(v.path),
                  model_ref=ref)
        files = [{"file": p.relative_to(stage).as_posix(), "sha256": sha256_file(p)}
                 for p in sorted(kit.rglob("*")) if p.is_file()]
        out.append({"variant": v.name, "folder": f"kits/{v.name}", "equiv_id": eid, "files": files})
    return out
