"""Evaluation on public attribution benchmarks: load cases, run them through the daemon, score."""
