"""`quantbench report`: re-render results/report.md from the result tables."""

from __future__ import annotations

import json
from pathlib import Path

from quantbench import tables
from quantbench.analysis import gates as G
from quantbench.analysis.decode import is_plugin
from quantbench.analysis.equiv import VariantRef, analyze
from quantbench.analysis.resultcache import cache_dir_of
from quantbench.commands import add_plugin_arguments, finish_equiv
from quantbench.errors import UserError
from quantbench.fsutil import check_writable
from quantbench.plugins import require
from quantbench.recipe import allow_recorded, sidecar_for
from quantbench.variants import Variant

HELP = "Re-render results/report.md (and its plots) from the result tables of the last `quantbench equiv`."


def add_arguments(p) -> None:
    p.add_argument("--equiv-id", metavar="ID",
                   help="which equiv analysis to render (a prefix is enough; none: the last `quantbench equiv`)")
    p.add_argument("--results", default="results", metavar="DIR", help="results folder (tables under DIR/tables)")
    p.add_argument("--fixtures", metavar="LABELS.json",
                   help="COCO labels the fixtures were built from, for the accuracy (default: the ones the last "
                        "`quantbench equiv` of this analysis read, else the bundled corpus)")
    p.add_argument("--images", metavar="DIR", help="folder of the images named in --fixtures (default: images/ beside it)")
    p.add_argument("--no-plots", action="store_true", help="no PNG plots in the report")
    p.add_argument("--json", action="store_true", help="print the equiv summary as JSON instead of text")
    add_plugin_arguments(p)


def last_equiv(results: Path) -> dict:
    """The summary the last `quantbench equiv` wrote (its id and gate settings), or {}."""
    p = results / "equiv.json"
    if not p.exists():
        return {}
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def run(args) -> int:
    results = Path(args.results)
    root = results / "tables"
    ct = tables.read("classes", root=root, columns=["equiv_id", "settings"])
    settings_of = dict(zip(ct.column("equiv_id").to_pylist(), ct.column("settings").to_pylist()))
    if not settings_of:
        raise UserError(f"{root}/classes: no equiv results; run `quantbench equiv --hosts pi,x86` first")
    last = last_equiv(results)
    want = args.equiv_id or last.get("equiv_id")
    ids = sorted(settings_of)
    if want:
        match = [i for i in ids if i.startswith(want)]
        if len(match) != 1:
            raise UserError(f"--equiv-id {want}: {'no' if not match else 'several'} analyses match; "
                            f"known: {', '.join(i[:12] for i in ids)}")
        eid = match[0]
    elif len(ids) == 1:
        eid = ids[0]
    else:
        raise UserError(f"{root}/classes: {len(ids)} equiv analyses; pick one with --equiv-id "
                        f"({', '.join(i[:12] for i in ids)})")
    st = json.loads(settings_of[eid])
    models = {r["variant_id"]: r for r in tables.read("models", root=root).to_pylist()}
    refs = []
    for v in st["variants"]:
        recipe = json.loads((models.get(v["variant_id"]) or {}).get("recipe") or "{}")
        allow_recorded(recipe)   # the plug-ins calibrate ran, unchanged, run again
        sidecar = sidecar_for(Variant(name=v["name"], path=Path(v.get("path") or ""), model=v["model"], recipe=recipe))
        refs.append(VariantRef(name=v["name"], variant_id=v["variant_id"], model=v["model"], sidecar=sidecar,
                               path=v.get("path", "")))
    if is_plugin(st["decode"]):   # named on that equiv's command line, read back from a table: ask again
        require(st["decode"], f"{root}/classes (analysis {eid[:12]}): decode")
    prefer = {h: tuple(x) for h, x in st["selections"].items()}
    # gate settings are not part of the analysis id: take the last run's when it is this analysis
    gs = (last.get("settings") or {}) if last.get("equiv_id") == eid else {}

    check_writable(results, "the report is written into the results folder")
    result = analyze(st["hosts"], refs, st["fixtures"], reference=st["reference"], decode_kind=st["decode"],
                     threshold=st["threshold"], atol=gs.get("atol", G.DEFAULT_ATOL),
                     rtol=gs.get("rtol", G.DEFAULT_RTOL), budget=gs.get("budget", G.DEFAULT_BUDGET),
                     prefer=prefer, tables_root=root, duplicates=st.get("duplicates"), cache_dir=cache_dir_of(results))
    args.gate = None
    # the verdict states the gates that analysis was run with; the labels are the ones it read
    result.settings["gates"] = list(gs.get("gates") or [])
    seen = (last.get("labels") or {}) if last.get("equiv_id") == eid else {}
    if not args.fixtures:
        args.fixtures, args.images = seen.get("fixtures"), args.images or seen.get("images")
    return finish_equiv(result, args, results, root, gates=result.settings["gates"])
