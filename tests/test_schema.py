"""docs/schema.md documents every Parquet table, and what quantbench writes matches it.

The reading half of this test uses pyarrow alone (no quantbench import): the
tables are produced by a subprocess running quantbench, the documented columns
are parsed from docs/schema.md, and each table is read with pyarrow.parquet.
"""

import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_DOC = ROOT / "docs" / "schema.md"

# Runs in a subprocess: writes one row per declared table through quantbench's own writer.
_WRITE_EVERY_TABLE = r"""
import sys
import pyarrow as pa
from quantbench.store import partwrite, tableschema

def sample(t):
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [sample(t.value_type)]
    if pa.types.is_struct(t):
        return {t.field(i).name: sample(t.field(i).type) for i in range(t.num_fields)}
    if pa.types.is_timestamp(t):
        import datetime
        return datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "x"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return b"\x00\x01"
    if pa.types.is_boolean(t):
        return True
    if pa.types.is_integer(t):
        return 1
    if pa.types.is_floating(t):
        return 0.5
    raise SystemExit(f"no sample value for arrow type {t}")

for name, cols in tableschema.COLUMNS.items():
    partwrite.append(name, [{c: sample(t.arrow) for c, t, _ in cols}], root=sys.argv[1])
print(",".join(tableschema.COLUMNS))
"""


def _type(t: str) -> str:
    """Arrow type text without list child names (Parquet reads `list<item: T>` back as `list<element: T>`)."""
    return re.sub(r"list<\w+: ", "list<", t.strip("`")).replace("struct<", "struct<")


def readme_schema(text: str):
    """{table: [(column, type)]} and the schema version, parsed from the schema section of docs/schema.md."""
    section = text.split("<!-- section:schema -->", 1)[1].split("<!-- /section:schema -->", 1)[0]
    version = re.search(r"Schema version (\d+)", section)
    assert version, "docs/schema.md states no schema version"
    documented, keys, current = {}, {}, None
    for line in section.splitlines():
        m = re.match(r"### `([\w-]+)` \(key: ([^)]*)\)", line)
        if m:
            current = documented.setdefault(m.group(1), [])
            keys[m.group(1)] = [k.strip() for k in m.group(2).split(",")]
            continue
        m = re.match(r"\| `([^`]+)` \| ([^|]+) \| (.*) \|$", line)
        if m and current is not None:
            assert m.group(3).strip(), f"column {m.group(1)} has no meaning documented"
            current.append((m.group(1), _type(m.group(2).strip())))
    for name, key in keys.items():
        assert key and set(key) <= {c for c, _ in documented[name]}, f"{name}: key {key} not among its columns"
    assert set(keys) == set(documented)
    return documented, version.group(1)


def test_schema_doc_is_up_to_date():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "update_schema_doc.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_table_reads_with_pyarrow_alone_and_matches_the_schema_doc(tmp_path):
    out = subprocess.run([sys.executable, "-c", _WRITE_EVERY_TABLE, str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    written = out.stdout.strip().split(",")
    documented, version = readme_schema(SCHEMA_DOC.read_text(encoding="utf-8"))
    assert sorted(written) == sorted(documented), "tables written by quantbench and tables in docs/schema.md differ"
    for name, cols in documented.items():
        files = sorted((tmp_path / name).glob("part-*.parquet"))
        assert len(files) == 1, name
        table = pq.read_table(files[0])
        assert [(f.name, _type(str(f.type))) for f in table.schema] == cols, name
        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
        assert meta.get("quantbench.schema_version") == version, name
        assert meta.get("quantbench.table") == name
        assert table.num_rows == 1
