"""Soak: minutes of a steady mix of context calls and writes against `satchel serve`.

Runs `benchmarks/soak.py` (the same code as the long runs of benchmarks/soak.md) for 90 s at
10 calls/s on loopback: every call must succeed, latency must hold from window to window, and
the server's resident memory must not trend upwards.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from helpers.paths import ROOT

_SPEC = importlib.util.spec_from_file_location("satchel_soak", ROOT / "benchmarks" / "soak.py")
assert _SPEC is not None and _SPEC.loader is not None
soak = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = soak  # dataclasses look their module up
_SPEC.loader.exec_module(soak)

pytestmark = pytest.mark.slow

DURATION, RATE, WINDOW = 90.0, 10.0, 15.0


async def test_steady_load_for_minutes_has_no_error_and_no_memory_growth(
    pg_dsn: str, tmp_path: Path, project_id: str
) -> None:
    log_path = tmp_path / "serve.log"
    env = {"SATCHEL_DATABASE_URL": pg_dsn, "SATCHEL_DATA_DIR": str(tmp_path / "data")}
    proc, target = await asyncio.to_thread(soak.start_server, env, log_path)
    try:
        runner = soak.Soak(target, project=project_id, api_key=None, server_pid=proc.pid)
        async with soak.grpc.aio.insecure_channel(target) as channel:
            await runner.seed(channel, 200)
        report = await runner.run(DURATION, RATE, WINDOW)
    finally:
        exit_code = await asyncio.to_thread(soak.stop_server, proc)
    soak.print_report(report)
    assert exit_code == 0
    assert report.errors == 0, report.error_samples
    assert report.skipped == 0
    assert report.calls >= DURATION * RATE * 0.98
    windows = report.windows
    assert len(windows) == DURATION / WINDOW and all(w["calls"] for w in windows)
    assert all(float(w["p99_ms"]) < 5_000 for w in windows), windows
    # Memory: measured after the first window (warm), it must not keep growing.
    warm = [float(w["rss_mib"]) for w in windows]
    assert report.rss_start_mib is not None and report.rss_end_mib is not None
    assert report.rss_end_mib <= warm[0] * 1.2 + 32, (report.rss_start_mib, warm)
    assert max(warm[len(warm) // 2 :]) <= warm[0] * 1.2 + 32, warm
    # Loopback only, so auth defaulted to disabled, and the startup log says why.
    events = [json.loads(line) for line in log_path.read_text().splitlines() if line[:1] == "{"]
    access = next(e for e in events if e["event"] == "server_access")
    assert (access["auth"], access["auth_reason"]) == ("disabled", "loopback only")
    assert any(e["event"] == "auth_disabled" for e in events)
