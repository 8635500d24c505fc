"""Reading a table: all its parts as one Arrow table, de-duplicated on the table's key columns, filtered while
read (row groups the statistics rule out skipped), parts of an older schema version upgraded as read, and a
damaged part named (or, under the write lock, set aside: quarantine).
"""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from quantbench import SCHEMA_VERSION
from quantbench.store import lazy
from quantbench.store.resultpaths import TABLES_DIR
from quantbench.errors import UserError
from quantbench.fsutil import file_kind
from quantbench.store import arrowrows, tableschema

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
else:  # pyarrow loads on first use: importing this module (every command's does) stays cheap
    pa, pc, pq = lazy.module("pyarrow"), lazy.module("pyarrow.compute"), lazy.module("pyarrow.parquet")


def parts(name: str, root: str | os.PathLike = TABLES_DIR) -> list[Path]:
    d = Path(root) / name
    return sorted(d.glob("part-*.parquet")) if d.is_dir() else []


def read(name: str, root: str | os.PathLike = TABLES_DIR, columns: Sequence[str] | None = None,
         filter=None) -> pa.Table:
    """All parts of a table, de-duplicated on its key, sorted by key (deterministic).

    `filter` keeps some rows while reading, so large tables (outputs with tensors) can be
    read a slice at a time: a mapping {column: value, or a list/set of values} (every
    column must match; row groups whose min/max statistics rule it out are not read), or
    a pyarrow compute expression (read as one dataset). Without a filter or with a mapping,
    parts are read one by one with pyarrow.parquet: neither pyarrow.dataset nor pandas
    (which it imports when installed) is loaded. A part removed
    while reading (compacted by another process: its rows are in the new part) restarts
    the read.
    """
    gone = 0
    while True:
        try:
            return read_parts(name, parts(name, root), columns, filter)
        except FileNotFoundError:
            gone += 1
            if gone == 5:
                raise
        except CorruptPart as exc:
            if resolved_root(root) not in HELD_ROOTS:
                raise
            quarantine(exc.path, root, exc.reason)


class CorruptPart(UserError):
    """A part that cannot be read (damaged on disk or not a Parquet file); `path` names it."""

    def __init__(self, path: Path, name: str, reason: str):
        super().__init__(f"{path}: damaged {name} table part ({reason}); move it out of {path.parent} (or delete it) "
                         "and rerun: `quantbench run` and `equiv` set such a part aside themselves and recompute its rows")
        self.path, self.reason = path, reason


#: tables folders whose write lock (see lock) this process holds: a damaged part read there is set aside
HELD_ROOTS: set[str] = set()

QUARANTINE_DIR = ".quarantine"


def resolved_root(root) -> str:
    return str(Path(root).resolve())


