"""Errors the core raises for bad requests; each transport maps them to its own status codes."""

from __future__ import annotations


class ServiceError(Exception):
    """A request the daemon refuses. `reason` is a bounded label for the rejects metric."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class InvalidArgument(ServiceError):
    pass


class NotFound(ServiceError):
    pass


class ResourceExhausted(ServiceError):
    pass


class Unavailable(ServiceError):
    """The daemon is draining or not ready."""
