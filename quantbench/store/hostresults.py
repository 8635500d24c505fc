"""Reading host results back: per (host, variant, fixture, output) the SHA-256 and the array.

The analysis stages (equiv, explain, release) read `outputs` only through these
helpers, so the table layout can change in one place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from quantbench.store import lazy
from quantbench.store import partread, tableschema
from quantbench.store.resultpaths import TABLES_DIR
from quantbench.tensorcode import tensor_from_bytes

if TYPE_CHECKING:
    import pyarrow as pa
else:  # pyarrow loads on first use (lazy.py)
    pa = lazy.module("pyarrow")

HASH_COLUMNS = ["host", "fingerprint_id", "session_key", "variant_id", "variant", "fixture_id", "output_name",
                "dtype", "shape", "sha256"]


def _filter(host=None, variant_id=None, fingerprint_id=None, session_key=None, fixture_id=None,
            output_name=None) -> dict:
    """A tables.read filter: {column: value or list of values} for the ones given."""
    given = (("host", host), ("variant_id", variant_id), ("fingerprint_id", fingerprint_id),
             ("session_key", session_key), ("fixture_id", fixture_id), ("output_name", output_name))
    return {col: val for col, val in given if val is not None}


def load_outputs(host=None, variant_id=None, fingerprint_id=None, session_key=None, fixture_id=None,
                 output_name=None, tensors: bool = True, tables_root=TABLES_DIR, columns=None) -> pa.Table:
    """The outputs table, filtered; each filter is a value or a list of values (None: all).

    Columns: run_key, host, fingerprint_id, session_key, session_options, variant_id, variant,
    fixture_id, output_name, dtype, shape, sha256, providers, and `tensor` (raw canonical
    bytes) unless tensors=False (much lighter when only hashes are compared).
    Sorted by (run_key, host, output_name): deterministic. `columns`: only these (overrides `tensors`).
    """
    cols = list(columns) if columns else [c for c, _, _ in tableschema.COLUMNS["outputs"] if tensors or c != "tensor"]
    return partread.read("outputs", root=tables_root, columns=cols,
                       filter=_filter(host, variant_id, fingerprint_id, session_key, fixture_id, output_name))


def tensor_from_row(row: dict) -> np.ndarray:
    """The output array of one outputs row (a dict from Table.to_pylist()): dtype + shape + bytes."""
    if row.get("tensor") is None:
        raise ValueError(f"outputs row {row.get('run_key', '')[:12]}/{row.get('output_name')}: no tensor stored")
    return tensor_from_bytes(row["tensor"], row["dtype"], row["shape"])


def arrays(host: str, variant_id: str, fixture_id: str, session_key=None, tables_root=TABLES_DIR) -> dict:
    """{output_name: np.ndarray} of one (host, variant, fixture)."""
    t = load_outputs(host=host, variant_id=variant_id, fixture_id=fixture_id, session_key=session_key,
                     tables_root=tables_root)
    return {r["output_name"]: tensor_from_row(r) for r in t.to_pylist()}


def load_hosts(host=None, tables_root=TABLES_DIR, columns=None) -> pa.Table:
    """The hosts table (fingerprint per host), optionally for some host name(s) and some columns."""
    return partread.read("hosts", root=tables_root, columns=columns, filter=_filter(host=host))
