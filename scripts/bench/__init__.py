"""Benchmark harness of scripts/benchmark.py; see benchmarks/README.md."""
