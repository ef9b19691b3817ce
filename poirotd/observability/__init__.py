"""Logs, Prometheus metrics and garbage-collector tuning of the running daemon."""
