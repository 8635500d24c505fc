"""Rows (Python dicts) to Arrow tables of exactly the declared schema: the derived typed columns, the run
scope's run_id and created_at filled in, and the values laid into Arrow buffers without pandas.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
from typing import TYPE_CHECKING, Iterable, Mapping

from quantbench.store import lazy
from quantbench.fsutil import content_key
from quantbench.store import tableschema

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
else:  # pyarrow loads on first use: importing this module (every command's does) stays cheap
    pa, pc, pq = lazy.module("pyarrow"), lazy.module("pyarrow.compute"), lazy.module("pyarrow.parquet")


# --- derived (typed) columns: computed from the JSON column they mirror when a writer leaves them out

def _json(text):
    import json

    try:
        return json.loads(text) if isinstance(text, str) and text else {}
    except ValueError:
        return {}


def _objects(row):
    anns = _json(row.get("labels")) if isinstance(row.get("labels"), str) else []
    out = []
    for a in anns if isinstance(anns, list) else []:
        if not isinstance(a, dict):
            continue
        cid = a.get("category_id")
        bbox = a.get("bbox")
        out.append({"category_id": cid if isinstance(cid, int) and not isinstance(cid, bool) else None,
                    "bbox": [float(v) for v in bbox] if isinstance(bbox, list) and all(
                        isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox) else None})
    return {"objects": out}


def _preprocess_id(row):
    p = row.get("preprocess")
    return {"preprocess_id": content_key(_json(p)) if p is not None else None}


def _recipe_cols(row):
    r = _json(row.get("recipe"))
    opts = r.get("calibration_options") if isinstance(r.get("calibration_options"), dict) else {}
    calib = r.get("calibration_set") if isinstance(r.get("calibration_set"), dict) else {}

    def typed(v, t):
        return v if isinstance(v, t) and not (t is not bool and isinstance(v, bool)) else None
    return {"method": typed(r.get("method"), str), "activation_type": typed(r.get("activation_type"), str),
            "weight_type": typed(r.get("weight_type"), str), "per_channel": typed(r.get("per_channel"), bool),
            "reduce_range": typed(r.get("reduce_range"), bool),
            "percentile": float(opts["percentile"]) if isinstance(opts.get("percentile"), (int, float)) else None,
            "entropy_bins": typed(opts.get("entropy_bins"), int), "calibration_set": typed(calib.get("name"), str)}


def _fingerprint_cols(row):
    ident = _json(row.get("fingerprint")).get("identity") or {}
    ident = ident if isinstance(ident, dict) else {}
    prov = ident.get("resolved_providers")
    s = lambda k: ident.get(k) if isinstance(ident.get(k), str) else None  # noqa: E731
    return {"os": s("os"), "libc": s("libc"), "python_version": s("python"), "numpy_version": s("numpy"),
            "resolved_providers": [p for p in prov if isinstance(p, str)] if isinstance(prov, list) else None,
            "does_not_start": s("does_not_start")}


# table -> [(derived columns, source columns, function row -> {column: value})]
DERIVED = {
    # a fixture written before the geometry was recorded (or from a preprocessing plug-in): its geometry unknown
    "fixtures": [(("objects",), ("labels",), _objects), (("preprocess_id",), ("preprocess",), _preprocess_id),
                 (("geometry",), ("preprocess",), lambda r: {"geometry": None})],
    # a part written before variant_id named a session requirement: its variant_id was the semantic hash
    "models": [(("semantic_sha256",), ("variant_id",), lambda r: {"semantic_sha256": r.get("variant_id")}),
               (("method", "activation_type", "weight_type", "per_channel", "reduce_range", "percentile",
                 "entropy_bins", "calibration_set"), ("recipe",), _recipe_cols)],
    "hosts": [(("os", "libc", "python_version", "numpy_version", "resolved_providers", "does_not_start"),
               ("fingerprint",),
               _fingerprint_cols)],
    # a part written before equiv --confirm: every row measured on its host
    "outputs": [(("inherited",), ("host",), lambda r: {"inherited": None})],
    "classes": [(("inherited_hosts",), ("hosts",), lambda r: {"inherited_hosts": None})],
}


_RUN_ID = None


@contextlib.contextmanager
def run_scope(run_id: str | None):
    """Rows written inside get this run_id (when their writer sets none)."""
    global _RUN_ID
    old, _RUN_ID = _RUN_ID, run_id
    try:
        yield run_id
    finally:
        _RUN_ID = old


def run_id_of(**parts) -> str:
    """A run's id: SHA-256 of what determines its rows (never a time)."""
    return content_key(parts)


