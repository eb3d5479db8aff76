"""Many satchel replicas behind one SDK client: `round_robin` over a list of addresses, retried
idempotent reads, idempotency keys and WatchTraces across processes, while one replica dies.

Three `satchel serve` processes share the session's database. The SDK client is given the
three addresses (one `ipv4:` target, balanced with `round_robin`). Under a bounded load (three
readers, a writer, a context caller), one replica is frozen (SIGSTOP, so calls pile up in
flight on it) and then killed (SIGKILL): no idempotent read fails (gRPC retries the ones cut on
the survivors), writes repeated by the caller with the same idempotency key exist once each,
and a WatchTraces stream on a surviving replica sees every context call committed anywhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import psycopg
import pytest
from helpers.servers import SATCHEL, logged_port, poll

from satchel.client import (
    AsyncSatchelClient,
    SatchelClient,
    SatchelError,
    channel_target,
    service_config,
)
from satchel.v1 import context_pb2, context_pb2_grpc

pytestmark = pytest.mark.slow

READS = ("ListFacts", "ListEvents", "GetTrace", "ListConflicts")
SUBJECT = "user-1"
WRITER = "writer"


# --- the target and the service config (no server) ---------------------------------------


def test_a_list_of_addresses_is_one_balanced_target() -> None:
    assert channel_target("dns:///satchel.internal:50051") == "dns:///satchel.internal:50051"
    assert channel_target(["satchel.internal:50051"]) == "satchel.internal:50051"
    assert (
        channel_target(("127.0.0.1:50061", "127.0.0.2:50062"))
        == "ipv4:127.0.0.1:50061,127.0.0.2:50062"
    )
    assert channel_target(["[::1]:50061", "[::1]:50062"]) == "ipv6:[::1]:50061,[::1]:50062"
    for bad in (
        [],
        ["a.internal:1", "b.internal:1"],  # host names: one DNS name instead
        ["127.0.0.1:1", "[::1]:2"],  # two families
        ["127.0.0.1", "127.0.0.2:1"],  # no port
        ["::1:1", "::1:2"],  # IPv6 without brackets
    ):
        with pytest.raises(ValueError):
            channel_target(bad)
    config = service_config()
    assert config["loadBalancingConfig"] == [{"round_robin": {}}]
    assert service_config(load_balancing="pick_first")["loadBalancingConfig"] == [
        {"pick_first": {}}
    ]
    with SatchelClient(["127.0.0.1:1", "127.0.0.1:2"]) as client:
        assert client.address == ("127.0.0.1:1", "127.0.0.1:2")
        assert client.target == "ipv4:127.0.0.1:1,127.0.0.1:2"


async def test_a_list_of_tls_addresses_checks_the_name_it_is_given(tmp_path: Path) -> None:
    """An `ipv4:` target has no host name to check a certificate against: docs/scale.md's
    `grpc.ssl_target_name_override` names it (two TLS health servers, balanced)."""
    from grpc_health.v1 import health, health_pb2_grpc
    from helpers.servers import make_certificates

    certs = make_certificates(tmp_path)
    identity = [(certs.server_key.read_bytes(), certs.server_cert.read_bytes())]
    servers, addresses = [], []
    try:
        for _ in range(2):
            server = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
            port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(identity))
            await server.start()
            servers.append(server)
            addresses.append(f"127.0.0.1:{port}")
        trust = grpc.ssl_channel_credentials(certs.ca.read_bytes())
        async with AsyncSatchelClient(addresses, timeout=5, credentials=trust) as unnamed:
            with pytest.raises(SatchelError) as refused:
                await unnamed.health()
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE
        named = [("grpc.ssl_target_name_override", "localhost")]
        async with AsyncSatchelClient(
            addresses, timeout=5, credentials=trust, options=named
        ) as client:
            assert [await client.health() for _ in range(4)] == ["SERVING"] * 4
    finally:
        for server in servers:
            await server.stop(0)


# --- three `satchel serve` processes -------------------------------------------------------


@dataclass
class Replica:
    proc: subprocess.Popen
    log_path: Path
    address: str = ""

    def served(self, methods: tuple[str, ...] = READS) -> int:
        """How many calls of these methods this replica has logged as completed OK."""
        count = 0
        for line in self.log_path.read_text().splitlines():
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            if (
                event.get("event") == "rpc"
                and event.get("code") == "OK"
                and event["method"].rsplit("/", 1)[-1] in methods
            ):
                count += 1
        return count


def _start(pg_dsn: str, root: Path, index: int) -> Replica:
    log_path = root / f"replica-{index}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SATCHEL_")}
    env.update(
        SATCHEL_DATABASE_URL=pg_dsn,
        SATCHEL_DATA_DIR=str(root / f"data-{index}"),
        SATCHEL_LISTEN="127.0.0.1:0",  # loopback only: no keys needed
        SATCHEL_LOG_FORMAT="json",
        SATCHEL_SHUTDOWN_GRACE_SECONDS="5",
    )
    with log_path.open("w") as log_file:
        proc = subprocess.Popen([SATCHEL, "serve"], env=env, stdout=log_file, stderr=log_file)
    return Replica(proc, log_path)


def _stop(replica: Replica) -> int | None:
    """SIGTERM a replica we started and wait; SIGKILL it (None) when it does not stop."""
    proc = replica.proc
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGCONT)  # in case the test stopped it
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


@dataclass
class Load:
    """What the callers saw."""

    reads: list[tuple[float, float, str]] = field(default_factory=list)  # start, end, error
    written: dict[str, str] = field(default_factory=dict)  # idempotency key -> fact id
    write_failures: Counter[str] = field(default_factory=Counter)
    traces: list[str] = field(default_factory=list)
    context_failures: Counter[str] = field(default_factory=Counter)


async def test_killing_a_replica_under_load_loses_no_read_write_or_watched_call(
    pg_dsn: str, project_id: str, tmp_path: Path
) -> None:
    replicas = [_start(pg_dsn, tmp_path, i) for i in range(3)]
    try:
        await _scenario(replicas, pg_dsn, project_id)
    finally:
        codes = await asyncio.gather(*(asyncio.to_thread(_stop, r) for r in replicas))
    survivors = codes[:2]
    assert survivors == [0, 0], [r.log_path.read_text()[-2000:] for r in replicas[:2]]


async def _scenario(replicas: list[Replica], pg_dsn: str, project_id: str) -> None:
    for replica in replicas:
        replica.address = f"127.0.0.1:{await logged_port(replica.proc, replica.log_path)}"
    for replica in replicas:
        async with AsyncSatchelClient(replica.address, timeout=5) as one:

            async def serving(one: AsyncSatchelClient = one, replica: Replica = replica) -> bool:
                assert replica.proc.poll() is None, replica.log_path.read_text()
                try:
                    return await one.health() == "SERVING"
                except SatchelError:
                    return False

            assert await poll(serving, timeout=120, interval=0.2), replica.log_path.read_text()
    watched, victim = replicas[0], replicas[2]

    # A watch on the replica that survives, registered before any context call.
    watch_channel = grpc.aio.insecure_channel(watched.address)
    watch = context_pb2_grpc.ContextServiceStub(watch_channel).WatchTraces(
        context_pb2.WatchTracesRequest(project_id=project_id)
    )
    await watch.initial_metadata()
    seen: list[str] = []

    async def read_watch() -> None:
        async for message in watch:
            assert message.dropped_traces == 0
            if message.HasField("packet"):
                seen.append(message.trace_id)

    watching = asyncio.create_task(read_watch())
    balanced = AsyncSatchelClient([r.address for r in replicas], timeout=10)
    try:
        assert balanced.target.startswith("ipv4:")
        # Seed through the balanced client: facts, an event, a trace to read back.
        for i, city in enumerate(("Lisbon", "Porto", "Oslo")):
            await balanced.assert_fact(project_id, SUBJECT, f"city_{i}", city)
        await balanced.record_event(
            project_id, SUBJECT, "conversation.message", {"text": "I moved to Porto"}
        )
        first = await balanced.assemble_context(project_id, SUBJECT, "Where does she live?")
        load = Load(traces=[first.trace_id])

        # round_robin: once every replica is connected, consecutive calls take turns.
        async def all_connected() -> bool:
            await balanced.list_facts(project_id, SUBJECT)
            return all(r.served(("ListFacts",)) for r in replicas)

        assert await poll(all_connected, timeout=10, interval=0.01)
        before = [r.served() for r in replicas]
        for _ in range(30):
            await balanced.list_facts(project_id, SUBJECT)

        async def logged_30() -> bool:
            return sum(r.served() for r in replicas) - sum(before) >= 30

        assert await poll(logged_30, timeout=5)
        turns = [r.served() - b for r, b in zip(replicas, before, strict=True)]
        assert min(turns) >= 5, f"calls not spread over the replicas: {turns}"

        # A write committed on the victim, repeated after its death with the same key.
        async with AsyncSatchelClient(victim.address, timeout=10) as direct:
            on_victim = await direct.assert_fact(
                project_id, WRITER, "committed_on_victim", "yes", idempotency_key="victim-key"
            )
        assert on_victim.created

        served_before_load = [r.served() for r in replicas]
        killed_at = await _run_load(balanced, project_id, first.trace_id, victim, load)
        served_after_load = [r.served() for r in replicas]

        # Idempotent reads: none failed; some were in flight on the frozen victim and were
        # retried by gRPC on a survivor; every replica served some of the load.
        errors = [error for _, _, error in load.reads if error]
        assert not errors, f"{len(errors)} reads failed: {errors[:3]}"
        cut = [r for r in load.reads if r[0] < killed_at < r[1]]
        assert cut, "no read was in flight on the victim when it died"
        assert load.write_failures, "no write was cut by the kill (and repeated with its key)"
        assert len(load.reads) >= 60, len(load.reads)
        gained = [a - b for a, b in zip(served_after_load, served_before_load, strict=True)]
        assert min(gained) > 0, f"a replica served none of the load: {gained}"
        assert victim.proc.returncode == -signal.SIGKILL

        # Writes: every key exists once, with the id its (possibly repeated) call returned.
        again = await balanced.assert_fact(
            project_id, WRITER, "committed_on_victim", "yes", idempotency_key="victim-key"
        )
        assert not again.created and again.fact.id == on_victim.fact.id
        assert len(load.written) >= 5, load.written
        facts = [
            f
            async for f in balanced.iter_facts(
                project_id, WRITER, include_inactive=True, page_size=100
            )
        ]
        by_predicate = Counter(f.predicate for f in facts)
        assert all(n == 1 for n in by_predicate.values()), f"duplicates: {by_predicate}"
        assert {f.id for f in facts} == {*load.written.values(), on_victim.fact.id}

        # WatchTraces on a survivor: every call committed on any replica, each once.
        with psycopg.connect(pg_dsn) as conn:
            committed = {
                str(row[0])
                for row in conn.execute(
                    "SELECT trace_id FROM context_calls WHERE project_id = %s", (project_id,)
                )
            }
        assert set(load.traces) <= committed, "an acknowledged call was not committed"
        assert len(committed) - len(load.traces) <= sum(load.context_failures.values())

        async def watched_all() -> bool:
            return set(seen) >= committed

        assert await poll(watched_all, timeout=15), (len(seen), len(committed))
        assert sorted(seen) == sorted(committed), "a call announced twice, or one not committed"
    finally:
        await balanced.close()
        watch.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await watch_channel.close()


async def _run_load(
    balanced: AsyncSatchelClient,
    project_id: str,
    trace_id: str,
    victim: Replica,
    load: Load,
) -> float:
    """Three readers, a writer and a context caller for ~3.5 s; the victim is frozen after
    1.5 s, killed 0.5 s later. Returns the monotonic time of the SIGKILL."""
    running = True

    async def reader(n: int) -> None:
        i = n
        while running:
            name = READS[i % len(READS)]
            i += 1
            started = time.monotonic()
            try:
                if name == "ListFacts":
                    await balanced.list_facts(project_id, SUBJECT)
                elif name == "ListEvents":
                    await balanced.list_events(project_id, SUBJECT)
                elif name == "GetTrace":
                    await balanced.get_trace(project_id, trace_id)
                else:
                    await balanced.list_conflicts(project_id, SUBJECT)
                error = ""
            except SatchelError as exc:
                error = f"{name}: {exc.code.name} {exc.message}"
            load.reads.append((started, time.monotonic(), error))

    async def writer() -> None:
        i = 0
        while running:
            key = f"w-{i}"
            for _attempt in range(20):  # the caller's own retries, with the same key
                try:
                    reply = await balanced.assert_fact(
                        project_id, WRITER, f"item_{i}", f"value {i}", idempotency_key=key
                    )
                except SatchelError as exc:
                    assert exc.code == grpc.StatusCode.UNAVAILABLE, exc
                    load.write_failures[key] += 1
                    await asyncio.sleep(0.05)
                    continue
                load.written[key] = reply.fact.id
                break
            else:
                raise AssertionError(f"{key} never written")
            i += 1

    async def context_caller() -> None:
        while running:
            try:
                reply = await balanced.assemble_context(project_id, SUBJECT, "Where does she live?")
            except SatchelError as exc:  # a write: not retried; the caller may repeat it
                assert exc.code == grpc.StatusCode.UNAVAILABLE, exc
                load.context_failures[exc.code.name] += 1
                await asyncio.sleep(0.05)
                continue
            load.traces.append(reply.trace_id)

    tasks = [asyncio.create_task(reader(n)) for n in range(3)]
    tasks += [asyncio.create_task(writer()), asyncio.create_task(context_caller())]
    try:
        await asyncio.sleep(1.5)
        victim.proc.send_signal(signal.SIGSTOP)  # calls routed to it now hang in flight
        await asyncio.sleep(0.5)
        killed_at = time.monotonic()
        victim.proc.kill()
        await asyncio.to_thread(victim.proc.wait, 10)
        await asyncio.sleep(1.5)
    finally:
        running = False
        results = await asyncio.gather(*tasks, return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        raise failures[0]
    return killed_at
