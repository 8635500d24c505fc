"""The report: results/report.md and report.html assembled from per-analysis sections (document.py), the equiv
section (its tables, verdict, accuracy, plots and flip gallery) and the terminal summary `equiv` prints.
"""
