"""Integrations with agent frameworks (optional dependencies)."""