def _now():
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


def complete_columns(name: str, table: pa.Table) -> pa.Table:
    """Add the derived, run_id and created_at columns a table lacks (computed, the run scope's, now)."""
    have = set(table.column_names)
    for cols, sources, fn in DERIVED.get(name, []):
        if all(c in have for c in cols) or not all(c in have for c in sources):
            continue
        src = table.select(list(sources)).to_pylist()
        vals = [fn(r) for r in src]
        for c in cols:
            if c not in have:
                table = table.append_column(c, arrow_array([v[c] for v in vals], tableschema.schema(name).field(c).type))
    n = table.num_rows
    if name == "calib_manifest":
        return table
    if "run_id" not in have:
        table = table.append_column("run_id", arrow_array([_RUN_ID] * n, tableschema.STRING.arrow))
    if "created_at" not in have:
        table = table.append_column("created_at", arrow_array([_now()] * n, tableschema.TIMESTAMP.arrow))
    return table


def to_arrow(name: str, rows: Iterable[Mapping] | pa.Table) -> pa.Table:
    """Rows (dicts) or a table -> an Arrow table with exactly the declared schema.

    Derived typed columns (see DERIVED), run_id and created_at are filled when absent.
    """
    sch = tableschema.schema(name)
    if not isinstance(rows, pa.Table):
        rows = list(rows)
        given = {k for r in rows for k, v in r.items() if v is not None} if rows else set()
        cols = {f.name: [r.get(f.name) for r in rows] for f in sch if f.name in given or not rows}
        base = [f for f in sch if f.name in cols]
        rows = pa.Table.from_arrays([arrow_array(cols[f.name], f.type) for f in base], schema=pa.schema(base))
        for f in sch:   # declared columns every row left out (and are not derived): nulls
            if f.name not in rows.column_names and not is_filled(name, f.name):
                rows = rows.append_column(f, pa.nulls(rows.num_rows, f.type))
    rows = complete_columns(name, rows)
    missing = [f.name for f in sch if f.name not in rows.column_names]
    if missing:
        raise ValueError(f"table {name}: missing columns {missing}")
    return rows.select([f.name for f in sch]).cast(sch)


def is_filled(name: str, col: str) -> bool:
    return (col in ("run_id", "created_at") and name != "calib_manifest") or any(col in cols for cols, _, _ in DERIVED.get(name, []))


# --- Python values -> Arrow arrays. pa.array(), Table.from_pydict and from_pylist import pandas (when installed,
# ~0.2 s) on their first call, so the values the tables hold are laid into Arrow buffers here instead.

def arrow_array(vals: list, typ: pa.DataType) -> pa.Array:
    """`vals` as the Arrow array pa.array(vals, type=typ) makes: laid into buffers (_from_buffers) when they are
    the Python values the tables hold, through pa.array otherwise (other types, a value it must refuse)."""
    arr = _from_buffers(vals, typ)
    return pa.array(vals, type=typ) if arr is None else arr


def _kind(typ: pa.DataType) -> str | None:
    t = pa.types
    for kind, test in (("str", t.is_string), ("str64", t.is_large_string), ("bin", t.is_binary),
                       ("bin64", t.is_large_binary), ("int", t.is_int64), ("float", t.is_float64),
                       ("bool", t.is_boolean), ("list", t.is_list), ("struct", t.is_struct)):
        if test(typ):
            return kind
    return "ts" if t.is_timestamp(typ) and typ.unit == "us" and typ.tz is not None else None


def _py_types(kind: str) -> set:
    """The Python types a column of `kind` lays out itself (exact types: a subclass goes through pa.array)."""
    from datetime import datetime

    return {"bin": {bytes}, "bin64": {bytes}, "int": {int}, "float": {float, int}, "bool": {bool}, "list": {list},
            "struct": {dict}, "ts": {datetime}}[kind] | {type(None)}


