"""WatchTraces across replicas (LISTEN/NOTIFY + persisted rows), filters, back-pressure,
reconnection and shutdown, against real servers on one real database."""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc
import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers.memory import event_request, expect_error
from helpers.memory import stub as memory_stub
from helpers.servers import SATCHEL, channel_to, logged_port, poll, running
from test_context import CAROLINE, assert_facts, context_stub

from satchel.server.platform.config import Settings
from satchel.v1 import context_pb2 as pb

# A watcher that never reads: no BDP probing, so its HTTP/2 window stays small and fills.
STALLED_OPTIONS = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 16 * 1024)]


@dataclass
class Seen:
    """One call as a watcher received it."""

    trace_id: str
    subject_id: str
    decisions: list[pb.Decision] = field(default_factory=list)
    packet: pb.ContextPacket | None = None
    dropped: int = 0


def watch(channel: grpc.aio.Channel, project_id: str, subject_id: str | None = None):
    request = pb.WatchTracesRequest(project_id=project_id)
    if subject_id is not None:
        request.subject_id = subject_id
    return context_stub(channel).WatchTraces(request)


async def receive(call, calls: int, timeout: float = 20.0) -> list[Seen]:
    """Read a watch until `calls` packets arrived; each call's messages must be contiguous."""
    seen: list[Seen] = []

    async def read() -> None:
        current: Seen | None = None
        while len(seen) < calls:
            message = await call.read()
            assert message is not grpc.aio.EOF, "the watch ended"
            if current is None:
                current = Seen(message.trace_id, message.subject_id)
            assert message.trace_id == current.trace_id, "a call's messages are contiguous"
            current.dropped = message.dropped_traces
            if message.HasField("decision"):
                current.decisions.append(message.decision)
            else:
                current.packet = message.packet
                seen.append(current)
                current = None

    await asyncio.wait_for(read(), timeout)
    return seen


async def stream_call(channel: grpc.aio.Channel, project_id: str, subject_id: str, query: str):
    """A StreamContext call: (trace id, decisions, packet)."""
    request = pb.StreamContextRequest(project_id=project_id, subject_id=subject_id, query=query)
    messages = [m async for m in context_stub(channel).StreamContext(request)]
    decisions = [m.decision for m in messages if m.HasField("decision")]
    return messages[-1].trace_id, decisions, messages[-1].packet


async def test_a_watched_packet_keeps_the_servers_block_layout(
    settings: Settings, project_id: str
) -> None:
    lines = replace(settings.context, block_layout="lines")
    async with running(settings, context=lines) as server, channel_to(server) as channel:
        await assert_facts(channel, project_id, CAROLINE)
        await memory_stub(channel).RecordEvent(
            event_request(project_id, payload={"speaker": "Caroline", "text": "Lisbon is sunny"})
        )
        watcher = watch(channel, project_id)
        await watcher.initial_metadata()
        trace_id, _, packet = await stream_call(channel, project_id, "user-1", "Lisbon?")
        (seen,) = await receive(watcher, 1)
        watcher.cancel()
    assert seen.trace_id == trace_id and seen.packet == packet
    assert packet.episodes and "\n- [" in packet.block, packet.block  # the one-line layout


