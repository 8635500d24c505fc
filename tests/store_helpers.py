"""Shared by the store's tests (tests/store/): rows of the outputs table in several parts."""

import numpy as np


def outputs_rows(n_parts, per_part, seed=0):
    """`n_parts` lists of `per_part` outputs rows (3 hosts, 2 variants, tensors of 4 floats): parts to append."""
    rs = np.random.RandomState(seed)
    out = []
    for p in range(n_parts):
        rows = []
        for i in range(per_part):
            k = p * per_part + i
            t = rs.rand(4).astype("<f4")
            rows.append({"run_key": f"rk{k:05d}", "host": ["pi", "x86", "pi4"][k % 3], "fingerprint_id": f"fp{k % 3}",
                         "session_key": "s", "session_options": "{}", "variant_id": f"v{k % 2}", "variant": "fp32",
                         "fixture_id": f"f{k // 6:04d}", "output_name": "y", "dtype": "<f4", "shape": [4],
                         "sha256": f"h{k}", "tensor": t.tobytes(), "providers": ["CPUExecutionProvider"]})
        out.append(rows)
    return out
