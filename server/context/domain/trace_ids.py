"""Trace ids: UUIDv7 (RFC 9562), whose first 48 bits are the Unix time in milliseconds.

A trace id thus says when its call was made, which is how GetTrace tells a trace that expired
(its day's partition was dropped) from one that never existed.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import UTC, datetime

_VERSION_7 = 0x7 << 76
_VARIANT_RFC = 0b10 << 62


def new_trace_id(now: float | None = None) -> uuid.UUID:
    """A UUIDv7 for the time `now` (seconds since the epoch; default: the clock's)."""
    millis = time.time_ns() // 1_000_000 if now is None else round(now * 1000)
    random = int.from_bytes(os.urandom(10), "big")  # 80 bits, 74 of them used
    rand_a = (random >> 62) & 0xFFF
    rand_b = random & ((1 << 62) - 1)
    return uuid.UUID(int=(millis << 80) | _VERSION_7 | (rand_a << 64) | _VARIANT_RFC | rand_b)


def issued_at(trace_id: uuid.UUID) -> datetime | None:
    """When a UUIDv7 trace id was made; None for any other id (traces from before v7)."""
    if trace_id.version != 7:
        return None
    return datetime.fromtimestamp((trace_id.int >> 80) / 1000, UTC)