async def test_a_watcher_on_one_replica_sees_the_calls_of_another_filtered(
    channel: grpc.aio.Channel, project_id: str, start_server
) -> None:
    await assert_facts(channel, project_id, CAROLINE)
    await assert_facts(channel, project_id, CAROLINE[:2], subject_id="user-2")
    await memory_stub(channel).RecordEvent(
        event_request(project_id, payload={"speaker": "Caroline", "text": "Lisbon is sunny"})
    )
    everyone = watch(channel, project_id)
    only_user_2 = watch(channel, project_id, "user-2")
    other_project = watch(channel, project_id + "-other")
    for call in (everyone, only_user_2, other_project):
        await call.initial_metadata()  # the watch is registered

    async with start_server() as replica:
        on_replica = watch(replica, project_id)
        await on_replica.initial_metadata()
        first = await stream_call(replica, project_id, "user-1", "Where does Caroline live?")
        second = await context_stub(replica).AssembleContext(
            pb.AssembleContextRequest(project_id=project_id, subject_id="user-2", query="job?")
        )
        third = await stream_call(channel, project_id, "user-1", "Does Caroline have a pet?")

        seen = await receive(everyone, 3)
        assert [s.trace_id for s in seen] == [first[0], second.trace_id, third[0]]
        assert [s.subject_id for s in seen] == ["user-1", "user-2", "user-1"]
        assert list(seen[0].decisions) == first[1], "the persisted decisions, in order"
        assert seen[0].packet == first[2], "the packet is rebuilt exactly"
        assert any(e.excerpt for e in seen[0].packet.episodes) and seen[0].packet.facts
        assert seen[1].packet == second.packet
        assert all(s.dropped == 0 for s in seen)

        (only,) = await receive(only_user_2, 1)
        assert only.trace_id == second.trace_id

        # The other direction: a watcher on the replica sees calls of the first server.
        seen_on_replica = await receive(on_replica, 3)
        assert [s.trace_id for s in seen_on_replica] == [s.trace_id for s in seen]
        assert seen_on_replica[2].packet == third[2]
        on_replica.cancel()

    # Nothing of this project reached the other project's watcher: the first call it sees
    # is one of its own project.
    _, _, _ = await stream_call(channel, project_id + "-other", "user-1", "anything")
    (own,) = await receive(other_project, 1)
    assert own.subject_id == "user-1" and own.packet is not None
    for call in (everyone, only_user_2, other_project):
        call.cancel()


async def test_a_slow_watcher_never_slows_calls_and_misses_only_whole_calls(
    server, address: str, channel: grpc.aio.Channel, project_id: str
) -> None:
    await assert_facts(channel, project_id, CAROLINE)
    hub = server.runtime.value.traces
    calls = 60

    async def timed_calls(n: int) -> list[float]:
        durations = []
        for i in range(n):
            started = time.perf_counter()
            await context_stub(channel).AssembleContext(
                pb.AssembleContextRequest(
                    project_id=project_id, subject_id="user-1", query=f"Caroline {i}"
                ),
                timeout=10,
            )
            durations.append(time.perf_counter() - started)
        return durations

    baseline = await timed_calls(10)
    dropped_before = hub.stats.dropped
    hub.queue_size, queue_size = 2, hub.queue_size
    try:
        async with grpc.aio.insecure_channel(address, options=STALLED_OPTIONS) as stalled:
            slow = watch(stalled, project_id)
            await slow.initial_metadata()  # registered, and never read while the calls run
            with_watcher = await timed_calls(calls)
            assert statistics.median(with_watcher) <= 3 * statistics.median(baseline) + 0.1
            assert max(with_watcher) < 5.0
            assert hub.stats.dropped > dropped_before, "the stalled watcher fell behind"

            # Now read: every call is either received whole or counted as dropped, once.
            received: list[Seen] = []
            while not received or len(received) + received[-1].dropped < calls:
                received += await receive(slow, 1, timeout=10)
            dropped = received[-1].dropped
            assert dropped > 0 and len(received) + dropped == calls
            assert hub.stats.dropped - dropped_before == dropped
            for seen in received:
                assert seen.packet is not None and seen.packet.facts
                sequences = [d.sequence for d in seen.decisions]
                assert sequences == list(range(1, len(seen.decisions) + 1)), "whole calls only"
            slow.cancel()
    finally:
        hub.queue_size = queue_size


