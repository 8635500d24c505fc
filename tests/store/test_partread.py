"""Reading parts back: a part that vanishes mid-read restarts the read, a {column: values} filter keeps what an
expression keeps, and reads with one load neither pyarrow.dataset nor pandas."""

from quantbench.store import compaction, partread, partwrite, resultpaths
from store_helpers import outputs_rows


def test_read_restarts_when_a_part_vanishes(tmp_path, monkeypatch):
    root = tmp_path / "t"
    for rows in outputs_rows(3, 2):
        partwrite.append("outputs", rows, root=root)
    real = partread.parts
    seen = []

    def parts(name, r=resultpaths.TABLES_DIR):
        got = real(name, r)
        if not seen:  # the first listing names a part that a compaction has just removed
            seen.append(1)
            return got + [got[0].parent / "part-gone.parquet"]
        return got

    monkeypatch.setattr(partread, "parts", parts)
    assert partread.read("outputs", root).num_rows == 6


def test_mapping_filters_read_what_expressions_read(tmp_path, monkeypatch):
    """A {column: values} filter (read part by part, row groups pruned by their statistics) keeps exactly the
    rows an expression filter (one dataset) keeps: on many parts with duplicates, and on compacted parts of
    many row groups, filtering columns that sit after a list column (whose leaves shift the column indices)."""
    import pyarrow.compute as pc

    root = tmp_path / "t"
    batches = outputs_rows(12, 9)
    for rows in batches:
        partwrite.append("outputs", rows, root=root)
    partwrite.append("outputs", [dict(r, sha256="other") for r in batches[2]], root=root)  # same keys, later part
    cases = [({"host": "pi"}, pc.field("host") == "pi"),
             ({"host": ["pi", "pi4"], "variant_id": "v1"},
              pc.field("host").isin(["pi", "pi4"]) & (pc.field("variant_id") == "v1")),
             ({"sha256": ["h7", "h50", "h99", "other"]}, pc.field("sha256").isin(["h7", "h50", "h99", "other"])),
             ({"fixture_id": "f0003", "output_name": "y"}, (pc.field("fixture_id") == "f0003")
              & (pc.field("output_name") == "y")),
             ({"host": "nowhere"}, pc.field("host") == "nowhere")]

    def check():
        for where, expr in cases:
            got = partread.read("outputs", root, filter=where)
            assert got.equals(partread.read("outputs", root, filter=expr)), where
        assert partread.read("outputs", root, filter={}).equals(partread.read("outputs", root))

    check()
    monkeypatch.setitem(compaction.ROW_GROUP_ROWS, "outputs", 8)
    compaction.compact("outputs", root)
    assert partread._part_footer(partread.parts("outputs", root)[0])[0].num_row_groups > 10
    check()
    # fixtures: `objects` (a list of structs) has two leaf columns, so the ones after it shift by one
    for p in range(3):
        partwrite.append("fixtures", [{"fixture_id": f"f{p}{i}", "input_name": "x", "dtype": "<f4", "shape": [1],
                                    "source": f"s{i}", "image_sha256": "i", "labels": "[]",
                                    "objects": [{"category_id": i, "bbox": [0.0, 1.0, 2.0, 3.0]}],
                                    "stratum": f"st{(p * 7 + i) % 5}", "split": ["train", "val", "eval"][i % 3],
                                    "preprocess": "{}",
                                    "tensor": b"\0\0\0\0"} for i in range(6)], root=root)
    monkeypatch.setitem(compaction.ROW_GROUP_ROWS, "fixtures", 2)
    compaction.compact("fixtures", root)
    for col, v in (("stratum", "st0"), ("stratum", ["st1", "st4"]), ("split", "val"), ("split", ["eval", "train"])):
        want = pc.field(col).isin(v if isinstance(v, list) else [v])
        got = partread.read("fixtures", root, filter={col: v})
        assert got.num_rows and got.equals(partread.read("fixtures", root, filter=want)), (col, v)


def test_mapping_filter_read_loads_neither_dataset_nor_pandas(tmp_path):
    import subprocess
    import sys

    root = tmp_path / "t"
    for rows in outputs_rows(6, 4):
        partwrite.append("outputs", rows, root=root)
    code = ("import sys\nfrom quantbench.store import partread\n"
            f"t = partread.read('outputs', {str(root)!r}, columns=['run_key'], filter={{'host': ['pi', 'x86']}})\n"
            "u = partread.read('outputs', " + repr(str(root)) + ")\n"
            "print(t.num_rows, u.num_rows, sorted(m for m in ('pandas', 'pyarrow.dataset', 'pyarrow.acero') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["16", "24", "[]"]