def _from_buffers(vals: list, typ: pa.DataType) -> pa.Array | None:
    """pa.array(vals, type=typ) built from buffers, or None for a type or value it leaves to pa.array."""
    kind = _kind(typ)
    # strings are checked by str.join (it takes str alone, None aside); every other kind by the values' types
    types = None if kind in (None, "str", "str64") else set(map(type, vals))
    if kind is None or (types is not None and not types <= _py_types(kind)):
        return None
    nulls = vals.count(None) if types is None or type(None) in types else 0
    validity = _validity(vals) if nulls else None
    if kind == "list":
        filled = _filled(vals, nulls, ())
        child = _from_buffers(list(itertools.chain.from_iterable(filled)), typ.value_type)
        offsets = _offsets(_lengths(filled), "int32")
        if child is None or offsets is None:
            return None
        return pa.Array.from_buffers(typ, len(vals), [validity, offsets], null_count=nulls, children=[child])
    if kind == "struct":
        children = [_from_buffers([None if v is None else v.get(f.name) for v in vals], f.type) for f in typ]
        if any(c is None for c in children):
            return None
        return pa.Array.from_buffers(typ, len(vals), [validity], null_count=nulls, children=children)
    data = _data(kind, _filled(vals, nulls, b"" if kind.startswith("bin") else "" if kind.startswith("str") else 0))
    return None if data is None else pa.Array.from_buffers(typ, len(vals), [validity, *data], null_count=nulls)


def _filled(vals: list, nulls: int, fill) -> list:
    """`vals` with each None replaced by `fill` (the value laid under a null slot)."""
    return [fill if v is None else v for v in vals] if nulls else vals


def _validity(vals: list):
    """The validity bitmap of `vals`."""
    import numpy as np

    valid = np.fromiter(map(operator.is_not, vals, itertools.repeat(None)), dtype=bool, count=len(vals))
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _lengths(values) -> "np.ndarray":
    import numpy as np

    return np.fromiter(map(len, values), dtype=np.int64, count=len(values))


def _offsets(lengths, dtype: str):
    """The offsets buffer of values of these lengths, or None when they overflow `dtype`."""
    import numpy as np

    ends = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=ends[1:])
    if ends[-1] > np.iinfo(dtype).max:
        return None
    return pa.py_buffer(ends.astype(dtype))


def _data(kind: str, vals: list) -> list | None:
    """The buffers after the validity bitmap of a flat column of `kind` (no None left in `vals`), or None for a value
    it leaves to pa.array: an int out of range, one a float64 cannot hold exactly, a value of a string column that
    is no str or not UTF-8, a naive time."""
    import numpy as np

    if kind in ("str", "str64", "bin", "bin64"):
        data, lengths = _utf8(vals) if kind.startswith("str") else (b"".join(vals), _lengths(vals))
        offsets = None if data is None else _offsets(lengths, "int32" if kind in ("str", "bin") else "int64")
        return None if offsets is None else [offsets, pa.py_buffer(data)]
    if kind == "bool":
        return [pa.py_buffer(np.packbits(np.array(vals, dtype=bool), bitorder="little"))]
    if kind == "ts":
        vals, kind = _microseconds(vals), "int"
        if vals is None:
            return None
    if kind == "float" and int in set(map(type, vals)) and not all(
            -(1 << 53) <= v <= (1 << 53) for v in vals if type(v) is int):
        return None
    try:
        return [pa.py_buffer(np.array(vals, dtype=np.float64 if kind == "float" else np.int64))]
    except OverflowError:
        return None


def _utf8(strings: list) -> tuple:
    """(the UTF-8 bytes of `strings` joined, each one's byte length), or (None, None): a value that is no str, or
    a str that is not UTF-8."""
    try:
        joined = "".join(strings).encode()
    except (TypeError, UnicodeEncodeError):
        return None, None
    lengths = _lengths(strings)
    if int(lengths.sum()) != len(joined):  # not ASCII: a character may take several bytes
        lengths = _lengths([v.encode() for v in strings])
    return joined, lengths


def _microseconds(times: list) -> list | None:
    """Each time (0: a null's slot) as microseconds since the epoch (UTC), or None for a naive one."""
    from datetime import datetime, timedelta, timezone

    epoch, us = datetime(1970, 1, 1, tzinfo=timezone.utc), timedelta(microseconds=1)
    distinct = {t: t if t == 0 else None if t.utcoffset() is None else (t - epoch) // us for t in set(times)}
    return None if None in distinct.values() else [distinct[t] for t in times]
