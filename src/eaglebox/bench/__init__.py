"""Acceptance and throughput benchmarks."""
