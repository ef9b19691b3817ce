"""Errors the core raises for bad requests, each transport mapping them to its own status codes;
and the one base of every reason the daemon cannot start."""

from __future__ import annotations

# The most characters of a client's text an error message or a log line quotes.
QUOTE_CHARS = 64


def quote(text: str) -> str:
    """A client's text for an error message: its repr, cut to a short prefix, so that neither
    a status detail nor a log line grows with what a client sent."""
    if len(text) <= QUOTE_CHARS:
        return repr(text)
    return f"{text[:QUOTE_CHARS]!r}... ({len(text)} characters)"


class StartupError(Exception):
    """The daemon cannot start with these settings on this machine: a port taken, an unusable
    certificate, access file, store or model. The message alone tells the operator what to fix
    (the CLI prints it, without a traceback, and exits 2). It is raised once what had already
    started is stopped again."""


class TransportBindError(StartupError):
    """A transport cannot listen on its address: the port is taken, or the host is not this
    machine's."""


class ServiceError(Exception):
    """A request the daemon refuses. `reason` is a bounded label for the rejects metric."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason

    def at(self, where: str) -> ServiceError:
        """The same refusal, its message prefixed with where it happened (``seq 7``)."""
        return type(self)(f"{where}: {self}", reason=self.reason)


class InvalidArgument(ServiceError):
    pass


class NotFound(ServiceError):
    pass


class FailedPrecondition(ServiceError):
    """The request is valid but the state it addresses does not allow it (yet, or any more)."""


class ResourceExhausted(ServiceError):
    pass


class Unavailable(ServiceError):
    """The daemon is draining or not ready."""


class DeadlineExceeded(ServiceError):
    """A call outlived a deadline the daemon sets on it (an Ingest stream that sent nothing for
    too long)."""


# How the status of an Ingest stream a draining daemon ends begins: a client (hwbridge's
# forwarder) reconnects to another replica at once on it.
DRAINING = "draining:"


# How the status of an Ingest stream the daemon ends for sending nothing begins
# (POIROTD_INGEST_IDLE_SECONDS): everything it sent is acked; a client (hwbridge's forwarder)
# opens the next stream when it has something to send.
IDLE = "idle:"


def draining() -> Unavailable:
    return Unavailable(
        f"{DRAINING} everything acked is stored; reconnect to another replica and resend what "
        "was not acked",
        reason="draining",
    )


class Internal(ServiceError):
    """A fault of the daemon's own while serving a request: that request fails with a status
    (never a hang), and the daemon goes on."""
