"""The report (no torch): plots from the tables and results/report.md gathering them."""
