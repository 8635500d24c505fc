"""quantbench's Python API, below the command line and on the same option groups (options.py): calibrate.py,
run.py, equiv.py, search.py, the explain commands' localize.py, lint.py, remedy.py, noise.py and latency.py
(explained.py: what they share), release.py (release and verify); plan.py turns the groups into a run plan's
inputs. Every default is the command line's; a bad input raises the same quantbench.errors.UserError family;
tables come back as pyarrow Tables (`.to_pandas()` where pandas is installed). quantbench/__init__.py re-exports
the functions."""
