"""Benchmarks, runnable as modules: ``python -m bench.apply``."""
