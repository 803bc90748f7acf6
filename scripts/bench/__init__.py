"""Benchmark harness of scripts/benchmark.py (issue 7); see benchmarks/README.md."""
