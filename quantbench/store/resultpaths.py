"""The results folder's default place and layout (relative to the current directory, as the README documents):

  results/variants/<model>/                   quantized variants + recipes (quantbench.inputs.variantdir)
  results/tables/<table>/part-*.parquet       result tables (quantbench.store)
  results/report.md, report.d/, plots/        the report (quantbench.report)
  results/bench/*.json
"""

from __future__ import annotations

import os
from pathlib import Path

from quantbench.errors import UserError, flag_mark

RESULTS_DIR = Path("results")
TABLES_DIR = RESULTS_DIR / "tables"
VARIANTS_DIR = RESULTS_DIR / "variants"


def check_confined(folder: str | os.PathLike) -> Path:
    """`folder` (a folder of the results folder: its tables, a table, its releases), refused when it is a symbolic
    link out of the folder holding it: a repository shipping `results/tables -> /somewhere` would have every write
    follow the link. A link inside that folder, or no link, passes; nothing is created."""
    folder = Path(folder)
    if folder.is_symlink():
        target, base = folder.resolve(), folder.parent.resolve()
        if target != base and base not in target.parents:
            raise UserError(f"{folder}: is a symbolic link out of {folder.parent} (to {target}); quantbench writes "
                            f"only inside the results folder: remove the link, or name the folder to write in with "
                            f"{flag_mark('results')}")
    return folder
