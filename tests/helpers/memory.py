"""Helpers shared by the memory write-path tests (real server, real database, real model)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import psycopg
from google.protobuf import json_format, struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from satchel.v1 import memory_pb2, memory_pb2_grpc


def stub(channel: grpc.aio.Channel) -> memory_pb2_grpc.MemoryServiceStub:
    return memory_pb2_grpc.MemoryServiceStub(channel)


def struct(data: dict[str, Any]) -> struct_pb2.Struct:
    return json_format.ParseDict(data, struct_pb2.Struct())


def value(data: Any) -> struct_pb2.Value:
    return json_format.ParseDict(data, struct_pb2.Value())


def event_request(project_id: str, subject_id: str = "user-1", **fields: Any):
    payload = fields.pop("payload", {"speaker": "user", "text": "hello"})
    return memory_pb2.RecordEventRequest(
        project_id=project_id,
        subject_id=subject_id,
        kind=fields.pop("kind", "conversation.message"),
        payload=struct(payload),
        **fields,
    )


def fact_request(project_id: str, subject_id: str = "user-1", **fields: Any):
    fact_value = fields.pop("value", "fr")
    return memory_pb2.AssertFactRequest(
        project_id=project_id,
        subject_id=subject_id,
        predicate=fields.pop("predicate", "invoice_language"),
        value=value(fact_value),
        **fields,
    )


def error_details(err: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, list[tuple[str, str]], str]:
    """(code, [(field, description)], ErrorInfo reason) of a failed call."""
    status = rpc_status.from_call(err)
    assert status is not None, f"no rich status: {err.code()} {err.details()}"
    violations: list[tuple[str, str]] = []
    reason = ""
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations.extend((v.field, v.description) for v in bad.field_violations)
        elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason = info.reason
    return err.code(), violations, reason


async def expect_error(call: Any) -> tuple[grpc.StatusCode, list[tuple[str, str]], str]:
    """Await a call that must fail; return its code, field violations and reason."""
    try:
        await call
    except grpc.aio.AioRpcError as err:
        return error_details(err)
    raise AssertionError("the call succeeded")


def fields_of(violations: list[tuple[str, str]]) -> list[str]:
    return [field for field, _ in violations]


def _counts(dsn: str, project_id: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM events WHERE project_id = %(p)s),"
            " (SELECT count(*) FROM facts WHERE project_id = %(p)s),"
            " (SELECT count(*) FROM facts WHERE project_id = %(p)s AND status = 'active'),"
            " (SELECT count(*) FROM conflict_sets WHERE project_id = %(p)s),"
            " (SELECT count(*) FROM conflict_sets WHERE project_id = %(p)s AND status = 'open')",
            {"p": project_id},
        ).fetchone()
    assert row is not None
    return dict(zip(("events", "facts", "active", "conflicts", "open"), row, strict=True))


async def row_counts(dsn: str, project_id: str) -> dict[str, int]:
    """Rows of a project, read with psycopg off the event loop."""
    return await asyncio.to_thread(_counts, dsn, project_id)


def _query(dsn: str, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    from pgvector.psycopg import register_vector

    with psycopg.connect(dsn) as conn:
        register_vector(conn)
        return conn.execute(sql, params).fetchall()


async def query(dsn: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run a read-only query on the test database off the event loop."""
    return await asyncio.to_thread(_query, dsn, sql, params)
