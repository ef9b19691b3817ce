"""Structured logging: JSON lines for machines, a console renderer for people.

Everything the process writes to stderr goes through the same renderer: structlog's own loggers,
and the standard library's (asyncio, grpc, the drivers) with Python's warnings among them
(``logging.captureWarnings``), so a numpy RuntimeWarning or a library's complaint is one JSON
line like any other, never plain text in the middle of the log.
"""

from __future__ import annotations

import logging
import sys

import structlog

# The standard library's records at this level and above are kept (or at the daemon's level, if
# higher): libraries log at INFO what only their own debugging needs (httpx: every request).
_FOREIGN_LEVEL = logging.WARNING


def configure(level: str, fmt: str) -> None:
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    stamped: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    threshold = logging.getLevelName(level.upper())
    structlog.configure(
        processors=[*stamped, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*stamped, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(max(threshold, _FOREIGN_LEVEL))
    logging.captureWarnings(True)
