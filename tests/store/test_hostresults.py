"""Host results read back: the outputs filtered by host and variant, hashes without tensors, and a fixture's arrays
decoded from the stored bytes to the tensors that were written."""

import numpy as np

from quantbench.store import hostresults, partwrite
from store_helpers import outputs_rows


def test_outputs_read_back_filtered_with_or_without_tensors_and_as_arrays(tmp_path):
    root = tmp_path / "t"
    batches = outputs_rows(4, 6)
    for rows in batches:
        partwrite.append("outputs", rows, root=root)
    written = [r for rows in batches for r in rows]
    pi = hostresults.load_outputs(host="pi", variant_id="v0", tensors=False, tables_root=root)
    want = sorted(r["sha256"] for r in written if r["host"] == "pi" and r["variant_id"] == "v0")
    assert want and sorted(pi.column("sha256").to_pylist()) == want and "tensor" not in pi.column_names
    row = written[7]
    got = hostresults.arrays(row["host"], row["variant_id"], row["fixture_id"], tables_root=root)
    assert np.array_equal(got["y"], np.frombuffer(row["tensor"], "<f4").reshape(row["shape"]))
