"""`quantbench report`: re-render results/report.md from the result tables."""

from __future__ import annotations

from quantbench.api.equiv import rerender
from quantbench.cli.equivprint import print_equiv
from quantbench.cli.groups import OUTPUT, PluginArgs, ResultsArgs
from quantbench.errors import render_params

HELP = "Re-render results/report.md (and its plots) from the result tables of the last `quantbench equiv`."
JSON_NATIVE = True  # prints its own --json summary
RESULTS = ResultsArgs()


def add_arguments(p) -> None:
    p.add_argument("--equiv-id", metavar="ID",
                   help="which equiv analysis to render (a prefix is enough; none: the last `quantbench equiv`)")
    RESULTS.add(p)
    p.add_argument("--fixtures", metavar="LABELS.json",
                   help="COCO labels the fixtures were built from, for the accuracy (default: the ones the last "
                        "`quantbench equiv` of this analysis read, else the bundled corpus)")
    p.add_argument("--images", metavar="DIR", help="folder of the images named in --fixtures (default: images/ beside it)")
    p.add_argument("--no-plots", action="store_true", help="no PNG plots in the report")
    PluginArgs().add(p)


def run(args) -> int:
    render = getattr(args, "_render", render_params)   # the report's lines may point at a flag (errors.flag_mark)
    result, files = rerender(RESULTS.parse(args), args.equiv_id, args.fixtures, args.images, plots=not args.no_plots,
                             render=render)
    return print_equiv(result, files, [], [], OUTPUT.parse(args).json, render=render)
