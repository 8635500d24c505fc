"""Run execution: a run's plan, its scheduler and one state per host run, the task loop feeding workers, the
worker pool, a run's result rows, the Dask cluster's host runs and thread placement. It drives the hosts layer's
workers; no host kind knows of it."""