async def test_watchers_take_turns_and_one_that_never_reads_gives_its_turn_away(
    server, address: str, channel: grpc.aio.Channel, project_id: str
) -> None:
    """Many watchers of a busy project: at most one watcher message is being written at a
    time (the others wait for their turn, so the fan-out never crowds other calls out of the
    event loop), and a watcher that never reads holds no turn: the readers get every call."""
    await assert_facts(channel, project_id, CAROLINE)
    turns = server.runtime.value.traces.turns
    turns.most_held, given_away = 0, turns.given_away
    calls = 12
    async with grpc.aio.insecure_channel(address, options=STALLED_OPTIONS) as stalled:
        never_read = [watch(stalled, project_id) for _ in range(4)]
        readers = [watch(channel, project_id) for _ in range(10)]  # 14: under the 16 a client
        await asyncio.gather(*(w.initial_metadata() for w in never_read + readers))
        for i in range(calls):
            await context_stub(channel).AssembleContext(
                pb.AssembleContextRequest(
                    project_id=project_id, subject_id="user-1", query=f"Caroline's job {i}"
                ),
                timeout=20,
            )
        received = await asyncio.gather(*(receive(r, calls, timeout=60) for r in readers))
        assert all(len(seen) == calls and seen[-1].dropped == 0 for seen in received)
        assert turns.most_held == 1
        assert turns.given_away > given_away, "the stalled watchers' writes gave turns away"
        for w in never_read + readers:
            w.cancel()


