"""Rows (dicts of Python values) become Arrow tables without pandas.

pyarrow imports pandas (when installed, ~0.2 s) the first time it converts Python values (pa.array,
Table.from_pydict, from_pylist); tables.to_arrow lays the values of the declared column types into
Arrow buffers itself. The arrays must be the ones pyarrow would make, nulls, nesting and the
values it converts on its own (numpy scalars, tuples) included.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pytest

from quantbench.store import arrowrows

_RECIPE = json.dumps({"method": "percentile", "activation_type": "QUInt8", "weight_type": "QInt8",
                      "per_channel": True, "reduce_range": False,
                      "calibration_options": {"percentile": 99, "entropy_bins": 128},
                      "calibration_set": {"name": "set-é"}})
_FINGERPRINT = json.dumps({"identity": {"os": "Linux", "libc": None, "python": "3.11", "numpy": "2.1",
                                        "resolved_providers": ["CPUExecutionProvider", 3]}})

ROWS = {
    "models": [
        {"variant_id": "v1", "raw_sha256": "r1", "model": "m", "variant": "static-percentile", "path": "/p/ü.onnx",
         "recipe": _RECIPE},
        {"variant_id": "v2", "raw_sha256": None, "model": "m", "variant": "fp32", "path": "", "recipe": "{}"},
        {"variant_id": "v3", "raw_sha256": "r3", "model": "m", "variant": "x", "path": "p",
         "recipe": json.dumps({"per_channel": 1, "calibration_options": {"percentile": 2 ** 60}})},
    ],
    "hosts": [
        {"fingerprint_id": "f1", "host": "x86", "kind": "local", "arch": "x86_64", "cpu": "AMD",
         "isa_flags": ["avx2", "fma"], "ort_version": "1.20", "fingerprint": _FINGERPRINT},
        {"fingerprint_id": "f2", "host": "pi", "kind": "emulated", "arch": None, "cpu": "", "isa_flags": [],
         "ort_version": "1.19", "fingerprint": "not json"},
        {"fingerprint_id": "f3", "host": "pi4", "kind": "emulated", "isa_flags": None, "fingerprint": "{}"},
    ],
    "fixtures": [
        {"fixture_id": "a", "input_name": "x", "dtype": "<f4", "shape": [1, 3, 8, 8], "source": "s.png",
         "image_sha256": "i", "stratum": "objects", "split": "eval", "preprocess": '{"a": 1}', "tensor": b"\0\1",
         "labels": json.dumps([{"category_id": 1, "bbox": [0, 1.5, 2, 3]}, {"category_id": True, "bbox": None},
                               {"category_id": 2}, "junk", {"bbox": [1, "x"]}])},
        {"fixture_id": "b", "input_name": "x", "dtype": "<f4", "shape": [], "source": "t.png", "image_sha256": "j",
         "labels": "[]", "stratum": "empty", "split": "eval", "preprocess": None, "tensor": b""},
        {"fixture_id": "c", "input_name": "x", "dtype": "<u1", "shape": [2, 3], "source": None,
         "image_sha256": "k", "labels": None, "stratum": "", "split": "train", "preprocess": "{}", "tensor": None},
    ],
    "outputs": [
        {"run_key": f"rk{i}", "host": "x86", "fingerprint_id": "f1", "session_key": "s", "session_options": "{}",
         "variant_id": "v1", "variant": "fp32", "fixture_id": "a", "output_name": "y", "dtype": "<f4",
         "shape": [i, 4] if i % 3 else None, "sha256": f"h{i}", "tensor": bytes(range(i)) if i % 4 else None,
         "providers": ["CPUExecutionProvider"] if i % 2 else [], "placement": None if i == 5 else "{}"}
        for i in range(9)
    ],
    "calib_manifest": [
        {"path": "a.png", "sha256": "s", "split": "train", "objects": 3, "density": "objects", "luminance": 12.5},
        {"path": "b.png", "sha256": "t", "split": "val", "objects": 0, "density": "empty",
         "luminance": 7},
        {"path": "c.png", "sha256": None, "split": None, "objects": None, "density": None, "luminance": None},
    ],
}


def _py_arrays(monkeypatch) -> None:
    """Every column through pa.array, as before buffers were laid by hand: the reference."""
    monkeypatch.setattr(arrowrows, "_from_buffers", lambda vals, typ: None)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_rows_become_the_arrays_pyarrow_makes(name, monkeypatch):
    with arrowrows.run_scope("run-1" if name != "hosts" else None):
        got = arrowrows.to_arrow(name, ROWS[name])
        _py_arrays(monkeypatch)
        want = arrowrows.to_arrow(name, ROWS[name])
    keep = [c for c in want.column_names if c != "created_at"]
    assert got.schema == want.schema
    assert got.select(keep).equals(want.select(keep)), name
    if "created_at" in want.column_names:
        assert got.column("created_at").null_count == 0


@pytest.mark.parametrize("typ, vals", [
    (pa.int64(), [1, None, -2 ** 63, 2 ** 63 - 1, np.int32(4)]),
    (pa.float64(), [1, 2.5, None, float("nan"), 2 ** 53, -(2 ** 53)]),
    (pa.bool_(), [True, None, False, np.bool_(True)] * 3),
    (pa.string(), ["", None, "é" * 3, "\U0001f600", b"bytes too"]),
    (pa.large_binary(), [b"", None, b"\xff" * 9, bytearray(b"ab"), "text too"]),
    (pa.timestamp("us", tz="UTC"), [datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=timezone.utc), None,
                                    datetime(1969, 12, 31, 23, 0, 0, 1, tzinfo=timezone(timedelta(hours=-5)))]),
    (pa.list_(pa.string()), [["a", None], [], None, ("t",)]),
    (pa.list_(pa.int64()), [[1, 2], [1.5]]),
    (pa.list_(pa.struct([("category_id", pa.int64()), ("bbox", pa.list_(pa.float64()))])),
     [[{"category_id": 1, "bbox": [1.0, 2]}, {"bbox": None}, None, {"category_id": None, "extra": 1}], [], None]),
])
def test_each_column_type_is_the_array_pyarrow_makes(typ, vals):
    for some in (vals, [], [None, None]):
        got, want = arrowrows.arrow_array(some, typ), pa.array(some, type=typ)
        assert got.validate(full=True) is None and got.type == want.type and got.null_count == want.null_count
        assert repr(got.to_pylist()) == repr(want.to_pylist())   # repr: nan equals nan


@pytest.mark.parametrize("typ, vals", [
    (pa.int64(), [2 ** 63]), (pa.int64(), [True]), (pa.float64(), [2 ** 53 + 1]), (pa.bool_(), [1]),
    (pa.string(), ["\ud800"]), (pa.list_(pa.int64()), [[2 ** 64]]), (pa.large_binary(), [1]),
])
def test_a_value_pyarrow_refuses_is_refused_the_same_way(typ, vals):
    with pytest.raises(Exception) as want:
        pa.array(vals, type=typ)
    with pytest.raises(type(want.value)) as got:
        arrowrows.arrow_array(vals, typ)
    assert str(got.value) == str(want.value)


def test_writing_and_reading_tables_loads_no_pandas(tmp_path):
    """Appending rows of every table and reading them back, and reading a table with no parts yet, leave
    pandas unloaded (a subprocess: this one may have loaded it already)."""
    import pickle

    (tmp_path / "rows.pickle").write_bytes(pickle.dumps(ROWS))
    code = ("import pickle, sys\nfrom pathlib import Path\nROWS = pickle.loads(Path(sys.argv[1]).read_bytes())\n"
            "from quantbench.store import partread, partwrite\n"
            "for name, rows in ROWS.items():\n"
            "    partwrite.append(name, rows, root=sys.argv[2])\n"
            "    assert partread.read(name, root=sys.argv[2]).num_rows == len(rows), name\n"
            "assert partread.read('evidence', root=sys.argv[2], columns=['host']).num_rows == 0\n"
            "print('pandas' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "rows.pickle"), str(tmp_path / "t")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["False"]


def test_equiv_on_the_demo_loads_no_pandas_fresh_or_cached(workdir):
    """pyarrow imports pandas (~0.2 s) the first time it converts Python values (pa.array, Table.from_pylist); the
    tables lay every value they write into Arrow buffers and read an empty table without one (arrowrows.arrow_array), so
    neither a fresh equiv on the demo nor the cached one after it loads pandas (each its own process)."""
    import subprocess
    import sys

    from quantbench.cli import main

    vdir = workdir / "variants"
    assert main(["calibrate", "--out", str(vdir), "--methods", "dynamic", "--no-progress", "-q"]) == 0
    code = "import sys\nfrom quantbench.cli import main\nrc = main(sys.argv[1:])\nprint(rc, 'pandas' in sys.modules)"
    argv = ["equiv", "--hosts", "x86", "--variants", str(vdir), "--results", str(workdir / "r"), "--no-progress"]
    for run in ("fresh", "cached"):
        p = subprocess.run([sys.executable, "-c", code, *argv], cwd=workdir, capture_output=True, text=True)
        assert p.stdout.split()[-2:] == ["0", "False"], (run, p.stdout[-300:], p.stderr[-2000:])
        assert ("runs: x86 0 ran," in p.stdout) == (run == "cached"), p.stdout[:300]
