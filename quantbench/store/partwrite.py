"""Writing a table: one new content-addressed Parquet part per append, atomically.

Appending writes one new part (temporary file, then rename), named by the SHA-256 of its
rows, so writing the same rows twice is a no-op, runs on different machines merge by
copying parts, and a crash loses at most the part being written. A table's ledger
(``<table>/.ledger/``) remembers which part holds which rows, so rows stored before are
not serialised again.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from quantbench import SCHEMA_VERSION
from quantbench.store import lazy
from quantbench.store.resultpaths import TABLES_DIR, check_confined
from quantbench.errors import DiskFull
from quantbench.fsutil import atomic_path, content_key
from quantbench.store import arrowrows, tableschema

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
else:  # pyarrow loads on first use: importing this module (every command's does) stays cheap
    pa, pc, pq = lazy.module("pyarrow"), lazy.module("pyarrow.compute"), lazy.module("pyarrow.parquet")


class _Hasher:
    """A write-only file that hashes what is written (the part name's input)."""

    def __init__(self):
        import hashlib

        self.h = hashlib.sha256()
        self.closed = False

    def write(self, b):
        self.h.update(b)
        return len(b)

    def flush(self):
        pass

    def close(self):
        self.closed = True


def serialize(chunks: Iterable[pa.Table], name_hash=None, row_group_rows: int | None = None) -> bytes | None:
    """Parquet bytes of the chunks, one row group each (or of at most `row_group_rows`); same chunks, same bytes.

    Binary columns hold tensors: float data that compresses little, where LZ4 takes
    about a third of zstd's time. Dictionary encoding is for repeated values; on
    unique tensors it would cost a hash of every byte and save nothing.
    """
    buf, w = io.BytesIO(), None
    for chunk in chunks:
        if not chunk.num_rows:
            continue
        if w is None:
            sch = chunk.schema
            plain = {f.name for f in sch if pa.types.is_large_binary(f.type) or pa.types.is_binary(f.type)}
            # Min/max statistics on every column but the tensors: a filtered read (host, variant,
            # fixture, fingerprint...) skips row groups, and compacted parts are sorted so it can.
            w = pq.ParquetWriter(buf, sch, compression={c: ("lz4" if c in plain else "zstd") for c in sch.names},
                                 write_statistics=[c for c in sch.names if c not in plain],
                                 use_dictionary=[c for c in sch.names if c not in plain])
        w.write_table(chunk, row_group_size=row_group_rows)
        if name_hash is not None:  # the rows without their timestamps: same rows, same part name
            body = chunk.drop_columns([c for c in ("created_at",) if c in chunk.column_names])
            if name_hash.get("w") is None:
                name_hash["w"] = pa.ipc.new_stream(name_hash["sink"], body.schema)
            name_hash["w"].write_table(body)
    if w is None:
        return None
    if name_hash is not None:
        name_hash["w"].close()
    w.close()
    return buf.getvalue()


def append(name: str, rows: Iterable[Mapping] | pa.Table, root: str | os.PathLike = TABLES_DIR,
           ledger: bool = False, made_from: str | None = None) -> Path | None:
    """Write rows as one new content-addressed part; returns its path (None if no rows).

    `ledger=True` (rows given as dicts): rows stored before are not serialised again. The
    table's ledger (``<table>/.ledger/<digest of the rows>``, naming the part that holds
    them) is checked first; a hit whose part is still there returns that part.
    `made_from`: the content key of what the rows are computed from (same key, same rows);
    the ledger is then keyed by it, and rows already stored are neither hashed nor even
    looked at (a lazy sequence of rows is not built).
    """
    digest = None
    if ledger and not isinstance(rows, pa.Table):
        if made_from is not None:
            digest = content_key({"table": name, "schema": SCHEMA_VERSION, "made_from": made_from})
            hit = _ledger_get(name, root, digest)
            if hit is not None:
                return hit
        rows = list(rows)
        if not rows:
            return None
        if digest is None:
            digest = rows_digest(name, rows)
            hit = _ledger_get(name, root, digest)
            if hit is not None:
                return hit
    path = append_chunks(name, [rows], root)
    if digest is not None and path is not None:
        _ledger_put(name, root, digest, path.name)
    return path


def append_chunks(name: str, chunks: Iterable, root: str | os.PathLike = TABLES_DIR) -> Path | None:
    """Like append, from chunks (Arrow tables or lists of rows) written one row group each.

    For large tensor columns: each chunk is built, compressed and dropped in turn, so
    the whole column never sits in memory uncompressed (first-touch page faults on
    hundreds of MB cost seconds on a small VM).
    """
    nh = {"sink": _Hasher(), "w": None}
    data = serialize((arrowrows.to_arrow(name, c) for c in chunks), nh)
    if data is None:
        return None
    # named by the rows without created_at, so writing the same rows again is a no-op and the
    # first writing's timestamps stay
    path = Path(root) / name / f"part-{nh['sink'].h.hexdigest()[:32]}.parquet"
    check_confined(root)
    check_confined(path.parent)
    if not path.exists():
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)
    return path


def rows_digest(name: str, rows: Sequence[Mapping]) -> str:
    """SHA-256 of the table name, schema version and the rows' values in schema order.

    Each column's values are pickled without the memo (``fast``): exact like repr (floats
    by their bits, True apart from 1) and independent of which equal objects are shared,
    at a fifth of repr's cost on a large equiv's decisions.
    """
    import hashlib
    import pickle

    cols = [c for c, _, _ in tableschema.COLUMNS[name]]
    h = hashlib.sha256(f"{name}|{SCHEMA_VERSION}|{cols}|{len(rows)}|pickle5|".encode())
    for c in cols:  # column by column: one list per column is much cheaper than one per row
        buf = io.BytesIO()
        p = pickle.Pickler(buf, protocol=5)
        p.fast = True
        p.dump([r.get(c) for r in rows])
        h.update(buf.getbuffer())
        h.update(b"\n")
    return h.hexdigest()


def _ledger_dir(name: str, root) -> Path:
    return Path(root) / name / ".ledger"


def _ledger_get(name: str, root, digest: str) -> Path | None:
    try:
        part = (_ledger_dir(name, root) / digest).read_text().strip()
    except OSError:
        return None
    path = Path(root) / name / part
    return path if part.startswith("part-") and path.exists() else None


def _ledger_put(name: str, root, digest: str, part: str) -> None:
    try:
        with atomic_path(_ledger_dir(name, root) / digest) as tmp:
            tmp.write_text(part + "\n")
    except (OSError, DiskFull):
        pass  # the ledger only saves work


def ledger_move(name: str, root, old: set, new: str) -> None:
    d = _ledger_dir(name, root)
    if not old or not d.is_dir():
        return
    for entry in d.iterdir():
        if entry.name.startswith("."):
            continue
        try:
            if entry.read_text().strip() in old:
                _ledger_put(name, root, entry.name, new)
        except OSError:
            pass
