"""Opaque page tokens for keyset pagination: URL-safe base64 of a small JSON document.

A token pins the instant the first page was read at (so later pages list the same snapshot)
and the sort key of the last row returned; it is bound to the request that produced it by a
fingerprint of the query's other fields, so a token reused with another query is rejected.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import datetime

from satchel.server.errors import Violations

_VERSION = 1


@dataclass(frozen=True)
class PageToken:
    """The decoded state of a listing: its instant and the last row's sort key."""

    at: datetime
    last: tuple[datetime, uuid.UUID]


def query_fingerprint(*parts: object) -> str:
    """A short digest of the fields that define a listing (method, scope, filters)."""
    text = json.dumps([str(p) for p in parts], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def encode_page_token(fingerprint: str, token: PageToken) -> str:
    """The opaque `next_page_token` for a page ending at `token.last`."""
    document = {
        "v": _VERSION,
        "q": fingerprint,
        "at": token.at.isoformat(),
        "k": [token.last[0].isoformat(), str(token.last[1])],
    }
    raw = json.dumps(document, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_page_token(
    violations: Violations, field: str, value: str, fingerprint: str
) -> PageToken | None:
    """Decode a `page_token` (None for the first page, or after adding a violation)."""
    if not value:
        return None
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        document = json.loads(raw)
        if document.get("v") != _VERSION:
            raise ValueError("version")
        token = PageToken(
            at=datetime.fromisoformat(document["at"]),
            last=(datetime.fromisoformat(document["k"][0]), uuid.UUID(document["k"][1])),
        )
        if token.at.tzinfo is None or token.last[0].tzinfo is None:
            raise ValueError("naive timestamp")
    except (binascii.Error, ValueError, TypeError, KeyError, IndexError, AttributeError):
        violations.add(field, "is not a page token returned by this listing")
        return None
    if document.get("q") != fingerprint:
        violations.add(field, "belongs to a listing with other parameters")
        return None
    return token
