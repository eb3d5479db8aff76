"""Read replicas against a real streaming replica: a primary and a standby made from it with
the embedded wheel's own binaries (pg_basebackup, standby mode), replay paused by hand.

A write's consistency token makes it visible to a later read; a read without one reads the
replica as it is; a trace is found right after its call; a dead replica fails over.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import psycopg
import pytest
from helpers.memory import expect_error, fact_request
from helpers.memory import stub as memory_stub
from test_context import SUBJECT, assemble, context_stub

from satchel.client import AsyncSatchelClient
from satchel.server.platform.config import Settings
from satchel.server.platform.storage.replicas import TOKEN
from satchel.v1 import context_pb2 as pb
from satchel.v1 import memory_pb2


@dataclass
class Standby:
    """A streaming replica of the primary, run by the primary's binaries as its user."""

    directory: Path
    bin_path: Path
    user: str | None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@/postgres?host={self.directory}"

    def pg_ctl(self, *args: str) -> None:
        subprocess.run(
            [str(self.bin_path / "pg_ctl"), "-D", str(self.directory), *args],
            check=True,
            user=self.user,
            capture_output=True,
            timeout=60,
        )

    def sql(self, statement: str, *params: object) -> tuple:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(statement, params).fetchone()
        assert row is not None
        return row

    def wait_replayed(self, token: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.sql("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", token)[0]:
            assert time.monotonic() < deadline, "the standby never replayed the write"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def replicated(test_root: Path) -> Iterator[tuple[str, Standby]]:
    """(primary DSN, standby): a migrated primary of its own and a standby streaming from it."""
    from satchel.server.platform.storage.embedded import start_pgserver
    from satchel.server.platform.storage.migrations import apply_migrations

    root = test_root / "replication"
    root.mkdir()
    primary = start_pgserver(root / "primary", cleanup_mode="delete")
    primary_dsn = primary.get_uri()
    apply_migrations(primary_dsn)
    standby = Standby(root / "standby", Path(primary.bin_path), primary.system_user)
    standby.directory.mkdir(mode=0o700)
    if primary.system_user is not None:  # PostgreSQL refuses to run as root
        owner = pwd.getpwnam(primary.system_user)
        for path in (root, standby.directory):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    host = psycopg.conninfo.conninfo_to_dict(primary_dsn)["host"]
    subprocess.run(
        [str(standby.bin_path / "pg_basebackup"), "-D", str(standby.directory), "-h", str(host),
         "-U", "postgres", "-R", "-X", "stream", "-c", "fast"],
        check=True, user=standby.user, capture_output=True, timeout=120,
    )  # fmt: skip
    for copied in standby.directory.glob(".s.PGSQL.*"):  # the primary's socket lock
        copied.unlink()
    (standby.directory / "log").unlink(missing_ok=True)
    with open(standby.directory / "postgresql.auto.conf", "a") as conf:
        conf.write(f"\nunix_socket_directories = '{standby.directory}'\nlisten_addresses = ''\n")
    standby.pg_ctl("-l", str(standby.directory / "log"), "-w", "start")
    assert standby.sql("SELECT pg_is_in_recovery()") == (True,)
    yield primary_dsn, standby
    subprocess.run(
        [str(standby.bin_path / "pg_ctl"), "-D", str(standby.directory), "-m", "immediate",
         "stop"], user=standby.user, capture_output=True, timeout=60,
    )  # fmt: skip
    primary.cleanup()


@pytest.fixture(scope="module")
async def address(settings: Settings, replicated: tuple[str, Standby]) -> AsyncIterator[str]:
    """A server whose reads go to the standby (they wait at most 0.3 s for a token)."""
    from satchel.server.platform.app import SatchelServer

    primary_dsn, standby = replicated
    srv = SatchelServer(
        replace(
            settings,
            database_url=primary_dsn,
            database_read_urls=standby.dsn,
            read_replica_max_wait_seconds=0.3,
        )
    )
    await srv.start()
    try:
        yield f"127.0.0.1:{srv.port}"
    finally:
        await srv.stop()


@pytest.fixture
async def channel(address: str) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(address) as chan:
        yield chan


@pytest.fixture
def paused(replicated: tuple[str, Standby]) -> Iterator[Standby]:
    """The standby with its replay paused for the test."""
    standby = replicated[1]
    standby.sql("SELECT pg_wal_replay_pause()")
    try:
        yield standby
    finally:
        standby.sql("SELECT pg_wal_replay_resume()")


async def remember(channel: grpc.aio.Channel, project_id: str, text: str) -> str:
    """Assert a fact; its consistency token."""
    reply = await memory_stub(channel).AssertFact(
        fact_request(project_id, SUBJECT, predicate="note", value=text, statement=text)
    )
    assert TOKEN.fullmatch(reply.consistency_token), reply.consistency_token
    return reply.consistency_token


async def served(channel: grpc.aio.Channel, project_id: str, **fields: str) -> list[str]:
    reply = await assemble(channel, project_id, "Where does Caroline live?", **fields)
    return [fact.statement for fact in reply.packet.facts]


async def listed(channel: grpc.aio.Channel, project_id: str, **fields: str) -> list[str]:
    reply = await memory_stub(channel).ListFacts(
        memory_pb2.ListFactsRequest(project_id=project_id, subject_id=SUBJECT, **fields)
    )
    return [fact.statement for fact in reply.facts]


def lsn(token: str) -> int:
    high, low = token.split("/")
    return (int(high, 16) << 32) | int(low, 16)


async def test_every_write_returns_a_later_consistency_token(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    first = await remember(channel, project_id, "Caroline moved to Lisbon in March 2023")
    second = await remember(channel, project_id, "Caroline works as a nurse")
    assert lsn(second) > lsn(first)
    deleted = await memory_stub(channel).DeleteSubject(
        memory_pb2.DeleteSubjectRequest(project_id=project_id, subject_id=SUBJECT)
    )
    assert lsn(deleted.consistency_token) > lsn(second)


async def test_a_token_makes_a_write_visible_while_the_replica_lags(
    channel: grpc.aio.Channel, project_id: str, paused: Standby
) -> None:
    lisbon = "Caroline moved to Lisbon in March 2023"
    token = await remember(channel, project_id, lisbon)

    # No token: the replica as it is (its replay stopped before the write).
    assert await served(channel, project_id) == []
    assert await listed(channel, project_id) == []
    # The token: no replica has it within the bound, so the primary answers.
    assert await served(channel, project_id, min_consistency_token=token) == [lisbon]
    assert await listed(channel, project_id, min_consistency_token=token) == [lisbon]

    # A trace is written on the primary: found right after its call, replica or not.
    reply = await assemble(channel, project_id, "Where does Caroline live?")
    trace = await context_stub(channel).GetTrace(
        pb.GetTraceRequest(project_id=project_id, trace_id=reply.trace_id)
    )
    assert trace.trace.trace_id == reply.trace_id


async def test_the_sdk_passes_a_writes_token_to_its_reads(
    address: str, project_id: str, paused: Standby
) -> None:
    lisbon = "Caroline moved to Lisbon in March 2023"
    async with AsyncSatchelClient(address) as client:
        written = await client.assert_fact(project_id, SUBJECT, "note", lisbon, statement=lisbon)
        token = written.consistency_token
        reply = await client.assemble_context(
            project_id, SUBJECT, "Where does Caroline live?", min_consistency_token=token
        )
        assert [fact.statement for fact in reply.packet.facts] == [lisbon]
        page = await client.list_facts(project_id, SUBJECT, min_consistency_token=token)
        assert [fact.statement for fact in page.facts] == [lisbon]
        assert (await client.list_facts(project_id, SUBJECT)).facts == []  # the replica


async def test_a_replica_that_replayed_the_token_serves_the_read(
    channel: grpc.aio.Channel, project_id: str, replicated: tuple[str, Standby]
) -> None:
    standby = replicated[1]
    lisbon = "Caroline moved to Lisbon in March 2023"
    token = await remember(channel, project_id, lisbon)
    standby.wait_replayed(token)
    standby.sql("SELECT pg_wal_replay_pause()")
    try:
        # A later write only the primary has: a read that shows it did not read the replica.
        await remember(channel, project_id, "Caroline lives in Lisbon with her dog Biscuit")
        assert await served(channel, project_id, min_consistency_token=token) == [lisbon]
        assert await listed(channel, project_id, min_consistency_token=token) == [lisbon]
    finally:
        standby.sql("SELECT pg_wal_replay_resume()")


async def test_a_token_that_is_not_one_is_invalid_argument(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    for call in (
        assemble(channel, project_id, "hello", min_consistency_token="0/XYZ"),
        memory_stub(channel).ListFacts(
            memory_pb2.ListFactsRequest(
                project_id=project_id, subject_id=SUBJECT, min_consistency_token="yesterday"
            )
        ),
    ):
        code, violations, _ = await expect_error(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert [field for field, _ in violations] == ["min_consistency_token"]


async def test_a_dead_replica_fails_over_to_the_primary(
    channel: grpc.aio.Channel, project_id: str, replicated: tuple[str, Standby]
) -> None:
    """Last in this module: the standby stays down."""
    standby = replicated[1]
    lisbon = "Caroline moved to Lisbon in March 2023"
    await remember(channel, project_id, lisbon)
    standby.pg_ctl("-m", "immediate", "stop")
    for _ in range(3):  # the call that meets it dead, and those while it is left alone
        assert await served(channel, project_id) == [lisbon]
        assert await listed(channel, project_id) == [lisbon]
    reply = await assemble(channel, project_id, "Where does Caroline live?")
    trace = await context_stub(channel).GetTrace(
        pb.GetTraceRequest(project_id=project_id, trace_id=reply.trace_id)
    )
    assert trace.trace.trace_id == reply.trace_id
    stats = await context_stub(channel).GetStatsOverview(
        pb.GetStatsOverviewRequest(project_id=project_id)
    )
    assert stats.context_calls == 4
