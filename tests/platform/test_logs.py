"""Log lines stay whole when several threads log at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers.paths import ROOT

_LOG_FROM_THREADS = """
import sys, threading
import structlog
from satchel.server.platform.logs import configure_logging

configure_logging("info", "json")
log = structlog.get_logger()
sys.setswitchinterval(1e-6)

def run(worker):
    for n in range(1500):
        log.info("line", worker=worker, n=n, padding="x" * 200)

threads = [threading.Thread(target=run, args=(w,)) for w in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


def test_concurrent_threads_never_share_a_log_line(tmp_path: Path) -> None:
    log_path = tmp_path / "log"
    with log_path.open("w") as log_file:
        subprocess.run(
            [sys.executable, "-c", _LOG_FROM_THREADS],
            stderr=log_file,
            check=True,
            cwd=ROOT,
            timeout=120,
        )
    lines = log_path.read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert len(events) == 6 * 1500
    expected = {(worker, n) for worker in range(6) for n in range(1500)}
    assert {(event["worker"], event["n"]) for event in events} == expected


_STDLIB_AND_SPANS = """
import logging
from concurrent import futures

import grpc
import structlog
from opentelemetry.sdk.trace import TracerProvider

from satchel.server.platform.logs import configure_logging

configure_logging("info", "json")
log = structlog.get_logger("satchel.test")
log.info("outside_span")
logging.getLogger("psycopg").warning("pool %s is %d%% full", "main", 90)
logging.getLogger("chatty").info("dropped: stdlib below WARNING")

# gRPC's own Python logger: a servicer that raises is logged by grpc._server.
def fail(request, context):
    raise RuntimeError("servicer failed")

server = grpc.server(futures.ThreadPoolExecutor(1))
server.add_generic_rpc_handlers(
    [grpc.method_handlers_generic_handler("t.S", {"M": grpc.unary_unary_rpc_method_handler(fail)})]
)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
    try:
        channel.unary_unary("/t.S/M")(b"", timeout=10)
    except grpc.RpcError:
        pass
server.stop(None)

tracer = TracerProvider().get_tracer("test")
with tracer.start_as_current_span("rpc") as span:
    ids = span.get_span_context()
    print(format(ids.trace_id, "032x"), format(ids.span_id, "016x"))
    log.info("inside_span")
    logging.getLogger("grpc.aio._server").error("stdlib inside the span")
"""


def test_stdlib_and_grpc_logs_go_through_structlog_with_span_ids(tmp_path: Path) -> None:
    """Stdlib records (gRPC's `grpc` loggers too) are JSON lines like satchel's own, and every
    line logged under a current OpenTelemetry span carries its trace_id and span_id."""
    result = subprocess.run(
        [sys.executable, "-c", _STDLIB_AND_SPANS],
        # gRPC core's own lines (not Python's `grpc` loggers) are off, as `satchel` sets them
        env={**os.environ, "GRPC_VERBOSITY": "NONE"},
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        timeout=120,
    )
    trace_id, span_id = result.stdout.split()
    events = [json.loads(line) for line in result.stderr.splitlines()]  # every line is JSON
    by_event = {e["event"]: e for e in events}
    assert "dropped: stdlib below WARNING" not in by_event
    outside = by_event["outside_span"]
    assert "trace_id" not in outside and "span_id" not in outside
    pool = by_event["pool main is 90% full"]
    assert (pool["logger"], pool["level"]) == ("psycopg", "warning") and "timestamp" in pool
    grpc_line = next(e for e in events if e.get("logger", "").startswith("grpc"))
    assert grpc_line["level"] == "error" and "servicer failed" in grpc_line.get("exception", "")
    for name in ("inside_span", "stdlib inside the span"):
        assert (by_event[name]["trace_id"], by_event[name]["span_id"]) == (trace_id, span_id)
    assert by_event["stdlib inside the span"]["logger"] == "grpc.aio._server"
