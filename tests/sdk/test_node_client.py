"""The Node.js client, the npm package satchel-client (clients/node): its TypeScript stubs from
`buf generate` (ts-proto, grpc-js) are current, its example calls AssembleContext and
StreamContext against the real server, and the tarball `npm pack` makes installs into an empty
project, where a script that imports the package by its name calls the server (with and
without an API key) and the README's TypeScript type-checks against the installed types.

npm packages come from the npm registry (`npm ci` on clients/node/package-lock.json), once:
stamps in node_modules skip the install and the build while their inputs are unchanged.
"""

from __future__ import annotations

import asyncio
import filecmp
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import grpc
import pytest
from helpers.paths import ROOT
from helpers.servers import new_key, running
from test_context import CAROLINE, assert_facts, trace_of

from satchel.server.platform.config import Settings
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
    """npm ci (when the lock changed) and `npm run build` (the package, then its example, when
    the sources changed); the built example."""
    for tool in ("node", "npm"):
        assert shutil.which(tool), f"{tool} is needed for the Node.js client tests"
    installed = NODE / "node_modules" / ".satchel-installed"
    want = _digest(NODE / "package-lock.json")
    if not installed.exists() or installed.read_text() != want:
        _run("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
        installed.write_text(want)
    built = NODE / "node_modules" / ".satchel-built"  # not in dist/: npm pack ships dist/
    sources = _digest(
        NODE / "package.json", NODE / "tsconfig.json", NODE / "src", NODE / "examples", installed
    )
    example = NODE / "examples" / "dist" / "context.js"
    if not built.exists() or built.read_text() != sources or not example.exists():
        _run("npm", "run", "build", "--silent")
        built.write_text(sources)
    return example


@pytest.fixture(scope="session")
async def node_example() -> Path:
    """The compiled example client (installed and built once per session, cached on disk)."""
    return await asyncio.to_thread(_prepare)


@pytest.fixture(scope="session")
async def node_package(node_example: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tarball `npm pack` writes (its prepack compiles the package and copies LICENSE)."""
    out = tmp_path_factory.mktemp("npm-pack")
    await asyncio.to_thread(_run, "npm", "pack", "--pack-destination", str(out), "--loglevel=error")
    (tarball,) = out.glob("satchel-client-*.tgz")
    return tarball


CONSUMER = """\
import { AssembleContextRequest, createClient, unary } from "satchel-client";

const [address, projectId, query, apiKey] = process.argv.slice(2);

async function main(): Promise<void> {
  const satchel = createClient(address, { apiKey: apiKey || undefined });
  try {
    const reply = await unary(
      satchel.context,
      "assembleContext",
      AssembleContextRequest.fromPartial({ projectId, subjectId: "user-1", query }),
      { deadline: new Date(Date.now() + 10_000) },
    );
    const facts = reply.packet?.facts ?? [];
    const line = { trace_id: reply.traceId, facts: facts.map((f) => [f.id, f.statement]) };
    process.stdout.write(JSON.stringify(line) + "\\n");
  } finally {
    satchel.close();
  }
}

main().catch((error: { code?: number; details?: string }) => {
  process.stderr.write(`code=${error.code} ${error.details}\\n`);
  process.exit(1);
});
"""

ESM_CONSUMER = """\
import { createClient, ContextServiceClient, unary, AssembleContextRequest } from "satchel-client";
import { MemoryServiceClient } from "satchel-client/gen/satchel/v1/memory";
const kinds = [createClient, ContextServiceClient, unary, AssembleContextRequest.fromPartial];
console.log(JSON.stringify([...kinds.map((k) => typeof k), typeof MemoryServiceClient]));
"""


def _readme_typescript() -> str:
    """The TypeScript block of the package's README."""
    (block,) = re.findall(r"```ts\n(.*?)```", (NODE / "README.md").read_text(), re.S)
    return block


def _install_consumer(tarball: Path, project: Path) -> Path:
    """An empty project with the tarball installed (its dependencies from the npm cache or the
    registry), and consumer.ts and the README's block compiled against the installed types."""
    (project / "package.json").write_text('{"name": "consumer", "private": true}\n')
    _run(
        "npm",
        "install",
        "--no-audit",
        "--no-fund",
        "--prefer-offline",
        "--loglevel=error",
        str(tarball),
        cwd=project,
    )
    (project / "consumer.ts").write_text(CONSUMER)
    (project / "readme.ts").write_text(_readme_typescript())
    (project / "esm.mjs").write_text(ESM_CONSUMER)
    tsconfig = {
        "compilerOptions": {
            "target": "ES2022",
            "module": "node16",
            "moduleResolution": "node16",
            "strict": True,
            "skipLibCheck": True,
            "typeRoots": [str(NODE / "node_modules" / "@types")],
            "types": ["node"],
            "outDir": "dist",
        },
        "files": ["consumer.ts", "readme.ts"],
    }
    (project / "tsconfig.json").write_text(json.dumps(tsconfig))
    _run(str(NODE / "node_modules" / ".bin" / "tsc"), "-p", ".", cwd=project)
    return project / "dist" / "consumer.js"


@pytest.fixture(scope="session")
async def node_consumer(node_package: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """consumer.js in a fresh project that installed the packed tarball."""
    project = tmp_path_factory.mktemp("npm-consumer")
    return await asyncio.to_thread(_install_consumer, node_package, project)


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


def test_npm_package_ships_compiled_stubs_types_and_readme(node_package: Path) -> None:
    with tarfile.open(node_package) as tar:
        names = {m.name.removeprefix("package/") for m in tar.getmembers() if m.isfile()}
        packed = tar.extractfile("package/package.json")
        assert packed is not None
        manifest = json.load(packed)
    assert "private" not in manifest and manifest["name"] == "satchel-client"
    assert {"README.md", "LICENSE", "package.json", "dist/index.js", "dist/index.d.ts"} <= names
    for proto in ("context", "memory", "talent"):
        assert {f"dist/gen/satchel/v1/{proto}.js", f"dist/gen/satchel/v1/{proto}.d.ts"} <= names
    for script in (n for n in names if n.endswith(".js")):
        assert script.removesuffix(".js") + ".d.ts" in names, f"{script} has no types"
    # Only what ships: no sources, examples, stamps, node_modules or earlier tarballs.
    assert all(n.startswith("dist/") or "/" not in n for n in names), sorted(names)
    assert not {n for n in names if n.endswith((".ts", ".tgz")) and not n.endswith(".d.ts")}
    entry = manifest["exports"]["."]
    targets = [manifest["main"], manifest["types"], entry["types"], entry["default"]]
    assert all(t.removeprefix("./") in names for t in targets), targets
    assert set(manifest["dependencies"]) == {"@grpc/grpc-js", "@bufbuild/protobuf"}


async def test_installed_npm_package_calls_the_server_by_its_name(
    node_consumer: Path, address: str, channel: grpc.aio.Channel, project_id: str
) -> None:
    """A project that installed the tarball imports "satchel-client" and calls AssembleContext;
    its README's TypeScript compiled against the installed types (node_consumer)."""
    await assert_facts(channel, project_id, CAROLINE)
    query = "Which city did Caroline move to?"
    project = node_consumer.parent.parent
    result = await asyncio.to_thread(
        _run, "node", str(node_consumer), address, project_id, query, cwd=project
    )
    reply = json.loads(result.stdout)
    stored = await trace_of(channel, project_id, reply["trace_id"])
    assert stored.query == query
    assert [fact_id for fact_id, _ in reply["facts"]] == [
        d.candidate_id
        for d in stored.decisions
        if d.outcome == pb.DECISION_OUTCOME_INCLUDED and d.candidate_kind == pb.CANDIDATE_KIND_FACT
    ]
    assert reply["facts"][0][1] == "Caroline moved to Lisbon in March 2023"

    esm = await asyncio.to_thread(_run, "node", "esm.mjs", cwd=project)
    assert json.loads(esm.stdout) == ["function"] * 5  # ES module imports, subpath too


async def test_installed_npm_package_sends_the_api_key(
    node_consumer: Path, settings: Settings, pg_dsn: str
) -> None:
    """createClient(address, {apiKey}) sends `authorization: Bearer <key>`: a server that
    requires keys answers with it and refuses without it (UNAUTHENTICATED, code 16)."""
    project = f"npm-key-{uuid.uuid4().hex[:12]}"
    key = await asyncio.to_thread(new_key, pg_dsn, project)
    async with running(settings, auth="required") as server:
        target = f"127.0.0.1:{server.port}"

        def consume(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["node", str(node_consumer), target, project, "anything?", *args],
                capture_output=True,
                text=True,
                timeout=60,
            )

        keyed, bare, wrong = await asyncio.gather(
            asyncio.to_thread(consume, key),
            asyncio.to_thread(consume),
            asyncio.to_thread(consume, "satchel_not-a-key"),
        )
    assert keyed.returncode == 0, keyed.stderr
    assert json.loads(keyed.stdout)["trace_id"]
    for refused in (bare, wrong):
        assert refused.returncode == 1 and "code=16" in refused.stderr, refused.stderr
