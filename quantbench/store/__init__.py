"""The results folder on disk: the result tables (one schema version, content-addressed Parquet parts: written,
locked, read, compacted), the results read back as arrays, and the folder's layout.

Each table is a folder of Parquet files, ``results/tables/<table>/part-<sha>.parquet``, read together as one
Arrow table; readers de-duplicate on the table's key columns. Nothing here knows a model, a host or an analysis.
"""
