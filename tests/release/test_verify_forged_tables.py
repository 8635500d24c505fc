"""`quantbench verify` of a release folder whose release.json was forged together with one of its tables (the
table's rows repeated 100,000 times, compressing to a small Parquet file; its recorded SHA-256 and row count
recomputed to match): the table is decoded only up to 64 times its size (and 1 MiB), then FAILs naming it, never
read whole (was: decoded whole, gigabytes for a file of kilobytes, and PASSed)."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq

from quantbench.cli import main
from quantbench.fsutil import MAX_EXPANSION

from release_helpers import release


def test_a_table_forged_with_its_record_fails_before_it_is_decoded_whole(results, capsys):
    assert release(results, "v1") == 0
    capsys.readouterr()
    folder = results / "releases" / "v1"
    rec = json.loads((folder / "release.json").read_text())
    entry = rec["tables"]["outputs"]["files"][0]
    part = folder / entry["path"]
    table = pq.read_table(part)
    pq.write_table(pa.concat_tables([table] * 100_000), part, compression="zstd")
    entry["sha256"] = hashlib.sha256(part.read_bytes()).hexdigest()
    entry["rows"] = table.num_rows * 100_000
    (folder / "release.json").write_text(json.dumps(rec))
    rc = main(["verify", str(folder), "--results", str(results), "--no-registry"])
    out, err = capsys.readouterr()
    assert rc == 1 and "Traceback" not in out + err, err
    (line,) = [ln for ln in out.splitlines() if entry["path"] in ln and ln.startswith("table ")]
    assert " FAIL " in line and (f"decodes to more than {MAX_EXPANSION} times its {part.stat().st_size} bytes "
                                 "(and 1 MiB): forged or damaged") in line, line
