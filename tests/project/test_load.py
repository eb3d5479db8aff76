"""The load tools: benchmarks/load.py against the real server, and the ghz configurations
(each call a method of the committed descriptor set, its data that method's request; no
address: ghz takes it on the command line, as docs/load-testing.md shows)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from helpers.paths import ROOT

import satchel.v1.context_pb2
import satchel.v1.talent_pb2  # noqa: F401
from satchel.server.platform.reflection import find_file_containing_symbol

LOAD = ROOT / "benchmarks" / "load.py"


def _load(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(LOAD), *args], capture_output=True, text=True, timeout=300
    )


async def test_load_driver_reports_rates_percentiles_and_ratios(
    address: str, test_root: Path
) -> None:
    cpu: list[
        str
    ] = []  # the embedded database's processes are ours to count; an external one's are not
    if not os.environ.get("SATCHEL_TEST_DATABASE_URL"):
        pgdata = test_root / "pg"
        assert (pgdata / "postmaster.pid").exists()
        cpu = ["--server-pid", str(os.getpid()), "--pgdata", str(pgdata)]
    result = await asyncio.to_thread(
        _load,
        *("--target", address, "--workers", "1", "2", "--duration", "1.5", "--warmup", "0"),
        *("--facts", "40", "--subjects", "2", "--json", *cpu),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    runs = {(r["method"], r["workers"]): r for r in report["results"]}
    assert set(runs) == {(m, w) for m in ("AssembleContext", "StreamContext") for w in (1, 2)}
    for key, figures in runs.items():
        assert figures["ok"] > 0 and figures["errors"] == {}, key
        assert figures["requests_per_second"] > 0
        latency = figures["latency_ms"]
        assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"]
        if cpu:  # the server (this process) and its PostgreSQL both worked for the calls
            used = figures["cpu_ms_per_call"]
            assert used["server"] > 0 and used["postgres"] > 0 and used["driver"] > 0
            assert used["total"] == pytest.approx(used["server"] + used["postgres"], abs=0.02)
    first = runs[("StreamContext", 1)]["first_decision_ms"]
    assert first["p50"] <= runs[("StreamContext", 1)]["latency_ms"]["p50"]
    alone = report["embedding_alone"]
    assert alone["processes"] >= 1 and alone["queries_per_second"] > 0
    assert alone["cpu_ms_per_query"] > 0 and alone["alone_ms"]["p50"] > 0
    ratios = report["ratios"]
    unary_one = ratios["AssembleContext@1"]
    assert unary_one["p50_over_embedding"] == pytest.approx(
        runs[("AssembleContext", 1)]["latency_ms"]["p50"] / alone["alone_ms"]["p50"], abs=0.01
    )
    assert "throughput_over_assemble" in ratios["StreamContext@2"]
    if cpu:
        assert unary_one["cpu_over_embedding"] > 0


async def test_load_driver_stays_on_loopback_and_bounded() -> None:
    remote = await asyncio.to_thread(_load, "--target", "10.1.2.3:50051")
    assert remote.returncode == 2 and "loopback" in remote.stderr
    unbounded = await asyncio.to_thread(_load, "--workers", "1000")
    assert unbounded.returncode == 2 and "--workers" in unbounded.stderr


GHZ_CONFIGS = sorted(p.name for p in (ROOT / "benchmarks").glob("ghz*.json"))
DESCRIPTOR_SET = ROOT / "proto" / "satchel.binpb"
HOT_PATHS = {
    "satchel.v1.ContextService.AssembleContext",
    "satchel.v1.ContextService.StreamContext",
    "satchel.v1.TalentService.ResolveTalents",
}


def _descriptor_set_pool() -> descriptor_pool.DescriptorPool:
    """A pool holding the committed descriptor set alone (what `ghz --protoset` loads)."""
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes()).file:
        pool.Add(file)  # files come dependencies first, as buf writes them
    return pool


def _method_name(call: str) -> str:
    """ghz's `package.Service.Method` or `package.Service/Method`, as a full name."""
    return call.replace("/", ".")


@pytest.mark.parametrize("name", GHZ_CONFIGS)
def test_ghz_configuration_matches_the_contract(name: str) -> None:
    config = json.loads((ROOT / "benchmarks" / name).read_text())
    method = _method_name(config["call"])
    if "protoset" in config:  # relative to the repository root, where ghz is run from
        assert (ROOT / config["protoset"]).resolve() == DESCRIPTOR_SET
        assert "proto" not in config  # ghz: --proto would take precedence
    else:  # through reflection: the server resolves the method symbol (test_reflection.py)
        assert find_file_containing_symbol(descriptor_pool.Default(), method)
    found = _descriptor_set_pool().FindMethodByName(method)
    assert found.full_name == method
    request = message_factory.GetMessageClass(found.input_type)()
    json_format.ParseDict(config["data"], request)  # every field exists, with its type
    # The address is ghz's positional argument (`ghz --config F ADDRESS`, which overrides a
    # config's "host"): the configurations name none, so none points at a port of its own.
    assert "host" not in config and config["insecure"] is True
    assert config["concurrency"] > 0 and config["total"] > 0


def test_documented_ghz_commands_pass_the_address() -> None:
    """Each ghz command of docs/load-testing.md names a configuration that exists and passes
    the server's address after it."""
    doc = (ROOT / "docs" / "load-testing.md").read_text()
    commands = re.findall(r"^ghz (.*)$", doc, re.M)
    assert len(commands) >= 2
    for command in commands:
        match = re.fullmatch(r'--config (\S+) "\$ADDRESS"(?:\s+#.*)?', command)
        assert match and (ROOT / match[1]).is_file(), command
    assert re.search(r"^ADDRESS=127\.0\.0\.1:50051\b", doc, re.M)


def test_every_hot_path_has_a_reflection_and_a_protoset_configuration() -> None:
    configs = [json.loads((ROOT / "benchmarks" / n).read_text()) for n in GHZ_CONFIGS]
    for uses_protoset in (False, True):
        calls = {_method_name(c["call"]) for c in configs if ("protoset" in c) == uses_protoset}
        assert calls >= HOT_PATHS, (uses_protoset, HOT_PATHS - calls)
