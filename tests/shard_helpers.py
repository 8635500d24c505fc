"""Helpers for the sharded-run tests (tests/hosts/test_shards.py, tests/ci/test_workflow.py): what an equiv wrote,
as rows to compare between a sharded-and-merged run and one machine's run."""

from __future__ import annotations

import json
from pathlib import Path

from quantbench.store import partread

#: columns that may differ between two runs of the same analysis: when and under which run a row was written,
#: and the host's kind (a merged host is `imported`)
VOLATILE = {"run_id", "created_at", "kind"}
ANALYSIS_TABLES = ("classes", "decisions", "flips")


def analysis_rows(results) -> dict:
    """{table: sorted canonical rows} of the classes, decisions and flips tables under results/tables."""
    root = Path(results) / "tables"
    out = {}
    for name in ANALYSIS_TABLES:
        rows = partread.read(name, root=root).to_pylist()
        out[name] = sorted(json.dumps({k: v for k, v in r.items() if k not in VOLATILE}, sort_keys=True, default=str)
                           for r in rows)
    return out


def imported_hosts_toml(name: str, files: list, override: bool = True) -> str:
    """A hosts file line: `name` an imported host of `files`."""
    listed = ", ".join(json.dumps(str(f)) for f in files)
    return f'{name} = {{ kind = "imported", file = [{listed}]{", override = true" if override else ""} }}\n'
