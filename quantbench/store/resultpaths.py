"""The results folder's default place and layout (relative to the current directory, as the README documents):

  results/variants/<model>/                   quantized variants + recipes (quantbench.inputs.variantdir)
  results/tables/<table>/part-*.parquet       result tables (quantbench.store)
  results/report.md, report.d/, plots/        the report (quantbench.report)
  results/bench/*.json
"""

from __future__ import annotations

from pathlib import Path

RESULTS_DIR = Path("results")
TABLES_DIR = RESULTS_DIR / "tables"
VARIANTS_DIR = RESULTS_DIR / "variants"
