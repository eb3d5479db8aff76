"""Liveness follows the process, readiness the database: a database outage turns readiness
NOT_SERVING while liveness stays SERVING (a liveness probe must not restart every replica)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers.servers import SATCHEL, channel_to, poll, running
from test_faults import crash, dedicated_postgres, restart

from satchel.server.platform.app import LIVENESS_SERVICE, READINESS_SERVICE, SERVICE_NAMES
from satchel.server.platform.config import Settings

pytestmark = pytest.mark.slow

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
READINESS = ("", READINESS_SERVICE, *SERVICE_NAMES)


async def _statuses(health: health_pb2_grpc.HealthStub) -> dict[str, int]:
    names = (*READINESS, LIVENESS_SERVICE)
    replies = await asyncio.gather(
        *(health.Check(health_pb2.HealthCheckRequest(service=n), timeout=5) for n in names)
    )
    return {name: reply.status for name, reply in zip(names, replies, strict=True)}


def _expect(ready: int, alive: int) -> dict[str, int]:
    return {**dict.fromkeys(READINESS, ready), LIVENESS_SERVICE: alive}


async def test_an_outage_turns_readiness_not_liveness_not_serving(
    settings: Settings, test_root: Path
) -> None:
    async with (
        dedicated_postgres(test_root) as pg,
        running(
            settings, database_url=pg.get_uri(), db_probe_seconds=0.25, db_pool_timeout=2.0
        ) as server,
        channel_to(server) as channel,
    ):
        health = health_pb2_grpc.HealthStub(channel)
        assert await _statuses(health) == _expect(SERVING, SERVING)
        await asyncio.to_thread(crash, pg)

        async def ready_is(status: int) -> bool:
            return (await _statuses(health))[READINESS_SERVICE] == status

        assert await poll(lambda: ready_is(NOT_SERVING), timeout=10), "readiness stayed SERVING"
        assert await _statuses(health) == _expect(NOT_SERVING, SERVING)
        # `satchel healthcheck --service` is what an exec probe would run.
        address = f"127.0.0.1:{server.port}"
        for service, rc in ((LIVENESS_SERVICE, 0), (READINESS_SERVICE, 1), ("", 1)):
            proc = await asyncio.create_subprocess_exec(
                SATCHEL,
                "healthcheck",
                "--address",
                address,
                "--service",
                service,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            assert await proc.wait() == rc, service
        await asyncio.to_thread(restart, pg)
        assert await poll(lambda: ready_is(SERVING), timeout=20), "readiness never recovered"
        assert await _statuses(health) == _expect(SERVING, SERVING)
        # Shutting down: liveness too turns NOT_SERVING (and stays so).
        await server.health.enter_graceful_shutdown()
        assert await _statuses(health) == _expect(NOT_SERVING, NOT_SERVING)


async def test_liveness_is_serving_before_the_server_is_ready(settings: Settings) -> None:
    """While the database and model are being prepared the process is alive, not ready."""
    from satchel.server.platform.app import SatchelServer

    server = SatchelServer(settings)
    gate = asyncio.Event()
    prepare = server._prepare_runtime

    async def slow_prepare():  # hold startup until the statuses were read
        await gate.wait()
        return await prepare()

    server._prepare_runtime = slow_prepare  # type: ignore[method-assign]
    starting = asyncio.create_task(server.start())
    try:
        assert await poll(lambda: asyncio.sleep(0, server.port is not None), timeout=30)
        async with channel_to(server) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            assert await poll(lambda: _is_listening(health), timeout=10), (
                "the server never answered health"
            )
            assert await _statuses(health) == _expect(NOT_SERVING, SERVING)
            gate.set()
            await starting
            assert await _statuses(health) == _expect(SERVING, SERVING)
    finally:
        gate.set()
        await asyncio.gather(starting, return_exceptions=True)
        await server.stop()


async def _is_listening(health: health_pb2_grpc.HealthStub) -> bool:
    try:
        await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
        return True
    except grpc.aio.AioRpcError:
        return False
