"""Throughput benchmarks (`fastscore bench`): figures measured side by side in one run."""
