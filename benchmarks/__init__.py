"""Benchmarks: run as ``python -m benchmarks.NAME``; they print medians and ratios from one run."""
