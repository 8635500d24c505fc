"""What a release carries besides its tables, artifacts and calibration manifests, so that whoever
receives it (the folder or its archive) can read and rerun it as published:

- ``sidecars/<variant>.json``: the sidecar (classes, input, decode) each variant ran with;
- ``plugins/<sha256 prefix>/<file>``: every plug-in file the recipes or sidecars name
  (``path/to/file.py:function``), copied only when it still has the SHA-256 the recipe recorded;
  a module plug-in (``package.module:function``) is recorded by reference only (install it);
- ``report.html`` as it was at release time, with the images it shows (the paths it links
  under the results folder are kept, so its links work inside the release).

Each is recorded with its SHA-256 in release.json and re-hashed by `verify`. Nothing here runs
a plug-in: files are copied and hashed, never imported.
"""

from __future__ import annotations

import html
import os
import re
import shutil
from pathlib import Path

from quantbench.fsutil import atomic_write_json, sha256_file
from quantbench.inputs.plugins import is_ref
from quantbench.inputs.sidecarfile import sidecar_for
from quantbench.inputs.variantdir import inside

HTML_FILE = "report.html"
_MD_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
_HTML_IMAGE = re.compile(r"<img\b[^>]*\bsrc=\"([^\"]+)\"")


def copy_linked(rels, results_dir: Path, stage: Path, notes: list | None = None) -> list[dict]:
    """Copy the files a report links to (paths relative to results/) to the same place in the release.

    Only a link that resolves (symlinks followed) to a file inside results/ is copied, and only
    to a place inside the release; any other link is left as text and noted."""
    out = []
    for rel in sorted(set(rels)):
        if "://" in rel or rel.startswith("data:"):
            continue
        src, dst = inside(results_dir, rel), inside(stage, rel)
        if src is None or dst is None or ".." in Path(rel).parts:
            if notes is not None:
                notes.append(f"report image {rel!r} not copied: it leads outside {results_dir}")
            continue
        if not src.is_file():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        out.append({"file": rel, "sha256": sha256_file(dst)})
    return out


def markdown_images(text: str) -> list[str]:
    return _MD_IMAGE.findall(text)


def copy_report_html(results_dir: Path, stage: Path, notes: list) -> dict | None:
    """results/report.html and the images it shows, into the release; its record entry (None: no report.html)."""
    src = Path(results_dir) / HTML_FILE
    if not src.is_file():
        return None
    shutil.copyfile(src, stage / HTML_FILE)
    text = (stage / HTML_FILE).read_text(encoding="utf-8", errors="replace")
    images = [html.unescape(x) for x in _HTML_IMAGE.findall(text)]
    return {"file": HTML_FILE, "sha256": sha256_file(stage / HTML_FILE),
            "attachments": copy_linked(images, Path(results_dir), stage, notes)}


def copy_sidecars(stage: Path, variants, vrecords: list[dict]) -> None:
    """sidecars/<variant>.json for every variant with a sidecar; vrecord["sidecar"] = {"file", "sha256"} or None."""
    for v, vr in zip(variants, vrecords):
        sc = sidecar_for(v)
        vr["sidecar"] = None
        if isinstance(sc, dict):
            rel = f"sidecars/{v.name}.json"
            atomic_write_json(stage / rel, sc)
            vr["sidecar"] = {"file": rel, "sha256": sha256_file(stage / rel)}


def _plugin_refs(v) -> dict:
    """{reference: recorded SHA-256 or None} of the plug-ins variant `v` names (recipe and sidecar)."""
    recipe = v.recipe or {}
    sc = sidecar_for(v) or {}
    refs = {}
    pp = recipe.get("preprocess_plugin")
    if isinstance(pp, dict) and is_ref(pp.get("ref")):
        refs[pp["ref"]] = pp.get("sha256")
    for block in (recipe.get("preprocess"), sc.get("input"), sc.get("preprocess")):
        if isinstance(block, dict) and is_ref(block.get("plugin")):
            refs.setdefault(block["plugin"], None)
    kind = (sc.get("decode") or {}).get("kind") if isinstance(sc.get("decode"), dict) else None
    if is_ref(kind):
        refs.setdefault(kind, None)
    return refs


def copy_plugins(stage: Path, variants, notes: list) -> list[dict]:
    """Every plug-in file the variants name, once, under plugins/; [{"ref", "sha256", "file" or None, "note"}]."""
    refs: dict = {}
    for v in variants:
        for ref, sha in _plugin_refs(v).items():
            refs[ref] = refs.get(ref) or sha
    out = []
    for ref, recorded in sorted(refs.items()):
        mod = ref.rpartition(":")[0]
        entry = {"ref": ref, "sha256": recorded, "file": None}
        if not (mod.endswith(".py") or "/" in mod or os.sep in mod):
            entry["note"] = "a module, not a file: not carried (install it to rerun)"
        else:
            src = Path(mod).expanduser()
            sha = sha256_file(src) if src.is_file() else None
            if sha is None or (recorded and sha != recorded):
                entry["note"] = (f"{src} is gone" if sha is None else f"{src} changed since it was recorded") + \
                    ": not carried"
            else:
                name = src.name if re.fullmatch(r"[A-Za-z0-9_+-][A-Za-z0-9._+-]*", src.name) else "plugin.py"
                rel = f"plugins/{sha[:16]}/{name}"
                (stage / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, stage / rel)
                entry.update(sha256=sha, file=rel)
        if entry["file"] is None:
            notes.append(f"plug-in {ref}: {entry['note']}")
        out.append(entry)
    return out
