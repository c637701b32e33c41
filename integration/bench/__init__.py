"""Benchmarks (commands, not tests)."""
