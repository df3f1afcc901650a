"""Reports: terminal tables, JSON, plots, comparisons."""
