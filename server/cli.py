"""The `satchel` command. Server commands live here; each one is a small function."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog

from satchel import __version__
from satchel.server.platform.config import ConfigError, Settings, unknown_variables
from satchel.server.platform.logs import configure_logging

log = structlog.get_logger("satchel")


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    """Run the gRPC server (and its worker processes) until SIGTERM or SIGINT."""
    from satchel.server.platform.app import SatchelServer
    from satchel.server.platform.processes import run_until_stopped

    server = SatchelServer(settings)
    signals = (signal.SIGTERM, signal.SIGINT)
    return asyncio.run(run_until_stopped(server.start, server.stop, signals))


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    """Apply pending migrations to SATCHEL_DATABASE_URL (or the embedded database)."""
    from satchel.server.platform.storage.embedded import database_url_or_embedded
    from satchel.server.platform.storage.migrations import apply_migrations

    if not settings.database_url:
        settings.require_embedded_database()
    with database_url_or_embedded(settings.database_url, settings.data_dir) as dsn:
        applied = apply_migrations(dsn)
    print(f"applied {len(applied)} migration(s): {', '.join(applied) or 'none pending'}")
    return 0


def cmd_index_scopes(args: argparse.Namespace, settings: Settings) -> int:
    """Run the scope index maintenance once, now (after a bulk load, say): what a server does
    at start and then every SATCHEL_SCOPE_INDEX_MAINTENANCE_SECONDS."""
    import psycopg

    from satchel.server.context.scope_indexes import ScopeIndexes
    from satchel.server.platform.storage.embedded import database_url_or_embedded

    if not settings.database_url:
        settings.require_embedded_database()
    with database_url_or_embedded(settings.database_url, settings.data_dir) as dsn:
        try:
            outcome = asyncio.run(ScopeIndexes.from_settings(settings, dsn).run_once())
        except psycopg.errors.UndefinedTable:
            print("the database is not migrated: run `satchel migrate` first", file=sys.stderr)
            return 2
    if not outcome.locked:
        print("another server is maintaining the scope indexes: nothing done")
        return 1
    for (project, subject), seconds in outcome.built.items():
        print(f"built   {project}/{subject} in {seconds:.1f} s")
    for project, subject in outcome.dropped:
        print(f"dropped {project}/{subject}")
    print(f"{len(outcome.built)} built, {len(outcome.dropped)} dropped")
    return 0


def cmd_healthcheck(args: argparse.Namespace, settings: Settings) -> int:
    """Exit 0 when the server at --address (default: SATCHEL_ADDRESS, else SATCHEL_LISTEN)
    reports SERVING for --service (default: overall readiness; for container health checks)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from satchel.server.commands.common import server_address

    target = server_address(args)
    try:
        with _health_channel(args, settings, target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            # types-grpcio-health-checking's HealthStub lacks the Check its __init__ sets.
            reply: health_pb2.HealthCheckResponse = stub.Check(  # type: ignore[attr-defined]
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
    except grpc.RpcError as exc:
        print(f"{target}: {exc.code().name}", file=sys.stderr)
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{target}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def _health_channel(args: argparse.Namespace, settings: Settings, target: str) -> Any:
    """A plain channel, or a TLS one when the server has SATCHEL_TLS_CERT: trusting --tls-ca
    (default: SATCHEL_TLS_CERT itself, right for a self-signed certificate or a chain file) and,
    when the server wants client certificates, presenting the server's own key pair."""
    import grpc

    if settings.tls_cert is None or settings.tls_key is None:
        return grpc.insecure_channel(target)
    ca = (args.tls_ca or settings.tls_cert).read_bytes()
    pair: dict[str, bytes] = {}
    if settings.tls_client_ca is not None:
        pair = {
            "private_key": settings.tls_key.read_bytes(),
            "certificate_chain": settings.tls_cert.read_bytes(),
        }
    return grpc.secure_channel(target, grpc.ssl_channel_credentials(ca, **pair))


# Modules that add subcommands: each has `register(commands)` adding parsers whose
# `func(args, settings) -> int` runs the command.
COMMAND_MODULES: tuple[str, ...] = (
    "satchel.server.commands.talents",
    "satchel.server.commands.calibrate",
    "satchel.server.commands.keys",
    "satchel.server.commands.context_cmds",
    "satchel.server.commands.memory_cmds",
    "satchel.server.commands.demo",
    "satchel.server.commands.eval",
    "satchel.server.commands.purge",
    "satchel.server.commands.mcp_cmds",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="satchel", description=__doc__)
    parser.add_argument("--version", action="version", version=f"satchel {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(commands)
    commands.add_parser("serve", help="run the gRPC server").set_defaults(func=cmd_serve)
    commands.add_parser("migrate", help="apply database migrations").set_defaults(func=cmd_migrate)
    commands.add_parser(
        "index-scopes", help="build and drop the large scopes' own indexes now"
    ).set_defaults(func=cmd_index_scopes)
    check = commands.add_parser("healthcheck", help="exit 0 when the server is SERVING")
    check.add_argument(
        "--address",
        help="server host:port (default: SATCHEL_ADDRESS, else SATCHEL_LISTEN, else "
        "127.0.0.1:50051)",
    )
    check.add_argument("--timeout", type=float, default=3.0)
    check.add_argument(
        "--service",
        default="",
        help="health service name: '' or satchel.readiness (follows the database, default), "
        "satchel.liveness (follows the process)",
    )
    check.add_argument("--tls-ca", type=Path, help="CA file to trust (with SATCHEL_TLS_CERT)")
    check.set_defaults(func=cmd_healthcheck)
    return parser


def main(argv: list[str] | None = None) -> int:
    # gRPC's own log lines (fork_posix notices, a failed bind) are not satchel's lines: noise in
    # a terminal, unparsable in a JSON log; what matters reaches satchel as an error it logs
    # itself. Set before gRPC is first imported; GRPC_VERBOSITY, when set, still decides.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        print(f"satchel: configuration error: {exc}", file=sys.stderr)
        return 2
    func: Callable[[argparse.Namespace, Settings], int] = args.func
    # People read the other commands' logs (an in-process server's warnings, say): console
    # lines unless SATCHEL_LOG_FORMAT asks otherwise. The server logs JSON for machines.
    if func is not cmd_serve and not os.environ.get("SATCHEL_LOG_FORMAT"):
        settings = replace(settings, log_format="console")
    configure_logging(settings.log_level, settings.log_format, with_pid=settings.processes > 1)
    for name, closest in unknown_variables():
        hint = f" (did you mean {closest}?)" if closest else ""
        if func is cmd_serve:
            log.warning("unknown_setting", variable=name, did_you_mean=closest)
        else:
            print(f"satchel: warning: {name} is not a satchel setting{hint}", file=sys.stderr)
    try:
        return func(args, settings)
    except ConfigError as exc:
        print(f"satchel: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`satchel context --json | head`): stop quietly, as cat does.
        # Python would still flush stdout at exit into the closed pipe: point it at /dev/null.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
