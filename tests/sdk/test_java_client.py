"""Java (clients/java): `buf generate` with clients/java/buf.gen.yaml (protoc's java generator and
grpc-java's plugin, both local) writes a class for every message, enum and service of the
contract; javac compiles them against Debian's protobuf-java and grpc-java into a jar; the
example, compiled against that jar, calls AssembleContext on the real server, with and without
an API key.

clients/java/build --install installs protoc, the plugin and the jars with apt-get when they are
missing; the tests are skipped only when that cannot be done on this machine (or no JDK is
there).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
import zipfile
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FileDescriptor
from helpers.paths import ROOT
from helpers.servers import new_key, running
from test_context import CAROLINE, assert_facts, trace_of

from satchel.server.platform.config import Settings
from satchel.v1 import context_pb2, memory_pb2, talent_pb2
from satchel.v1 import context_pb2 as pb

JAVA = ROOT / "clients" / "java"
TARGET = JAVA / "target"
EXAMPLE = "dev.satchel.example.AssembleContext"


def _build() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(JAVA / "build"), "--install"], capture_output=True, text=True, timeout=900
    )


@pytest.fixture(scope="session")
async def java_jar() -> Path:
    """The jar clients/java/build writes (skipped only where its tools cannot be installed)."""
    result = await asyncio.to_thread(_build)
    if result.returncode == 2:
        pytest.skip(f"no Java protobuf/gRPC toolchain on this machine: {result.stderr.strip()}")
    assert result.returncode == 0, f"clients/java/build:\n{result.stdout}\n{result.stderr}"
    (jar,) = TARGET.glob("satchel-java-*[0-9].jar")
    return jar


def _java(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    classpath = (TARGET / "classpath").read_text().strip()
    return subprocess.run(
        ["java", "-cp", classpath, EXAMPLE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def _classes(message: Descriptor, outer: str = "") -> list[str]:
    """The class files of a message and of its nested messages and enums."""
    name = f"{outer}${message.name}" if outer else message.name
    nested = [f"{name}${e.name}" for e in message.enum_types]
    for child in message.nested_types:
        if not child.GetOptions().map_entry:
            nested += _classes(child, name)
    return [name, f"{name}OrBuilder", *nested]


def _expected(file: FileDescriptor) -> set[str]:
    names = {file.GetOptions().java_outer_classname}
    for message in file.message_types_by_name.values():
        names |= set(_classes(message))
    names |= set(file.enum_types_by_name)
    names |= {f"{service}Grpc" for service in file.services_by_name}
    names |= {f"{service}Grpc${service}BlockingStub" for service in file.services_by_name}
    return {f"dev/satchel/v1/{name}.class" for name in names}


def test_java_template_generates_messages_and_services_locally() -> None:
    template = (JAVA / "buf.gen.yaml").read_text()
    assert "protoc_builtin: java" in template and "local: grpc_java_plugin" in template
    assert "remote:" not in template  # nothing is fetched from a plugin registry


async def test_java_jar_has_every_message_enum_and_service(java_jar: Path) -> None:
    with zipfile.ZipFile(java_jar) as jar:
        classes = set(jar.namelist())
    for module in (context_pb2, memory_pb2, talent_pb2):
        missing = _expected(module.DESCRIPTOR) - classes
        assert not missing, sorted(missing)
    sources = java_jar.with_name(java_jar.name.replace(".jar", "-sources.jar"))
    with zipfile.ZipFile(sources) as jar:
        assert "dev/satchel/v1/ContextServiceGrpc.java" in jar.namelist()


async def test_java_example_assembles_context_against_the_server(
    java_jar: Path, address: str, channel: grpc.aio.Channel, project_id: str
) -> None:
    await assert_facts(channel, project_id, CAROLINE)
    query = "Which city did Caroline move to?"
    result = await asyncio.to_thread(_java, address, project_id, "user-1", query)
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    stored = await trace_of(channel, project_id, reply["trace_id"])
    assert stored.query == query
    assert [fact_id for fact_id, _ in reply["facts"]] == [
        d.candidate_id
        for d in stored.decisions
        if d.outcome == pb.DECISION_OUTCOME_INCLUDED and d.candidate_kind == pb.CANDIDATE_KIND_FACT
    ]
    assert reply["facts"][0][1] == "Caroline moved to Lisbon in March 2023"
    assert reply["status"].startswith("PACKET_STATUS_")


async def test_java_example_sends_the_api_key(
    java_jar: Path, settings: Settings, pg_dsn: str
) -> None:
    project = f"java-key-{uuid.uuid4().hex[:12]}"
    key = await asyncio.to_thread(new_key, pg_dsn, project)
    async with running(settings, auth="required") as server:
        target = f"127.0.0.1:{server.port}"
        keyed, bare = await asyncio.gather(
            asyncio.to_thread(_java, target, project, "u", "q?", env={"SATCHEL_API_KEY": key}),
            asyncio.to_thread(_java, target, project, "u", "q?", env={"SATCHEL_API_KEY": ""}),
        )
    assert keyed.returncode == 0, keyed.stderr
    assert json.loads(keyed.stdout)["trace_id"]
    assert bare.returncode == 1 and "UNAUTHENTICATED" in bare.stderr, bare.stderr
