"""The result tables kept fast as they grow (the `tables` command): each table's parts, small parts and bytes
(`tables_info`), and small parts merged into sorted parts with statistics (`compact_tables`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from quantbench.api.options import Results, check_groups
from quantbench.errors import UserError
from quantbench.store import compaction, lazy, partread, tableschema
from quantbench.textfmt import text_table

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy.module("pyarrow")


@dataclass
class TablesInfo:
    """Per table present: its parts, the small ones (below compaction's threshold) and their bytes."""

    rows: list[dict]

    def table(self) -> "pa.Table":
        """The rows as a table.

        Returns
        -------
        pyarrow.Table
            One row per table present: table, parts, small, bytes.
        """
        return pa.Table.from_pylist(self.rows, schema=pa.schema([("table", pa.string()), ("parts", pa.int64()),
                                                                 ("small", pa.int64()), ("bytes", pa.int64())]))

    def text(self) -> str:
        """The rows as the command prints them (MB to one decimal).

        Returns
        -------
        str
        """
        return text_table(("table", "parts", "small", "MB"), [(r["table"], str(r["parts"]), str(r["small"]),
                                                               f"{r['bytes'] / 1e6:.1f}") for r in self.rows])


def _present(root) -> list[str]:
    return [n for n in tableschema.COLUMNS if partread.parts(n, root)]


def tables_info(results: Results = Results()) -> TablesInfo:
    """The parts of every table present, so a caller sees when compaction is due (many small parts read slowly).

    Parameters
    ----------
    results : Results
        The results folder whose tables are counted.

    Returns
    -------
    TablesInfo
        Per table present: its parts, the small ones (below compaction's threshold) and their bytes.
    """
    check_groups(results=results)
    rows = []
    for n in _present(results.tables):
        sizes = [p.stat().st_size for p in partread.parts(n, results.tables)]
        rows.append({"table": n, "parts": len(sizes), "small": sum(1 for s in sizes if s < compaction.SMALL_PART_BYTES),
                     "bytes": sum(sizes)})
    return TablesInfo(rows)


def compact_tables(results: Results = Results(), names=None) -> list[dict]:
    """Compact tables into few large parts, for faster reads: the same rows and content keys after, each new part
    written before an old one is removed (an interruption loses nothing).

    Parameters
    ----------
    results : Results
        The results folder whose tables are compacted.
    names : list of str, optional
        The tables (None or empty: every table present).

    Returns
    -------
    list of dict
        Per table: its name and compaction.compact's counts (parts_in, parts_out, rows).
    """
    check_groups(results=results)
    names = list(names or _present(results.tables))
    unknown = [n for n in names if n not in tableschema.COLUMNS]
    if unknown:
        raise UserError(f"unknown table(s) {', '.join(unknown)}; tables: {', '.join(tableschema.COLUMNS)}")
    return [{"table": n, **compaction.compact(n, results.tables)} for n in names]
