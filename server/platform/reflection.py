"""Server reflection that also resolves method symbols (grpc/grpc#34743).

grpcio-reflection answers ``file_containing_symbol`` through the descriptor pool's
``FindFileContainingSymbol``, which knows messages (nested ones too), fields, oneofs, enums,
enum values and services, but not methods: ghz, Postman and grpcurl ask for
``satchel.v1.ContextService.AssembleContext`` and got NOT_FOUND. The gRPC reflection spec (and
grpc-go, grpc-java) answers any fully-qualified symbol with the file that defines it and that
file's dependencies. This servicer falls back to the method (``Service.Method``) and to an enum
value written under its enum (``pkg.Enum.VALUE``); anything else is NOT_FOUND as before.

Both reflection services are served, as grpc-go serves them: ``v1alpha`` (ghz, Postman,
grpcurl up to 1.8.7) and ``v1`` (grpcurl from 1.8.8 asks it first; some clients ask only it),
the same messages under another package. grpcio-reflection ships v1alpha only, so v1's file is
v1alpha's with the package renamed (identical on the wire), added to the pool, and one servicer
answers both.

Files are served with their comments (``source_code_info``), which ``grpcurl describe`` and
Postman show: the generated ``*_pb2`` descriptors carry none, so each file's comes from the
descriptor set shipped beside the stubs (``satchel/v1/satchel.binpb``, a copy of
``proto/satchel.binpb`` written by ``scripts/generate-stubs``), and only for a file whose
definitions there are exactly the served ones (a stale set never misplaces a comment).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache
from importlib import resources
from typing import Any

import grpc
from google.protobuf import descriptor, descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import _async, _base, reflection_pb2, reflection_pb2_grpc

__all__ = [
    "V1_SERVICE_NAME",
    "ReflectionServicer",
    "documented_files",
    "enable_server_reflection",
    "file_descriptor_proto",
    "find_file_containing_symbol",
    "register_v1_descriptor",
]

V1_FILE = "grpc/reflection/v1/reflection.proto"
V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE_NAME = f"{V1_PACKAGE}.ServerReflection"
V1_OPTIONS = {  # upstream grpc/reflection/v1/reflection.proto's
    "go_package": "google.golang.org/grpc/reflection/grpc_reflection_v1",
    "java_multiple_files": True,
    "java_package": "io.grpc.reflection.v1",
    "java_outer_classname": "ServerReflectionProto",
}
DESCRIPTOR_SET = ("satchel.v1", "satchel.binpb")
"""The package and name of the descriptor set with comments (proto/satchel.binpb's copy)."""


@cache
def documented_files() -> Mapping[str, descriptor_pb2.FileDescriptorProto]:
    """The shipped descriptor set's files by name, with their comments (none when it is absent)."""
    package, name = DESCRIPTOR_SET
    try:
        data = resources.files(package).joinpath(name).read_bytes()
    except OSError:
        return {}
    return {file.name: file for file in descriptor_pb2.FileDescriptorSet.FromString(data).file}


def _definitions(file: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """``file`` without its comments and json names (buf writes every json_name, protoc's Python
    descriptors none; neither moves a comment's path)."""
    bare = descriptor_pb2.FileDescriptorProto()
    bare.CopyFrom(file)
    bare.ClearField("source_code_info")

    def clear(message: descriptor_pb2.DescriptorProto) -> None:
        for field in (*message.field, *message.extension):
            field.ClearField("json_name")
        for nested in message.nested_type:
            clear(nested)

    for message in bare.message_type:
        clear(message)
    for extension in bare.extension:
        extension.ClearField("json_name")
    return bare


def file_descriptor_proto(
    file: descriptor.FileDescriptor,
    documented: Mapping[str, descriptor_pb2.FileDescriptorProto] | None = None,
) -> descriptor_pb2.FileDescriptorProto:
    """``file`` as served: its descriptor, with the comments of the same file in ``documented``
    (default: the shipped descriptor set) when that file defines exactly the same things."""
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    source = (documented_files() if documented is None else documented).get(file.name)
    if source is not None and _definitions(source) == _definitions(proto):
        proto.source_code_info.CopyFrom(source.source_code_info)
    return proto


def find_file_containing_symbol(
    pool: descriptor_pool.DescriptorPool, symbol: str
) -> descriptor.FileDescriptor:
    """The file defining ``symbol`` (any fully-qualified name); ``KeyError`` if none does."""
    try:
        return pool.FindFileContainingSymbol(symbol)
    except KeyError:
        parent, _, name = symbol.rpartition(".")
        if not parent or not name:
            raise
        try:  # a method: its service's file
            return pool.FindMethodByName(symbol).containing_service.file
        except KeyError:
            pass
        try:  # an enum value under its enum (protobuf scopes values beside the enum)
            enum = pool.FindEnumTypeByName(parent)
        except KeyError:
            raise KeyError(symbol) from None
        if name not in enum.values_by_name:
            raise KeyError(symbol) from None
        return enum.file


class ReflectionServicer(_async.ReflectionServicer):  # type: ignore[misc]
    """grpc.aio reflection (v1alpha's messages, v1's too) answering method symbols as well, and
    serving files with their comments."""

    def __init__(
        self, service_names: Iterable[str], pool: descriptor_pool.DescriptorPool | None = None
    ) -> None:
        super().__init__(service_names, pool=pool)
        self._serialized: dict[str, bytes] = {}  # by file name: a pool's files never change

    def _file_response(self, file: descriptor.FileDescriptor, request: Any) -> Any:
        """The file and its transitive dependencies, the file first (as grpcio-reflection)."""
        files: dict[str, descriptor.FileDescriptor] = {}
        _base._collect_transitive_dependencies(file, files)
        blobs = []
        for name, found in files.items():
            if name not in self._serialized:
                self._serialized[name] = file_descriptor_proto(found).SerializeToString()
            blobs.append(self._serialized[name])
        return reflection_pb2.ServerReflectionResponse(
            file_descriptor_response=reflection_pb2.FileDescriptorResponse(
                file_descriptor_proto=blobs
            ),
            original_request=request,
        )

    def _file_by_filename(self, request: Any, filename: str) -> Any:
        try:
            found = self._pool.FindFileByName(filename)
        except KeyError:
            return _base._not_found_error(request)
        return self._file_response(found, request)

    def _file_containing_symbol(self, request: Any, fully_qualified_name: str) -> Any:
        try:
            found = find_file_containing_symbol(self._pool, fully_qualified_name)
        except KeyError:
            return _base._not_found_error(request)
        return self._file_response(found, request)

    def _file_containing_extension(
        self, request: Any, containing_type: str, extension_number: int
    ) -> Any:
        try:
            message = self._pool.FindMessageTypeByName(containing_type)
            extension = self._pool.FindExtensionByNumber(message, extension_number)
            found = self._pool.FindFileContainingSymbol(extension.full_name)
        except KeyError:
            return _base._not_found_error(request)
        return self._file_response(found, request)


def register_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    """Add ``grpc/reflection/v1/reflection.proto`` to ``pool`` unless it is there already."""
    try:
        pool.FindFileByName(V1_FILE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    old, new = f".{proto.package}.", f".{V1_PACKAGE}."
    proto.name, proto.package = V1_FILE, V1_PACKAGE
    proto.ClearField("options")  # v1alpha's are deprecated = true and its own packages
    for key, value in V1_OPTIONS.items():
        setattr(proto.options, key, value)
    for message in proto.message_type:
        for field in message.field:
            if field.HasField("type_name"):
                field.type_name = field.type_name.replace(old, new)
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(old, new)
            method.output_type = method.output_type.replace(old, new)
    pool.Add(proto)


def enable_server_reflection(
    service_names: Iterable[str],
    server: grpc.aio.Server,
    pool: descriptor_pool.DescriptorPool | None = None,
) -> None:
    """Serve reflection (v1alpha and v1) for ``service_names`` and v1's own name on ``server``."""
    register_v1_descriptor(pool or descriptor_pool.Default())
    servicer = ReflectionServicer((*service_names, V1_SERVICE_NAME), pool=pool)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(V1_SERVICE_NAME, {"ServerReflectionInfo": v1}),)
    )
