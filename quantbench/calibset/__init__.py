"""Calibration sets: balanced by the data's own strata x lighting, disjoint from evaluation.

`builder.build` selects the images; `builder.write` stores
``calib_sets/<name>/manifest.parquet`` and ``recipe.json``; `builder.load`
reads them back (paths of the selected images + the preprocessing spec).
"""
