"""`quantbench report`: re-render results/report.md from the result tables."""

from __future__ import annotations

from pathlib import Path

from quantbench.analysis.equiv import reanalyze
from quantbench.cli.commands import add_plugin_arguments
from quantbench.cli.equivprint import finish_equiv

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


def run(args) -> int:
    again = reanalyze(args.results, args.equiv_id)
    args.gate = None
    if not args.fixtures:  # the labels that analysis read
        args.fixtures, args.images = again.labels.get("fixtures"), args.images or again.labels.get("images")
    results = Path(args.results)
    return finish_equiv(again.result, args, results, results / "tables", gates=again.result.settings["gates"])
