"""Every grpcurl line of the README and of docs/ runs against the real server (through
reflection)."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from helpers.paths import ROOT
from test_context import assert_facts, context_stub

from satchel.v1 import context_pb2 as pb

GRPCURL = Path(sys.executable).parent / "grpcurl"
README_ADDRESS = "127.0.0.1:50051"
README_PROJECT = '"project_id": "demo"'


def grpcurl_lines(page: Path) -> list[str]:
    """The grpcurl command lines of a page's sh blocks, in order."""
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", page.read_text(), flags=re.S):
        lines += [line for line in block.splitlines() if line.startswith(".venv/bin/grpcurl ")]
    return lines


def readme_grpcurl_lines() -> list[str]:
    """The grpcurl lines of the README (the tour's), then of every page of docs/."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [line for page in pages for line in grpcurl_lines(page)]


def test_the_tour_keeps_its_grpcurl_lines() -> None:
    """The README's five-minute tour lists the services and writes, assembles and streams."""
    tour = " ".join(grpcurl_lines(ROOT / "README.md"))
    for call in ("list", "Health/Check", "AssertFact", "AssembleContext", "StreamContext"):
        assert call in tour, call


def _args(line: str, address: str, project_id: str) -> list[str]:
    line = line.replace(README_ADDRESS, address)
    line = line.replace(README_PROJECT, f'"project_id": "{project_id}"')
    args = shlex.split(line, comments=True)
    return [str(GRPCURL), *args[1:]]


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=ROOT)


async def _watch(args: list[str], channel: grpc.aio.Channel, project_id: str) -> str:
    """Run a WatchTraces line in the background while calls are made; its output."""
    with tempfile.TemporaryFile("w+") as out:
        process = await asyncio.to_thread(
            subprocess.Popen, args, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=ROOT
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                await context_stub(channel).AssembleContext(
                    pb.AssembleContextRequest(
                        project_id=project_id, subject_id="user-1", query="Caroline"
                    )
                )
                await asyncio.sleep(0.3)
                out.seek(0)
                output = out.read()
                if '"packet"' in output or time.monotonic() > deadline:
                    return output
        finally:
            process.terminate()
            await asyncio.to_thread(process.wait, 10)


async def test_readme_grpcurl_examples_work(
    address: str, channel: grpc.aio.Channel, project_id: str
) -> None:
    lines = readme_grpcurl_lines()
    assert len(lines) >= 8, lines
    await assert_facts(channel, project_id, ["Caroline works as a nurse on night shifts"])
    outputs: dict[str, str] = {}
    for line in lines:
        args = _args(line, address, project_id)
        if "WatchTraces" in line:
            output = await _watch(args, channel, project_id)
            assert '"decision"' in output and '"packet"' in output, output
            outputs["WatchTraces"] = output
            continue
        result = await asyncio.to_thread(_run, args)
        assert result.returncode == 0, f"{line}\n{result.stdout}\n{result.stderr}"
        outputs[args[-1]] = result.stdout
    assert "satchel.v1.ContextService" in outputs["list"]
    assert "rpc WatchTraces" in outputs["satchel.v1.ContextService"]
    assembled = json.loads(outputs["satchel.v1.ContextService/AssembleContext"])
    assert assembled["packet"]["facts"][0]["statement"] == "Caroline lives in Lisbon"
    streamed = outputs["satchel.v1.ContextService/StreamContext"]
    assert '"decision"' in streamed and '"packet"' in streamed
    stats = json.loads(outputs["satchel.v1.ContextService/GetStatsOverview"])
    assert int(stats["context_calls"]) >= 2
