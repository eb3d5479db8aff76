"""Trace ids are UUIDv7: they sort by the time they were made, and say that time."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from satchel.server.context.domain.trace_ids import issued_at, new_trace_id


def test_a_trace_id_is_a_version_7_uuid_that_says_when_it_was_made() -> None:
    made = datetime(2026, 12, 3, 18, 30, 0, 123000, tzinfo=UTC)
    trace_id = new_trace_id(made.timestamp())
    assert trace_id.version == 7 and trace_id.variant == uuid.RFC_4122
    assert issued_at(trace_id) == made
    assert str(trace_id).startswith("01a23d2b-a4bb-7")  # 48 bits of milliseconds since the epoch


def test_ids_made_later_sort_later_and_ids_of_one_instant_differ() -> None:
    first, second = new_trace_id(1_000.0), new_trace_id(1_000.001)
    assert first < second
    assert len({new_trace_id(5.0) for _ in range(1000)}) == 1000


def test_an_id_of_another_version_says_no_time() -> None:
    assert issued_at(uuid.uuid4()) is None
