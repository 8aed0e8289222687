"""Opaque page tokens for keyset pagination, and page size rules shared by every List RPC."""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from datetime import datetime
from typing import Any

from services.errors import InvalidArgument

MAX_PAGE_SIZE = 100


def page_size(requested: int, default: int = 20) -> int:
    if requested < 0:
        raise InvalidArgument("page_size", "page_size must not be negative")
    # AIP-158: a size above the maximum is coerced, not rejected.
    return min(requested or default, MAX_PAGE_SIZE)


def encode_token(kind: str, cursor: dict[str, Any]) -> str:
    raw = json.dumps({"k": kind, **cursor}, separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_token(token: str, kind: str) -> dict[str, Any] | None:
    """The cursor inside a token that encode_token made for this kind of list; None if empty."""
    if not token:
        return None
    try:
        padded = token + "=" * (-len(token) % 4)
        cursor = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        cursor = None
    if not isinstance(cursor, dict) or cursor.pop("k", None) != kind:
        raise InvalidArgument("page_token", "page_token is not a token from this list")
    return cursor


def position_token(kind: str, when: datetime, row_id: uuid.UUID) -> str:
    """A token for lists ordered by (a time, id): it remembers the last row served."""
    return encode_token(kind, {"t": when.isoformat(), "id": str(row_id)})


def decode_position(token: str, kind: str) -> tuple[datetime, uuid.UUID] | None:
    cursor = decode_token(token, kind)
    if cursor is None:
        return None
    try:
        return datetime.fromisoformat(cursor["t"]), uuid.UUID(cursor["id"])
    except (KeyError, TypeError, ValueError):
        raise InvalidArgument("page_token", "page_token is not a token from this list") from None
