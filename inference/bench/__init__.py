"""Benchmarks of the engine against transformers: `python -m inference.bench --help`."""
