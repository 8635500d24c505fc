"""Compaction: a table's small parts merged into sorted, statistics-bearing parts, rows and keys unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

from quantbench.store.resultpaths import TABLES_DIR
from quantbench.fsutil import atomic_path, sha256_bytes
from quantbench.store import arrowrows, partread, partwrite, tableschema


# --------------------------------------------------------------------------- compaction

#: Column order compacted parts are sorted by: the filters the readers use come first, so
#: each row group covers few hosts/variants and the statistics let a read skip the rest.
SORT_KEYS: dict[str, list[str]] = {
    "outputs": ["host", "fingerprint_id", "session_key", "variant_id", "fixture_id", "output_name", "run_key"],
    "decisions": ["equiv_id", "host", "variant_id", "fixture_id", "slot"],
    "flips": ["equiv_id", "comparison", "host", "variant_id", "fixture_id", "ref_slot", "slot"],
}

#: A part under this size is "small": compaction merges small parts only.
SMALL_PART_BYTES = 32 << 20

#: Compaction writes a new part per this many bytes of small parts (bounds its memory).
COMPACT_BATCH_BYTES = 256 << 20

#: Automatic compaction starts when a table has more small parts than this.
AUTO_COMPACT_PARTS = 64

#: Rows per row group in a compacted part (tensor tables: a few MB each).
ROW_GROUP_ROWS = {"outputs": 2048, "fixtures": 64}


def compact(name: str, root: str | os.PathLike = TABLES_DIR, min_parts: int = 2,
            small_bytes: int = SMALL_PART_BYTES) -> dict:
    """Merge the table's small parts into sorted, statistics-bearing parts; returns what it did.

    Rows and keys are exactly what `read` returned before (duplicates across parts
    are dropped the same way: the first in name order). Each new part is written
    atomically and named by its content hash before any old part is removed, so a
    crash leaves duplicates that readers drop, never a lost row; a reader that finds
    a part gone restarts (see read). The ledger follows the rows to their new part.
    """
    files = [p for p in partread.parts(name, root) if _size(p) < small_bytes]
    if len(files) < max(2, min_parts):
        return {"table": name, "parts_in": 0, "parts_out": 0, "rows": 0}
    batches, cur, size = [], [], 0
    for p in files:
        cur.append(p)
        size += _size(p)
        if size >= COMPACT_BATCH_BYTES:
            batches.append(cur)
            cur, size = [], 0
    if cur:
        batches.append(cur)
    out, rows, merged = [], 0, 0
    for batch in batches:
        if len(batch) < 2:
            continue
        try:
            table = partread.read_parts(name, batch, None, None)
        except FileNotFoundError:  # another compaction got there first
            continue
        sort = SORT_KEYS.get(name, tableschema.KEYS[name])
        table = table.sort_by([(k, "ascending") for k in sort])
        data = partwrite.serialize([arrowrows.to_arrow(name, table)], row_group_rows=ROW_GROUP_ROWS.get(name, 8192))
        path = Path(root) / name / f"part-{sha256_bytes(data)[:32]}.parquet"
        if not path.exists():
            with atomic_path(path) as tmp:
                tmp.write_bytes(data)
        partwrite.ledger_move(name, root, {p.name for p in batch if p != path}, path.name)
        for p in batch:
            if p != path:
                try:
                    p.unlink()
                except FileNotFoundError:
                    pass
        out.append(path)
        rows += table.num_rows
        merged += len(batch)
    return {"table": name, "parts_in": merged, "parts_out": len(out), "rows": rows}


def maybe_compact(name: str, root: str | os.PathLike = TABLES_DIR, threshold: int | None = None) -> dict | None:
    """compact() when the table holds more small parts than the threshold (AUTO_COMPACT_PARTS,
    or QUANTBENCH_COMPACT_PARTS; 0 turns automatic compaction off)."""
    if threshold is None:
        threshold = int(os.environ.get("QUANTBENCH_COMPACT_PARTS", AUTO_COMPACT_PARTS))
    if threshold <= 0:
        return None
    files = partread.parts(name, root)
    if len(files) <= threshold or sum(1 for p in files if _size(p) < SMALL_PART_BYTES) <= threshold:
        return None
    return compact(name, root)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0
