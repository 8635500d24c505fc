"""What the explain API functions (localize, lint, remedy, noise, latency) share: their rows appended to their
table and read back as written, and the report's explain section re-rendered from every explain table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from quantbench.api.options import Results
from quantbench.errors import ParameterError
from quantbench.report import explainsection
from quantbench.store import lazy, partwrite, tableschema

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq
else:
    pa = lazy.module("pyarrow")
    pq = lazy.module("pyarrow.parquet")


def names(name: str, value) -> list[str]:
    """A list of names a caller gave (`remedies=`, `factors=`): a list of them, or one comma-separated text."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ParameterError(name, "must be a list of names or comma-separated names", value)


def append(name: str, rows: list[dict], results: Results) -> Path | None:
    """`rows` appended to table `name` under the results folder's tables; the part written (None: no rows)."""
    return partwrite.append(name, rows, root=results.tables)


def written(name: str, part: Path | None) -> "pa.Table":
    """The rows of one part of table `name` as written (created_at and run_id included); no part: none."""
    if part is None:
        return tableschema.schema(name).empty_table()
    return pq.read_table(part)


def update_report(results: Results) -> Path:
    """The explain section re-rendered from the tables under `results`, report.md reassembled; its path."""
    return explainsection.update_report(results.folder, results.tables)
