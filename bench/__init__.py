"""Benchmarks: each prints JSON and compares against a baseline in the same run."""
