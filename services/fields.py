"""Checks of request string fields shared by every API: control characters and media types."""

from __future__ import annotations

import re
import unicodedata

from services.errors import InvalidArgument

# RFC 9110 media type: token "/" token, then parameters; ASCII only.
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
MEDIA_TYPE = re.compile(rf"{_TOKEN}/{_TOKEN}(?:[ \t]*;[ \t]*{_TOKEN}=(?:{_TOKEN}|\"[ -~]*\"))*")
MAX_CONTENT_TYPE_CHARS = 255


def has_control(value: str) -> bool:
    """True for C0 and C1 control characters and DEL, and for unassigned surrogates."""
    return any(unicodedata.category(c) in ("Cc", "Cs") for c in value)


def check_content_type(value: str, field: str) -> str:
    """A media type such as "text/markdown; charset=utf-8", or "" when none was given."""
    value = value.strip()
    if not value:
        return ""
    if len(value) > MAX_CONTENT_TYPE_CHARS:
        raise InvalidArgument(
            field, f"content_type must be at most {MAX_CONTENT_TYPE_CHARS} characters"
        )
    if not value.isascii() or MEDIA_TYPE.fullmatch(value) is None:
        raise InvalidArgument(
            field,
            'content_type must be a media type such as "text/markdown" or '
            '"text/plain; charset=utf-8" (ASCII, no control characters), or empty',
        )
    return value
