"""Measurement: records, histograms, summaries and result files."""
