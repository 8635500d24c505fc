"""Compaction keeps every row, key and order (one content-addressed part sorted by the columns reads filter on),
and runs by itself above a threshold of parts."""

from quantbench import fsutil
from quantbench.store import compaction, partread, partwrite
from store_helpers import outputs_rows


def test_compaction_keeps_rows_and_keys(tmp_path, capsys):
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    root = tmp_path / "t"
    batches = outputs_rows(30, 7)
    for rows in batches:
        partwrite.append("outputs", rows, root=root)
    partwrite.append("outputs", batches[3], root=root)  # a duplicate part (same rows): readers keep one copy
    partwrite.append("models", [{"variant_id": "v0", "raw_sha256": "r", "model": "m", "variant": "fp32", "path": "p",
                              "recipe": "{}"}], root=root, ledger=True)
    before = partread.read("outputs", root)
    flt = (pc.field("host") == "pi") & pc.field("variant_id").isin(["v1"])
    sliced = partread.read("outputs", root, filter=flt)
    assert len(partread.parts("outputs", root)) == 30
    from quantbench.cli import main

    assert main(["tables", "--tables", str(root), "compact"]) == 0
    assert "outputs: 30 parts -> 1 (210 rows)" in capsys.readouterr().out
    after_parts = partread.parts("outputs", root)
    assert len(after_parts) == 1
    assert partread.read("outputs", root).equals(before)  # same rows, same keys, same order
    assert partread.read("outputs", root, filter=flt).equals(sliced)
    # sorted by the columns reads filter on, with statistics on them, in several row groups
    meta = pq.ParquetFile(after_parts[0]).metadata
    assert meta.num_row_groups >= 1
    col = meta.schema.to_arrow_schema().get_field_index("host")
    assert meta.row_group(0).column(col).statistics.has_min_max
    hosts = pq.read_table(after_parts[0], columns=["host"]).column("host").to_pylist()
    assert hosts == sorted(hosts)
    # content-addressed: the part is named by its bytes, compacting again changes nothing
    assert after_parts[0].name == f"part-{fsutil.sha256_bytes(after_parts[0].read_bytes())[:32]}.parquet"
    assert compaction.compact("outputs", root)["parts_in"] == 0


def test_automatic_compaction_above_threshold(tmp_path, monkeypatch):
    root = tmp_path / "t"
    batches = outputs_rows(12, 3)
    for rows in batches[:10]:
        partwrite.append("outputs", rows, root=root)
    assert compaction.maybe_compact("outputs", root, threshold=10) is None  # at the threshold: left alone
    partwrite.append("outputs", batches[10], root=root)
    r = compaction.maybe_compact("outputs", root, threshold=10)
    assert r["parts_in"] == 11 and len(partread.parts("outputs", root)) == 1
    monkeypatch.setenv("QUANTBENCH_COMPACT_PARTS", "0")
    partwrite.append("outputs", batches[11], root=root)
    assert compaction.maybe_compact("outputs", root) is None
    assert partread.read("outputs", root).num_rows == 36
