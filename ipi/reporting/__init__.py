"""Reports for people: results.md/report.html helpers, plots, the variant gallery, the sweep report and W&B tracking."""