def quarantine_unreadable(root: str | os.PathLike = TABLES_DIR) -> list[Path]:
    """Set aside every part of every table whose footer cannot be read or whose text is not UTF-8 (see quarantine),
    also parts this command would not read (an analysis reused from the cache): a later reader (release, report)
    then finds none, and the run recomputes their rows before its analysis reads them."""
    moved = []
    for name in sorted(tableschema.COLUMNS):
        for f in parts(name, root):
            try:
                _check_strings(f)
            except Exception as exc:  # damaged, truncated, not Parquet
                moved.append(quarantine(f, root, f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"))
    return moved


def quarantine(part: Path, root: str | os.PathLike, reason: str) -> Path:
    """Move a damaged part to <root>/.quarantine/<table>/ (kept, never read again), saying so on stderr.

    Its rows are missing from then on, so the run recomputes them; the ledger forgets it (a ledger
    entry names a part only while that part is there).
    """
    import sys

    dest_dir = Path(root) / QUARANTINE_DIR / part.parent.name
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / part.name
    n = 1
    while dest.exists():
        n += 1
        dest = dest_dir / f"{part.stem}.{n}{part.suffix}"
    os.replace(part, dest)
    _PART_FOOTERS.pop(str(part), None)
    sys.stderr.write(f"note: {part}: damaged ({reason}); moved to {dest}, its rows are recomputed\n")
    sys.stderr.flush()
    return dest


def read_parts(name: str, files: list[Path], columns, filter) -> pa.Table:
    sch = tableschema.schema(name)
    want = list(columns) if columns else [f.name for f in sch]
    key = tableschema.KEYS[name]
    read_cols = list(dict.fromkeys(want + key))
    target = pa.schema([sch.field(c) for c in read_cols])
    if not files:  # no pa.Table.from_pylist: converting Python values imports pandas
        return pa.Table.from_arrays([pa.nulls(0, f.type) for f in target], schema=target).select(want)
    table = None
    if isinstance(filter, Mapping):
        filter = _where(filter)  # read part by part below (no dataset)
    elif filter is not None and _all_current(files):
        try:
            # one dataset over every part: files opened in parallel, row groups the filter's
            # statistics rule out skipped, no per-file set-up
            import pyarrow.dataset as dataset

            table = dataset.dataset([str(f) for f in files], format="parquet").to_table(columns=read_cols, filter=filter)
            table = table.cast(target)
            table.validate(full=True)
        except Exception:
            table = None  # name the part at fault (or notice one that went away) below
    if table is None:
        def one(f: Path) -> pa.Table:
            try:
                t = _read_part(name, f, read_cols, filter).cast(target)
                t.validate(full=True)   # a flipped byte in a string column is invalid UTF-8: named here, not a
                return t                # UnicodeDecodeError in whoever turns the rows into Python values
            except (UserError, FileNotFoundError):
                raise
            except Exception as exc:  # corrupt or foreign file: name it
                if not f.exists():
                    raise FileNotFoundError(str(f)) from None
                reason = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
                raise CorruptPart(f, name, reason) from None

        if len(files) < 4:
            table = pa.concat_tables([one(f) for f in files])
        else:  # parts decoded in parallel (pyarrow releases the GIL), kept in name order
            with ThreadPoolExecutor(min(READ_THREADS, len(files)), thread_name_prefix="read-parts") as pool:
                table = pa.concat_tables(list(pool.map(one, files)))
    if table.num_rows:
        table = _first_by_key(table, key)
    return table.select(want)


def _first_by_key(table: pa.Table, key: list[str]) -> pa.Table:
    """The first row (in table order: parts in name order) of each key, sorted by key.

    A stable sort of the key columns (in one chunk: sorting many chunks is slower) puts each
    key's rows together in table order; a row is kept when its key
    differs from the previous row's (nulls equal each other, as in a group-by). Compute
    kernels on Arrow data only: no pyarrow.acero (its import loads pyarrow.dataset and
    pandas) and no Python value converted to Arrow (pyarrow imports pandas for that).
    """
    keys = pa.Table.from_arrays([table.column(k) for k in key], names=list(key)).combine_chunks()
    order = pc.sort_indices(keys, sort_keys=[(k, "ascending") for k in key])
    n = table.num_rows
    if n < 2:
        return table.take(order)
    keys = keys.take(order)
    new = None
    for k in key:
        col = keys.column(k).combine_chunks()
        a, b = col.slice(1), col.slice(0, n - 1)
        ne = pc.not_equal(a, b)
        if ne.null_count:
            ne = pc.if_else(pc.is_null(ne), pc.invert(pc.and_(pc.is_null(a), pc.is_null(b))), ne)
        new = ne if new is None else pc.or_(new, ne)
    return table.take(pa.concat_arrays([order.slice(0, 1), order.slice(1).filter(new)]))


def _where(filter: Mapping) -> dict:
    """A mapping filter as {column: [values], sorted}; one value stands for a list of one. None matches
    nothing (as `==` in an expression: a null equals nothing)."""
    out = {}
    for col, val in filter.items():
        vals = val if isinstance(val, (list, tuple, set, frozenset)) else [val]
        out[col] = sorted({v for v in vals if v is not None})
    return out


def _row_groups(meta, where: dict) -> list[int]:
    """The row groups of a part whose min/max statistics do not rule `where` out (flat columns only)."""
    leaf = {meta.schema.column(i).path: i for i in range(meta.num_columns)}  # a list column has its own path
    idx = {c: leaf[c] for c in where if c in leaf}
    keep = []
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        ok = True
        for col, i in idx.items():
            st = rg.column(i).statistics
            if st is None or not st.has_min_max:
                continue
            lo, hi = st.min, st.max
            try:
                if not any(lo <= v <= hi for v in where[col]):
                    ok = False
                    break
            except TypeError:  # statistics of another type than the values: no pruning
                continue
        if ok:
            keep.append(g)
    return keep


def _read_where(f: Path, cols: list[str], where: dict) -> pa.Table:
    """The rows of one part that match `where` (pyarrow.parquet only: row groups pruned, then a mask)."""
    meta, sch = _part_footer(f)
    names = sch.names
    groups = _row_groups(meta, where)
    if not groups:
        return pa.Table.from_batches([], schema=pa.schema([sch.field(c) for c in cols]))
    need = list(dict.fromkeys(cols + [c for c in where if c in names]))
    with pa.OSFile(str(f)) as fh:
        t = pq.ParquetFile(fh, metadata=meta).read_row_groups(groups, columns=need)
    mask = None
    for col, vals in where.items():
        if col not in names:
            continue
        m = pc.is_in(t.column(col), value_set=arrowrows.arrow_array(vals, sch.field(col).type), skip_nulls=True)
        mask = m if mask is None else pc.and_(mask, m)
    if mask is not None:
        t = t.filter(mask)
    return t.select(cols)


def _part_version(part_schema: pa.Schema) -> int | None:
    meta = part_schema.metadata or {}
    v = meta.get(b"quantbench.schema_version")
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _read_part(name: str, f: Path, read_cols: list[str], filter) -> pa.Table:
    """One part; a part of an older schema version is upgraded as it is read.

    Version 1 parts lack run_id and created_at (read as null) and the typed columns, which
    are computed from the JSON columns they mirror. A part of a newer version is refused.
    """
    ps = _part_schema(f)
    version = _part_version(ps)
    if version is not None and version > SCHEMA_VERSION:
        raise UserError(f"{f}: {name} table of schema version {version}, newer than this quantbench's "
                        f"{SCHEMA_VERSION}; upgrade quantbench to read it")
    missing = [c for c in read_cols if c not in ps.names]
    if not missing:
        return _read_table(f, read_cols, filter)
    unfillable = {c for c in missing if not arrowrows.is_filled(name, c)}
    if unfillable:
        raise UserError(f"{f}: {name} table of schema version {version or 'unknown'} lacks column(s) "
                        f"{', '.join(sorted(unfillable))} of schema version {SCHEMA_VERSION}; "
                        "rewrite it with this quantbench (rerun the command that made it)")
    sources = [c for cols, src, _ in arrowrows.DERIVED.get(name, []) if set(cols) & set(missing) for c in src]
    cols = list(dict.fromkeys([c for c in read_cols if c in ps.names] + [c for c in sources if c in ps.names]))
    t = _read_table(f, cols, filter)
    t = arrowrows.complete_columns(name, t)
    if "created_at" in missing:  # unknown for an old part: null, not "now"
        t = t.set_column(t.column_names.index("created_at"), "created_at", pa.nulls(t.num_rows, tableschema.TIMESTAMP.arrow))
    return t.select(read_cols)


def _read_table(f: Path, cols: list[str], filter) -> pa.Table:
    if isinstance(filter, dict):
        return _read_where(f, cols, filter)
    if filter is None:
        with pa.OSFile(str(f)) as fh:  # a native file: no filesystem resolution; the footer parsed once
            return pq.ParquetFile(fh, metadata=_part_footer(f)[0]).read(columns=cols)
    return pq.read_table(f, columns=cols, filters=filter)


#: Threads that read a table's parts (each part is decoded with the GIL released).
READ_THREADS = 4


#: Footer (metadata and schema) of each part read so far, by path: ((size, mtime, inode), (meta, schema)), so a
#: footer is parsed once per process and file, not once per read.
_PART_FOOTERS: dict[str, tuple] = {}


def _part_footer(f: Path) -> tuple:
    """(FileMetaData, Arrow schema) of a part. Cached by its path and the file's identity (size, mtime, inode): a
    part set aside and written again under its name (its rows recomputed) is another file, with another footer."""
    key = str(f)
    st = os.stat(key)   # stat never blocks; opening a FIFO waits for a writer that never comes
    ident = (st.st_size, st.st_mtime_ns, st.st_ino)
    hit = _PART_FOOTERS.get(key)
    if hit is not None and hit[0] == ident:
        return hit[1]
    if not stat.S_ISREG(st.st_mode):
        raise NotAPart(f"is {file_kind(st.st_mode)}, not a Parquet file")
    with pa.OSFile(key) as fh:
        meta = pq.read_metadata(fh)
    ft = (meta, meta.schema.to_arrow_schema())
    _PART_FOOTERS[key] = (ident, ft)
    return ft


#: (path, size, mtime, inode) of the parts whose text columns were checked in this process (_check_strings)
_STRINGS_OK: set = set()


def _check_strings(f: Path) -> None:
    """The footer of a part, and every value of its text columns decoded and checked (UTF-8): a flipped byte in a
    string parses, and only fails whoever turns it into Python text. The tensor columns are left to the readers
    (they are the bulk of the bytes, and hashed where they are used). Once per part and process."""
    meta, sch = _part_footer(f)
    key = (str(f), *_PART_FOOTERS[str(f)][0])
    if key in _STRINGS_OK:
        return
    text = [fl.name for fl in sch if pa.types.is_string(fl.type) or pa.types.is_large_string(fl.type)]
    if text:
        with pa.OSFile(str(f)) as fh:
            pq.ParquetFile(fh, metadata=meta).read(columns=text).validate(full=True)
    _STRINGS_OK.add(key)


class NotAPart(ValueError):
    """A part's name on something that is no regular file (a FIFO, a device, a folder): never opened."""


def _part_schema(f: Path) -> pa.Schema:
    return _part_footer(f)[1]


def _all_current(files: list[Path]) -> bool:
    """Whether every part is of this schema version (only then is one dataset read exact)."""
    for f in files:
        try:
            if _part_version(_part_schema(f)) != SCHEMA_VERSION:
                return False
        except Exception:
            return False
    return True


class DecodedTooLarge(ValueError):
    """A Parquet file from elsewhere decoded past the bytes its reader allowed (read_bounded)."""


def read_bounded(source, limit: int, batch: int = 256) -> "pa.Table":
    """The whole Parquet file `source` (a path, a file object or a ParquetFile), decoded a batch of rows at a time
    and stopped (DecodedTooLarge) once the decoded rows pass `limit` bytes: a small file of repeated, dictionary
    encoded or well-compressed values is never decoded whole. What its footer declares is not trusted for this (a
    dictionary-encoded column's declared size is its dictionary's). Every value is checked (Table.validate(full=True):
    UTF-8 of the string columns included), so a damaged file fails here, not in whoever reads the rows later."""
    pf = source if isinstance(source, pq.ParquetFile) else pq.ParquetFile(source)
    got, size = [], 0
    for b in pf.iter_batches(batch_size=batch):
        size += b.nbytes
        if size > limit:
            raise DecodedTooLarge(f"decodes to more than {limit} bytes")
        got.append(b)
    table = pa.Table.from_batches(got, schema=pf.schema_arrow)
    table.validate(full=True)   # every value decoded: a flipped byte in a string column is invalid UTF-8 here, not later
    return table
