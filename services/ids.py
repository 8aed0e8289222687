"""Parsing of resource ids taken from requests."""

from __future__ import annotations

import uuid

from services.errors import InvalidArgument


def parse_id(value: str, field: str = "id") -> uuid.UUID:
    if not value:
        raise InvalidArgument(field, f"{field} is required")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidArgument(field, f"{field} is not a valid id") from None
