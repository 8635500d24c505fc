"""`quantbench tables compact | info`: keep the result tables fast as they grow."""

from __future__ import annotations

from quantbench.store import compaction, partread, tableschema
from quantbench.cli.groups import ResultsArgs
from quantbench.errors import UserError
from quantbench.textfmt import text_table

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
    root = RESULTS.parse(args).tables
    present = [n for n in tableschema.COLUMNS if partread.parts(n, root)]
    if args.action == "info":
        rows = [("table", "parts", "small", "MB")]
        for n in present:
            ps = partread.parts(n, root)
            sizes = [p.stat().st_size for p in ps]
            rows.append((n, str(len(ps)), str(sum(1 for s in sizes if s < compaction.SMALL_PART_BYTES)),
                         f"{sum(sizes) / 1e6:.1f}"))

        print(text_table(rows[0], rows[1:]))
        return 0
    names = args.names or present
    unknown = [n for n in names if n not in tableschema.COLUMNS]
    if unknown:
        raise UserError(f"unknown table(s) {', '.join(unknown)}; tables: {', '.join(tableschema.COLUMNS)}")
    for n in names:
        r = compaction.compact(n, root)
        if r["parts_in"]:
            print(f"{n}: {r['parts_in']} parts -> {r['parts_out']} ({r['rows']} rows)")
        else:
            print(f"{n}: nothing to compact")
    return 0
