"""SATCHEL_MAX_CONNECTION_AGE_SECONDS: connections are recycled (GOAWAY), so that replicas added
behind a load balancer get the calls of clients already connected."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers.servers import channel_to, running

from satchel.server.platform.app import grpc_options
from satchel.server.platform.config import ConfigError, Settings


def test_the_option_is_passed_to_grpc() -> None:
    default = dict(grpc_options(Settings.from_env({})))
    assert default["grpc.max_connection_age_ms"] == 300_000  # 5 minutes
    assert "grpc.max_connection_age_grace_ms" not in default  # in-flight calls: no limit
    off = dict(grpc_options(Settings.from_env({"SATCHEL_MAX_CONNECTION_AGE_SECONDS": "0"})))
    assert "grpc.max_connection_age_ms" not in off
    env = {
        "SATCHEL_MAX_CONNECTION_AGE_SECONDS": "1.5",
        "SATCHEL_MAX_CONNECTION_AGE_GRACE_SECONDS": "30",
    }
    tuned = dict(grpc_options(Settings.from_env(env)))
    assert tuned["grpc.max_connection_age_ms"] == 1500
    assert tuned["grpc.max_connection_age_grace_ms"] == 30_000
    with pytest.raises(ConfigError, match="SATCHEL_MAX_CONNECTION_AGE_SECONDS"):
        Settings.from_env({"SATCHEL_MAX_CONNECTION_AGE_SECONDS": "-1"})


async def _state_after(channel: grpc.aio.Channel, seconds: float) -> set:
    """The connectivity states the channel goes through within `seconds`."""
    seen = {channel.get_state()}
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        seen.add(channel.get_state())
        await asyncio.sleep(0.05)
    return seen


async def test_an_old_connection_is_sent_goaway_and_calls_go_on(settings: Settings) -> None:
    ready, idle = grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.IDLE
    async with (
        running(settings, max_connection_age_seconds=1.0) as server,
        channel_to(server) as channel,
    ):
        health = health_pb2_grpc.HealthStub(channel)
        await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert channel.get_state() == ready
        assert idle in await _state_after(channel, 3.0), "the connection was never recycled"
        reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    async with (
        running(settings, max_connection_age_seconds=0.0) as server,
        channel_to(server) as channel,
    ):
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert await _state_after(channel, 2.5) == {ready}
