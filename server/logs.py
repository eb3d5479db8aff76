"""structlog configuration: JSON lines (default) or a console rendering."""

from __future__ import annotations

import logging
import sys
import threading

import structlog

_WRITE_LOCK = threading.Lock()


class _StderrLogger:
    """Writes each rendered line, whole, to whatever `sys.stderr` is at that moment.

    One write per line under a lock: `print` writes the text and its newline apart, so two
    threads logging at once could share a line.
    """

    def msg(self, message: str) -> None:
        with _WRITE_LOCK:
            sys.stderr.write(message + "\n")
            sys.stderr.flush()

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


def configure_logging(level: str = "info", fmt: str = "json") -> None:
    """Route structlog (and stdlib logging) to stderr in the chosen format."""
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    renderer = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=lambda *args: _StderrLogger(),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)
