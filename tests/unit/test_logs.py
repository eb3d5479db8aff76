"""Log lines stay whole when several threads log at once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_LOG_FROM_THREADS = """
import sys, threading
import structlog
from server.logs import configure_logging

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
            cwd=Path(__file__).resolve().parents[2],
            timeout=120,
        )
    lines = log_path.read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert len(events) == 6 * 1500
    expected = {(worker, n) for worker in range(6) for n in range(1500)}
    assert {(event["worker"], event["n"]) for event in events} == expected