def _terminate(dsn: str, pid: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


async def test_the_listener_reconnects_and_catches_up_calls_it_missed(
    server, channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    await assert_facts(channel, project_id, CAROLINE[:3])
    hub = server.runtime.value.traces
    reconnects, caught_up = hub.stats.reconnects, hub.stats.caught_up
    watcher = watch(channel, project_id)
    await watcher.initial_metadata()
    hub.reconnect_min, reconnect_min = 1.5, hub.reconnect_min
    try:
        await asyncio.to_thread(_terminate, pg_dsn, hub.listener_pid)
        deadline = time.monotonic() + 10
        while hub.stats.connected:
            assert time.monotonic() < deadline, "the listener did not notice"
            await asyncio.sleep(0.02)
        # Committed while no replica-local listener is connected: only the catch-up sees it.
        missed = await context_stub(channel).AssembleContext(
            pb.AssembleContextRequest(project_id=project_id, subject_id="user-1", query="Caroline")
        )
        assert not hub.stats.connected
        (seen,) = await receive(watcher, 1)
        assert seen.trace_id == missed.trace_id and seen.packet == missed.packet
        assert hub.stats.reconnects == reconnects + 1
        assert hub.stats.caught_up >= caught_up + 1
        # And live notifications flow again on the new connection.
        live = await context_stub(channel).AssembleContext(
            pb.AssembleContextRequest(project_id=project_id, subject_id="user-1", query="nurse")
        )
        (seen,) = await receive(watcher, 1)
        assert seen.trace_id == live.trace_id
    finally:
        hub.reconnect_min = reconnect_min
        watcher.cancel()


async def test_watch_validates_its_request(channel: grpc.aio.Channel) -> None:
    code, violations, _ = await expect_error(watch(channel, "", " padded ").read())
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert {f for f, _ in violations} == {"project_id", "subject_id"}


async def test_stopping_a_replica_ends_its_watches_at_once(project_id: str, settings) -> None:
    from satchel.server.platform.app import SatchelServer

    replica = SatchelServer(settings)
    await replica.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{replica.port}") as chan:
            watcher = watch(chan, project_id)
            await watcher.initial_metadata()
            stopped = time.perf_counter()
            await replica.stop()
            code, _, reason = await expect_error(watcher.read())
            assert code == grpc.StatusCode.UNAVAILABLE and reason == "SHUTTING_DOWN"
            assert time.perf_counter() - stopped < 5, "a watch must not hold the drain"
    finally:
        await replica.stop()


def _stop_process(proc: subprocess.Popen) -> int | None:
    """SIGTERM a replica and wait for its exit code; kill it (None) when it does not stop."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


async def test_a_watcher_sees_the_calls_of_a_replica_in_another_process(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str, tmp_path: Path
) -> None:
    """`satchel serve` as a separate OS process on the same database serves every call; the
    watcher on this process's server receives each call of its project (decisions in order,
    then the packet, with the trace id the other process returned) and none of another."""
    other_project = project_id + "-other"
    everyone = watch(channel, project_id)
    others = watch(channel, other_project)
    for call in (everyone, others):
        await call.initial_metadata()  # the watch is registered

    log_path = tmp_path / "replica.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SATCHEL_")}
    env.update(
        SATCHEL_DATABASE_URL=pg_dsn,
        SATCHEL_DATA_DIR=str(tmp_path / "data"),
        SATCHEL_LISTEN="127.0.0.1:0",
        SATCHEL_LOG_FORMAT="json",
    )
    with log_path.open("w") as log_file:
        proc = subprocess.Popen([SATCHEL, "serve"], env=env, stdout=log_file, stderr=log_file)
    try:
        port = await logged_port(proc, log_path)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as replica:

            async def serving() -> bool:
                assert proc.poll() is None, log_path.read_text()
                try:
                    reply = await health_pb2_grpc.HealthStub(replica).Check(
                        health_pb2.HealthCheckRequest(), timeout=5
                    )
                except grpc.aio.AioRpcError:
                    return False
                return reply.status == health_pb2.HealthCheckResponse.SERVING

            assert await poll(serving, timeout=120, interval=0.2), log_path.read_text()

            # Every write and every call goes to the other process.
            await assert_facts(replica, project_id, CAROLINE)
            await assert_facts(replica, project_id, CAROLINE[:3], subject_id="user-2")
            sunny = {"speaker": "Caroline", "text": "Lisbon is sunny"}
            await memory_stub(replica).RecordEvent(event_request(project_id, payload=sunny))
            await assert_facts(replica, other_project, CAROLINE[:2])

            async def assemble_on_replica(project: str, subject: str, query: str):
                reply = await context_stub(replica).AssembleContext(
                    pb.AssembleContextRequest(project_id=project, subject_id=subject, query=query)
                )
                trace = await context_stub(replica).GetTrace(
                    pb.GetTraceRequest(project_id=project, trace_id=reply.trace_id)
                )
                return reply.trace_id, list(trace.trace.decisions), reply.packet

            # This project's calls interleaved with another project's: a leak would show up
            # between them, in commit order.
            expected = [
                ("user-1", await stream_call(replica, project_id, "user-1", "Where is Caroline?")),
            ]
            elsewhere = [await assemble_on_replica(other_project, "user-1", "Caroline's job?")]
            expected.append(
                ("user-2", await assemble_on_replica(project_id, "user-2", "Caroline's job?"))
            )
            elsewhere.append(await stream_call(replica, other_project, "user-1", "Lisbon?"))
            expected.append(
                ("user-1", await stream_call(replica, project_id, "user-1", "Caroline's pet?"))
            )

            seen = await receive(everyone, len(expected))
            assert [s.trace_id for s in seen] == [call[0] for _, call in expected]
            assert [s.subject_id for s in seen] == [subject for subject, _ in expected]
            for got, (_, (_, decisions, packet)) in zip(seen, expected, strict=True):
                assert decisions and got.decisions == decisions, "the decisions, in order"
                assert [d.sequence for d in got.decisions] == list(range(1, len(decisions) + 1))
                assert got.packet == packet, "the packet the other process returned"
                assert got.packet.facts and got.dropped == 0
            assert any(e.excerpt for s in seen for e in s.packet.episodes)
            # The other project's calls were announced too: only to their own watcher.
            seen_elsewhere = await receive(others, len(elsewhere))
            assert [s.trace_id for s in seen_elsewhere] == [call[0] for call in elsewhere]
            assert not {s.trace_id for s in seen} & {s.trace_id for s in seen_elsewhere}
    finally:
        everyone.cancel()
        others.cancel()
        exit_code = await asyncio.to_thread(_stop_process, proc)
    assert exit_code == 0, log_path.read_text()
