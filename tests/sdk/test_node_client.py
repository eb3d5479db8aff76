"""The Node.js client: TypeScript stubs from `buf generate` (ts-proto, grpc-js) are current, and
the example calls AssembleContext and StreamContext against the real server.

npm packages come from the npm registry (`npm ci` on clients/node/package-lock.json), once:
a stamp in node_modules skips the install (and dist/ the build) while their inputs are unchanged.
"""

from __future__ import annotations

import asyncio
import filecmp
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from helpers.paths import ROOT
from test_context import CAROLINE, assert_facts, trace_of

from satchel.v1 import context_pb2 as pb

NODE = ROOT / "clients" / "node"
BIN = Path(sys.executable).parent


def _run(*args: str, cwd: Path = NODE, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


def _digest(*paths: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            digest.update(str(file.relative_to(NODE)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def _prepare() -> Path:
    """npm ci (when the lock changed) and tsc (when the sources changed); the built example."""
    for tool in ("node", "npm"):
        assert shutil.which(tool), f"{tool} is needed for the Node.js client tests"
    installed = NODE / "node_modules" / ".satchel-installed"
    want = _digest(NODE / "package-lock.json")
    if not installed.exists() or installed.read_text() != want:
        _run("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
        installed.write_text(want)
    built = NODE / "dist" / ".satchel-built"
    sources = _digest(NODE / "example.ts", NODE / "tsconfig.json", NODE / "src", installed)
    if not built.exists() or built.read_text() != sources:
        _run(str(NODE / "node_modules" / ".bin" / "tsc"), "-p", ".")
        built.write_text(sources)
    return NODE / "dist" / "example.js"


@pytest.fixture(scope="session")
async def node_example() -> Path:
    """The compiled example client (installed and built once per session, cached on disk)."""
    return await asyncio.to_thread(_prepare)


async def test_typescript_stubs_are_reproducible_from_proto(node_example: Path, tmp_path) -> None:
    await asyncio.to_thread(_run, str(BIN / "buf"), "generate", "-o", str(tmp_path), cwd=ROOT)
    fresh = tmp_path / "clients" / "node" / "src" / "gen"
    committed = NODE / "src" / "gen"
    names = sorted(str(p.relative_to(fresh)) for p in fresh.rglob("*.ts"))
    assert names == sorted(str(p.relative_to(committed)) for p in committed.rglob("*.ts"))
    _, mismatch, errors = filecmp.cmpfiles(fresh, committed, names, shallow=False)
    assert not mismatch and not errors, f"stale TypeScript stubs, run buf generate: {mismatch}"


async def test_node_example_assembles_and_streams_against_the_server(
    node_example: Path, address: str, channel: grpc.aio.Channel, project_id: str
) -> None:
    await assert_facts(channel, project_id, CAROLINE)
    query = "Which city did Caroline move to?"
    result = await asyncio.to_thread(
        _run,
        "node",
        str(node_example),
        address,
        project_id,
        "user-1",
        query,
        timeout=60,
    )
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    unary, *streamed = lines
    assert unary["rpc"] == "AssembleContext"
    stored = await trace_of(channel, project_id, unary["trace_id"])
    assert stored.query == query
    assert [f["id"] for f in unary["packet"]["facts"]] == [
        d.candidate_id
        for d in stored.decisions
        if d.outcome == pb.DECISION_OUTCOME_INCLUDED and d.candidate_kind == pb.CANDIDATE_KIND_FACT
    ]
    assert unary["packet"]["facts"][0]["statement"] == "Caroline moved to Lisbon in March 2023"

    assert {line["rpc"] for line in streamed} == {"StreamContext"}
    *decisions, last = streamed
    assert "packet" in last and all("decision" in line for line in decisions)
    stream_trace = await trace_of(channel, project_id, last["trace_id"])
    assert [line["decision"]["candidate_id"] for line in decisions] == [
        d.candidate_id for d in stream_trace.decisions
    ]
    assert [line["decision"]["sequence"] for line in decisions] == list(
        range(1, len(decisions) + 1)
    )
    assert last["packet"]["facts"] == unary["packet"]["facts"]
    assert last["packet"]["tokens_used"] == stream_trace.tokens_used


async def test_node_example_reports_an_rpc_error(node_example: Path, address: str) -> None:
    result = await asyncio.to_thread(
        subprocess.run,
        ["node", str(node_example), address, "", "user-1", "q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "code=3" in result.stderr  # INVALID_ARGUMENT: project_id must not be empty
