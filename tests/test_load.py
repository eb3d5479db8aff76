"""The load tools: benchmarks/load.py against the real server, and the ghz configurations."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pool, json_format, message_factory

import satchel.v1.context_pb2  # noqa: F401  (registers the descriptors)

ROOT = Path(__file__).resolve().parent.parent
LOAD = ROOT / "benchmarks" / "load.py"


def _load(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(LOAD), *args], capture_output=True, text=True, timeout=300
    )


async def test_load_driver_reports_rates_and_percentiles(address: str) -> None:
    result = await asyncio.to_thread(
        _load,
        *("--target", address, "--workers", "2", "--duration", "1.5", "--warmup", "0"),
        *("--facts", "40", "--json"),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    by_method = {r["method"]: r for r in report["results"]}
    assert set(by_method) == {"AssembleContext", "StreamContext"}
    for method, figures in by_method.items():
        assert figures["ok"] > 0 and figures["errors"] == {}, method
        assert figures["requests_per_second"] > 0
        latency = figures["latency_ms"]
        assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"]
    first = by_method["StreamContext"]["first_decision_ms"]
    assert first["p50"] <= by_method["StreamContext"]["latency_ms"]["p50"]


async def test_load_driver_stays_on_loopback_and_bounded() -> None:
    remote = await asyncio.to_thread(_load, "--target", "10.1.2.3:50051")
    assert remote.returncode == 2 and "loopback" in remote.stderr
    unbounded = await asyncio.to_thread(_load, "--workers", "1000")
    assert unbounded.returncode == 2 and "--workers" in unbounded.stderr


@pytest.mark.parametrize("name", ["ghz.json", "ghz-stream.json"])
def test_ghz_configuration_matches_the_contract(name: str) -> None:
    config = json.loads((ROOT / "benchmarks" / name).read_text())
    service, _, method = config["call"].rpartition(".")
    found = descriptor_pool.Default().FindServiceByName(service).FindMethodByName(method)
    request = message_factory.GetMessageClass(found.input_type)()
    json_format.ParseDict(config["data"], request)  # every field exists, with its type
    assert config["host"].startswith("127.0.0.1:") and config["insecure"] is True
    assert config["concurrency"] > 0 and config["total"] > 0
