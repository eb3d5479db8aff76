"""Helpers of the reliability and security tests: extra servers, keys, generic calls, certs."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import psycopg
from google.protobuf.message import Message

from satchel.server.platform.auth import SHOWN_PREFIX_CHARS, generate_key, hash_key
from satchel.server.platform.config import Settings
from satchel.server.platform.storage.keys import create_key
from satchel.v1 import context_pb2, memory_pb2, talent_pb2

SATCHEL = str(Path(sys.executable).parent / "satchel")
FILES = (context_pb2.DESCRIPTOR, memory_pb2.DESCRIPTOR, talent_pb2.DESCRIPTOR)
MODULES = {f.name: m for f, m in zip(FILES, (context_pb2, memory_pb2, talent_pb2), strict=True)}


@dataclass(frozen=True)
class Rpc:
    """One satchel.v1 method: its path, message classes and whether it streams replies."""

    path: str
    request: type[Message]
    response: type[Message]
    streaming: bool

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[1]


def satchel_rpcs() -> list[Rpc]:
    """Every satchel.v1 RPC, from the descriptors (a new RPC is covered without a test edit)."""
    rpcs = []
    for file in FILES:
        module = MODULES[file.name]
        for service in file.services_by_name.values():
            for method in service.methods:
                rpcs.append(
                    Rpc(
                        path=f"/{service.full_name}/{method.name}",
                        request=getattr(module, method.input_type.name),
                        response=getattr(module, method.output_type.name),
                        streaming=method.server_streaming,
                    )
                )
    return rpcs


def bearer(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


async def call_code(
    channel: grpc.aio.Channel,
    rpc: Rpc,
    request: Message | bytes,
    *,
    metadata: tuple[tuple[str, str], ...] = (),
    timeout: float = 30.0,
    read_all: bool = True,
) -> tuple[grpc.StatusCode, str]:
    """Call any RPC with a message or raw bytes; return (code, details). A stream is read to its
    end (or only its first message with `read_all=False`, then cancelled: OK)."""

    def identity(data: bytes) -> bytes:
        return data

    raw = request if isinstance(request, bytes) else request.SerializeToString()
    try:
        if rpc.streaming:
            call = channel.unary_stream(
                rpc.path, request_serializer=identity, response_deserializer=identity
            )(raw, metadata=metadata, timeout=timeout)
            async for _ in call:
                if not read_all:
                    call.cancel()
                    break
        else:
            await channel.unary_unary(
                rpc.path, request_serializer=identity, response_deserializer=identity
            )(raw, metadata=metadata, timeout=timeout)
    except grpc.aio.AioRpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


def new_key(dsn: str, project_id: str | None) -> str:
    """Store a key for a project (None: admin) straight in the database; return the key."""
    key = generate_key()
    with psycopg.connect(dsn, autocommit=True) as conn:
        create_key(
            conn,
            project_id=project_id,
            key_hash=hash_key(key),
            prefix=key[:SHOWN_PREFIX_CHARS],
            name="test",
        )
    return key


@asynccontextmanager
async def running(settings: Settings, **overrides: Any) -> AsyncIterator[Any]:
    """A SatchelServer with these settings overridden, started and stopped around the block."""
    from satchel.server.platform.app import SatchelServer

    server = SatchelServer(replace(settings, **overrides))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@asynccontextmanager
async def channel_to(server: Any) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as chan:
        yield chan


async def satchel_cli(*args: str, env: dict[str, str], timeout: float = 120) -> tuple[int, str]:
    """Run `satchel ARGS` off the event loop; return (exit code, stderr + stdout)."""
    result = await asyncio.to_thread(
        subprocess.run,
        [SATCHEL, *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return result.returncode, result.stderr + result.stdout


async def poll(condition: Any, timeout: float = 15.0, interval: float = 0.05) -> bool:
    """Wait until the async `condition()` holds (False on timeout)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if await condition():
            return True
        await asyncio.sleep(interval)
    return False


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_certificates(directory: Path) -> Certificates:
    """A test CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return path

    def write_cert(cert: x509.Certificate, path: Path) -> Path:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name("satchel test CA"))
        .issuer_name(name("satchel test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(
        common: str, usages: list[x509.ObjectIdentifier], sans: list[x509.GeneralName]
    ) -> tuple:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(common))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return key, builder.sign(ca_key, hashes.SHA256())

    server_key, server_cert = leaf(
        "localhost",
        # clientAuth too: `satchel healthcheck` presents it under mutual TLS.
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client_key, client_cert = leaf("satchel test client", [ExtendedKeyUsageOID.CLIENT_AUTH], [])
    directory.mkdir(parents=True, exist_ok=True)
    return Certificates(
        ca=write_cert(ca_cert, directory / "ca.pem"),
        server_cert=write_cert(server_cert, directory / "server.pem"),
        server_key=write_key(server_key, directory / "server.key"),
        client_cert=write_cert(client_cert, directory / "client.pem"),
        client_key=write_key(client_key, directory / "client.key"),
    )


def embedded_serve_env(data_dir: Path, **settings: str) -> dict[str, str]:
    """The environment of a `satchel serve` subprocess on an embedded database of its own in
    `data_dir`, on a free loopback port, logging JSON: this one's, less its database and auth
    settings, plus `settings`."""
    env = {k: v for k, v in os.environ.items() if k not in ("SATCHEL_DATABASE_URL", "SATCHEL_AUTH")}
    env.update(
        SATCHEL_DATA_DIR=str(data_dir),
        SATCHEL_LISTEN="127.0.0.1:0",
        SATCHEL_LOG_FORMAT="json",
        **settings,
    )
    return env


async def logged_port(proc: subprocess.Popen, log_path: Path, timeout: float = 120) -> int:
    """The port a `satchel serve` subprocess with JSON logs says it listens on (a failure
    showing its log if it exits first or never listens)."""
    port = 0

    async def listening() -> bool:
        nonlocal port
        assert proc.poll() is None, log_path.read_text()
        match = re.search(r'"port": (\d+)', log_path.read_text())
        port = int(match.group(1)) if match else 0
        return bool(port)

    assert await poll(listening, timeout=timeout, interval=0.1), log_path.read_text()
    return port
