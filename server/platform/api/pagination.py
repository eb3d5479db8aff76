"""Opaque page tokens for keyset pagination: a small JSON document, signed.

A token pins the instant the first page was read at (so later pages list the same snapshot)
and the sort key of the last row returned; it is bound to the request that produced it by a
fingerprint of the query's other fields, so a token reused with another query is rejected.

A listing ordered by a caller-chosen text id (the talent catalogue) has no snapshot: its token
(`IdPageToken`) holds only the last id returned.

A token is `<document>.<tag>` in URL-safe base64, the tag an HMAC-SHA256 (128 bits) of the
document under the deployment's secret (`satchel_meta`, shared by every replica). A token that
was not issued by the deployment, or was altered, is refused before its document is read: no
forged document (a deep JSON, a far instant) reaches the parser or a query.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from satchel.server.platform.errors import Violations

Row = TypeVar("Row")
Token = TypeVar("Token")

_VERSION = 1
MAX_TOKEN_CHARS = 1536
"""Longer tokens are refused unread (an IdPageToken of a 200-character id fits)."""
_TAG_BYTES = 16


@dataclass(frozen=True)
class PageToken:
    """The decoded state of a listing: its instant and the last row's sort key."""

    at: datetime
    last: tuple[datetime, uuid.UUID]


@dataclass(frozen=True)
class IdPageToken:
    """The decoded state of a listing ordered by a text id: the last id returned."""

    last_id: str


def query_fingerprint(*parts: object) -> str:
    """A short digest of the fields that define a listing (method, scope, filters)."""
    text = json.dumps([str(p) for p in parts], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _tag(secret: bytes, document: bytes) -> bytes:
    return hmac.new(secret, document, hashlib.sha256).digest()[:_TAG_BYTES]


def _seal(secret: bytes, document: dict[str, Any]) -> str:
    """The signed, URL-safe text of a token document."""
    raw = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
    return f"{_b64(raw)}.{_b64(_tag(secret, raw))}"


def _unseal(value: str, secret: bytes) -> Any:
    """The document of a token issued under `secret`; ValueError (or a decoding error) when it
    was not, before the document is parsed."""
    if len(value) > MAX_TOKEN_CHARS:
        raise ValueError("length")
    encoded, _, tag = value.partition(".")
    raw = _unb64(encoded)
    if not hmac.compare_digest(_unb64(tag), _tag(secret, raw)):
        raise ValueError("signature")
    document = json.loads(raw)
    if document.get("v") != _VERSION:
        raise ValueError("version")
    return document


_NOT_A_TOKEN = (binascii.Error, ValueError, TypeError, KeyError, IndexError, AttributeError)


def encode_page_token(secret: bytes, fingerprint: str, token: PageToken) -> str:
    """The opaque `next_page_token` for a page ending at `token.last`."""
    document = {
        "v": _VERSION,
        "q": fingerprint,
        "at": token.at.isoformat(),
        "k": [token.last[0].isoformat(), str(token.last[1])],
    }
    return _seal(secret, document)


def cut_page(
    rows: Sequence[Row],
    limit: int,
    key: Callable[[Row], tuple[datetime, uuid.UUID]],
    *,
    secret: bytes,
    fingerprint: str,
    at: datetime,
) -> tuple[list[Row], str]:
    """The page of `rows` (fetched as `limit` + 1) and the `next_page_token` that continues
    after its last row's `key` ("" when no row is left)."""
    if len(rows) <= limit:
        return list(rows), ""
    page = list(rows[:limit])
    return page, encode_page_token(secret, fingerprint, PageToken(at=at, last=key(page[-1])))


def _open(
    violations: Violations,
    field: str,
    value: str,
    fingerprint: str,
    secret: bytes,
    read: Callable[[Any], Token],
) -> Token | None:
    """`read` the document of a `page_token` (None for the first page, or after adding a
    violation: not a token of this deployment, or of a listing with other parameters)."""
    if not value:
        return None
    try:
        document = _unseal(value, secret)
        token = read(document)
    except _NOT_A_TOKEN:
        violations.add(field, "is not a page token returned by this listing")
        return None
    if document.get("q") != fingerprint:
        violations.add(field, "belongs to a listing with other parameters")
        return None
    return token


def _read_page_token(document: Any) -> PageToken:
    token = PageToken(
        at=datetime.fromisoformat(document["at"]),
        last=(datetime.fromisoformat(document["k"][0]), uuid.UUID(document["k"][1])),
    )
    if token.at.tzinfo is None or token.last[0].tzinfo is None:
        raise ValueError("naive timestamp")
    return token


def decode_page_token(
    violations: Violations, field: str, value: str, fingerprint: str, secret: bytes
) -> PageToken | None:
    """Decode a `page_token` (None for the first page, or after adding a violation)."""
    return _open(violations, field, value, fingerprint, secret, _read_page_token)


def encode_id_page_token(secret: bytes, fingerprint: str, token: IdPageToken) -> str:
    """The opaque `next_page_token` of an id-ordered listing for a page ending at `last_id`."""
    return _seal(secret, {"v": _VERSION, "q": fingerprint, "id": token.last_id})


def _read_id_page_token(document: Any) -> IdPageToken:
    last_id = document["id"]
    if not isinstance(last_id, str) or not last_id:
        raise ValueError("id")
    return IdPageToken(last_id=last_id)


def decode_id_page_token(
    violations: Violations, field: str, value: str, fingerprint: str, secret: bytes
) -> IdPageToken | None:
    """Decode the `page_token` of an id-ordered listing (None for the first page, or after
    adding a violation)."""
    return _open(violations, field, value, fingerprint, secret, _read_id_page_token)
