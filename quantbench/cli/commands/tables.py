"""`quantbench tables compact | info`: keep the result tables fast as they grow."""

from __future__ import annotations

from quantbench.api.tables import compact_tables, tables_info
from quantbench.cli.groups import ResultsArgs

HELP = "Show the result tables' parts and rows, or compact small parts into sorted parts with statistics."


RESULTS = ResultsArgs(tables_alias=True)


def add_arguments(p) -> None:
    RESULTS.add(p)
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    c = sub.add_parser("compact", help="merge small parts (same rows, same keys; atomic)",
                       description="Merge each table's small parts into parts sorted by the columns reads filter "
                                   "on, with row-group statistics. Rows and content keys are unchanged; every new "
                                   "part is written (named by its content hash) before an old one is removed.")
    c.add_argument("names", nargs="*", help="tables to compact (default: every table present)")
    sub.add_parser("info", help="parts, small parts and bytes per table",
                   description="Parts, small parts and bytes per table.")


def run(args) -> int:
    results = RESULTS.parse(args)
    if args.action == "info":
        print(tables_info(results).text())
        return 0
    for r in compact_tables(results, args.names):
        if r["parts_in"]:
            print(f"{r['table']}: {r['parts_in']} parts -> {r['parts_out']} ({r['rows']} rows)")
        else:
            print(f"{r['table']}: nothing to compact")
    return 0
