"""structlog configuration: JSON lines (default) or a console rendering.

Every line goes through structlog: satchel's own, and stdlib `logging` records (gRPC's Python
`grpc.*` loggers, psycopg, onnxruntime…) rendered by the same processors with a `logger` key.
While an OpenTelemetry span is current (SATCHEL_OTEL not `off`), each line carries its
`trace_id` and `span_id` (W3C hex, as exporters and log backends expect): `trace_id` is only ever
OpenTelemetry's. satchel's own id of a context call (the UUID `AssembleContext` returns, which
`GetTrace` reads) is `satchel_trace_id`, with spans on or off.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

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


class _StructlogHandler(logging.Handler):
    """The root logger's handler: stdlib records rendered by structlog, written as above."""

    def __init__(self, formatter: logging.Formatter) -> None:
        super().__init__()
        self.setFormatter(formatter)
        self._out = _StderrLogger()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._out.msg(self.format(record))
        except Exception:  # never let logging raise into the caller
            self.handleError(record)


SATCHEL_TRACE_ID = "satchel_trace_id"
"""The key of satchel's own context-call id (a UUID) in log lines; `trace_id` is OpenTelemetry's."""


def add_trace_ids(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Add the current OpenTelemetry span's `trace_id` and `span_id`, when there is one.

    `trace_id` is OpenTelemetry's alone, so that a line joins the span of its call: a `trace_id`
    a caller bound or passed is satchel's own call id, and is moved to `satchel_trace_id` (bind
    that key directly). OpenTelemetry is never imported here: with spans off it is not loaded and
    this costs a dictionary lookup.
    """
    own = event_dict.pop("trace_id", None)
    if own is not None:
        event_dict.setdefault(SATCHEL_TRACE_ID, own)
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return event_dict
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event_dict["trace_id"] = format(context.trace_id, "032x")
        event_dict["span_id"] = format(context.span_id, "016x")
    return event_dict


def add_pid(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Add the process id: which of a server's processes (SATCHEL_PROCESSES) wrote the line."""
    event_dict.setdefault("pid", os.getpid())
    return event_dict


def configure_logging(level: str = "info", fmt: str = "json", *, with_pid: bool = False) -> None:
    """Route structlog and stdlib logging (gRPC's `grpc` loggers among them) to stderr in the
    chosen format, each line with its `pid` when `with_pid`. Stdlib records below WARNING are
    dropped (libraries' chatter) unless the level is stricter still."""
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    renderer: Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        add_trace_ids,
        *([add_pid] if with_pid else []),
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=lambda *args: _StderrLogger(),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    root = logging.getLogger()
    for handler in list(root.handlers):  # configured again (tests, commands): replace ours
        if isinstance(handler, _StructlogHandler):
            root.removeHandler(handler)
    root.addHandler(_StructlogHandler(formatter))
    root.setLevel(max(numeric, logging.WARNING))
