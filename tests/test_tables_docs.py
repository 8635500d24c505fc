"""The DuckDB and pandas queries in docs/tables.md run against tables quantbench wrote,
and stale fixtures of another preprocessing are told apart by recipe."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from quantbench.store import arrowrows, partread, partwrite

DOC = Path(__file__).resolve().parent.parent / "docs" / "tables.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def _decision(host, source, flip, variant="static-minmax", slot=0):
    return {"equiv_id": "e" * 64, "host": host, "fingerprint_id": host * 3, "variant_id": variant * 2,
            "variant": variant, "fixture_id": source * 4, "source": source, "slot": slot, "class_id": 1,
            "class_name": "can", "score": 0.6, "kept": True, "margin": 0.1, "box": [0.0, 0.0, 1.0, 1.0],
            "flip_own_fp32": flip, "flip_ref_fp32": ""}


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "results" / "tables"
    rows = [_decision("pi", "a.png", "class"), _decision("x86", "a.png", ""),          # pi only
            _decision("pi", "b.png", "threshold"), _decision("x86", "b.png", "threshold"),  # both
            _decision("pi", "c.png", ""), _decision("x86", "c.png", "", slot=0),
            _decision("x86", "c.png", "box-shift", slot=1),                               # x86 only
            _decision("pi", "d.png", "class", variant="dynamic"), _decision("x86", "d.png", "", variant="dynamic")]
    partwrite.append("decisions", rows[:4], root=root)
    partwrite.append("decisions", rows[4:], root=root)
    partwrite.append("decisions", rows[:4], root=root)   # the same rows again: same part, nothing written
    return root


def test_duckdb_query_from_the_docs(results):
    duckdb = pytest.importorskip("duckdb")
    sql = blocks("sql")[0]
    got = duckdb.sql(sql).fetchall()
    assert got == [("a.png", True, False), ("c.png", False, True)]


def test_pandas_query_from_the_docs(results, capsys):
    pytest.importorskip("pandas")
    ns: dict = {}
    exec(compile(blocks("python")[0], str(DOC), "exec"), ns)
    differ = ns["differ"]
    assert list(differ.index) == ["a.png", "c.png"]
    assert bool(differ.loc["a.png", "pi"]) and not bool(differ.loc["a.png", "x86"])


def test_created_at_is_utc_and_not_in_the_part_name(results):
    t = partread.read("decisions", root=results)
    assert t.schema.field("created_at").type.tz == "UTC" and t.column("created_at").null_count == 0
    assert len(partread.parts("decisions", root=results)) == 2


def _fixture(source, preprocess, fid):
    return {"fixture_id": fid, "input_name": "images", "dtype": "<f4", "shape": [1], "source": source,
            "image_sha256": "1" * 64, "labels": '[{"bbox":[1,2,3,4],"category_id":2,"image_id":0}]',
            "stratum": "objects", "split": "eval", "preprocess": preprocess, "tensor": b"\0\0\0\0"}


def test_stale_fixtures_of_another_recipe_are_told_apart(tmp_path):
    root = tmp_path / "tables"
    partwrite.append("fixtures", [_fixture("im0.png", '{"scale":0.00392}', "f" * 64)], root=root)   # earlier run
    partwrite.append("fixtures", [_fixture("im0.png", '{"scale":1.0}', "g" * 64)], root=root)       # current
    t = partread.read("fixtures", root=root).to_pylist()
    assert len(t) == 2 and {r["source"] for r in t} == {"im0.png"}
    assert len({r["preprocess_id"] for r in t}) == 2
    assert t[0]["objects"] == [{"category_id": 2, "bbox": [1.0, 2.0, 3.0, 4.0]}]
    import pyarrow.compute as pc

    from quantbench.fsutil import canonical_json, sha256_bytes

    current = sha256_bytes(canonical_json({"scale": 1.0}).encode())
    only = partread.read("fixtures", root=root, filter=pc.field("preprocess_id") == current).to_pylist()
    assert [r["fixture_id"] for r in only] == ["g" * 64]


def test_schema_version_1_parts_still_read_and_newer_ones_are_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from quantbench.errors import UserError

    root = tmp_path / "tables"
    (root / "models").mkdir(parents=True)
    old = pa.table({"variant_id": ["v"], "raw_sha256": ["r"], "model": ["m"], "variant": ["static-minmax"],
                    "path": ["p"], "recipe": ['{"method":"minmax","activation_type":"u8","weight_type":"s8",'
                                              '"per_channel":true,"calibration_set":{"name":"cs"}}']})
    pq.write_table(old.replace_schema_metadata({"quantbench.schema_version": "1", "quantbench.table": "models"}),
                   root / "models" / "part-old.parquet")
    (r,) = partread.read("models", root=root).to_pylist()
    assert (r["method"], r["activation_type"], r["per_channel"], r["calibration_set"]) == ("minmax", "u8", True, "cs")
    assert r["created_at"] is None and r["run_id"] is None
    newer = arrowrows.to_arrow("models", [{"variant_id": "w"}])
    pq.write_table(newer.replace_schema_metadata({"quantbench.schema_version": "99", "quantbench.table": "models"}),
                   root / "models" / "part-new.parquet")
    with pytest.raises(UserError, match="schema version 99, newer"):
        partread.read("models", root=root)
