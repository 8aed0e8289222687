"""Assistant records and settings: defaults, validation and storage."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, fields, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import select, text, tuple_
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.db.models import Assistant as AssistantRow
from services.db.models import utcnow
from services.db.session import Reader, fetch
from services.errors import AlreadyExists, InvalidArgument, NotFound
from services.fields import has_control
from services.ids import parse_id
from services.pagination import decode_position, page_size, position_token


class LinkMode(StrEnum):
    NONE = "NONE"
    AUTHENTICATED = "AUTHENTICATED"
    PUBLIC = "PUBLIC"


@dataclass(frozen=True)
class AssistantSettings:
    system_prompt: str = ""
    model: str = ""
    temperature: float = 0.0
    max_output_tokens: int = 512
    enable_rag: bool = True
    enable_citations: bool = True
    citation_link_mode: LinkMode = LinkMode.NONE
    top_k: int = 8
    score_threshold: float = 0.0
    max_sources: int = 10
    excerpt_chars: int = 200
    enable_retrieval_gate: bool = True


SETTING_NAMES = frozenset(f.name for f in fields(AssistantSettings))
DEFAULT_SETTINGS = AssistantSettings()
MAX_NAME_CHARS = 200
MAX_SYSTEM_PROMPT_CHARS = 20_000

# (low, high) bounds, inclusive, for numeric settings.
RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "max_output_tokens": (1, 32_768),
    "top_k": (1, 100),
    "score_threshold": (0.0, 1.0),
    "max_sources": (1, 100),
    "excerpt_chars": (20, 5_000),
}


@dataclass(frozen=True)
class AssistantRecord:
    id: str
    display_name: str
    settings: AssistantSettings
    create_time: datetime
    update_time: datetime


def validate_display_name(name: str) -> str:
    stripped = name.strip()
    if not stripped:
        raise InvalidArgument("assistant.display_name", "display_name must not be empty")
    if len(stripped) > MAX_NAME_CHARS:
        raise InvalidArgument(
            "assistant.display_name", f"display_name must be at most {MAX_NAME_CHARS} characters"
        )
    if has_control(stripped):
        raise InvalidArgument(
            "assistant.display_name", "display_name must not contain control characters"
        )
    return stripped


def apply_settings(base: AssistantSettings, changes: dict[str, Any]) -> AssistantSettings:
    """Returns base with changes applied; a None value resets that setting to its default."""
    values = {
        name: getattr(DEFAULT_SETTINGS, name) if value is None else value
        for name, value in changes.items()
    }
    settings = replace(base, **values)
    validate_settings(settings)
    return settings


def validate_settings(settings: AssistantSettings) -> None:
    for name, (low, high) in RANGES.items():
        value = getattr(settings, name)
        if not low <= value <= high:  # also rejects NaN
            raise InvalidArgument(
                f"assistant.settings.{name}", f"{name} must be between {low:g} and {high:g}"
            )
    if len(settings.system_prompt) > MAX_SYSTEM_PROMPT_CHARS:
        raise InvalidArgument(
            "assistant.settings.system_prompt",
            f"system_prompt must be at most {MAX_SYSTEM_PROMPT_CHARS} characters",
        )
    for name in ("system_prompt", "model"):
        if "\x00" in getattr(settings, name):
            # Postgres text cannot hold NUL; refuse it here rather than fail in SQL.
            raise InvalidArgument(
                f"assistant.settings.{name}", f"{name} must not contain NUL characters"
            )
    if len(settings.model) > 200:
        raise InvalidArgument("assistant.settings.model", "model must be at most 200 characters")


def settings_of(row: AssistantRow) -> AssistantSettings:
    values = {name: getattr(row, name) for name in SETTING_NAMES}
    values["citation_link_mode"] = LinkMode(row.citation_link_mode)
    return AssistantSettings(**values)


def write_settings(row: AssistantRow, settings: AssistantSettings) -> None:
    for name in SETTING_NAMES:
        setattr(row, name, getattr(settings, name))
    row.citation_link_mode = settings.citation_link_mode.value


def to_record(row: AssistantRow) -> AssistantRecord:
    return AssistantRecord(
        id=str(row.id),
        display_name=row.display_name,
        settings=settings_of(row),
        create_time=row.create_time,
        update_time=row.update_time,
    )


def find_row(s: Session, tenant_id: str, assistant_id: str, field: str = "id") -> AssistantRow:
    """The tenant's assistant, or NOT_FOUND exactly as for a missing id."""
    row = s.scalar(
        select(AssistantRow).where(
            AssistantRow.id == parse_id(assistant_id, field), AssistantRow.tenant_id == tenant_id
        )
    )
    if row is None:
        raise NotFound("assistant", assistant_id)
    return row


def same_request(existing: AssistantRow, name: str, settings: AssistantSettings) -> AssistantRecord:
    """AIP-155: the earlier result for the same request, an error for a different one."""
    record = to_record(existing)
    if record.display_name != name or record.settings != settings:
        raise AlreadyExists(
            "request_id was already used to create a different assistant; use a new request_id",
            reason="REQUEST_ID_REUSED",
            metadata={"assistant_id": record.id},
        )
    return record


def create_assistant(
    s: Session,
    tenant_id: str,
    display_name: str,
    settings_changes: dict[str, Any],
    request_id: str = "",
) -> AssistantRecord:
    if len(request_id) > 128 or any(ord(c) < 32 for c in request_id):
        raise InvalidArgument(
            "request_id", "request_id must be at most 128 characters, without control characters"
        )
    name = validate_display_name(display_name)
    settings = apply_settings(DEFAULT_SETTINGS, settings_changes)
    if request_id:
        existing = s.scalar(
            select(AssistantRow).where(
                AssistantRow.tenant_id == tenant_id, AssistantRow.request_id == request_id
            )
        )
        if existing is not None:
            return same_request(existing, name, settings)
    now = utcnow()
    row = AssistantRow(
        id=uuid.uuid4(),
        tenant_id=tenant_id,
        display_name=name,
        request_id=request_id or None,
        create_time=now,
        update_time=now,
    )
    write_settings(row, settings)
    try:
        with s.begin_nested():
            s.add(row)
    except IntegrityError:
        # A concurrent create with the same request_id won the race; return its result.
        winner = s.scalar(
            select(AssistantRow).where(
                AssistantRow.tenant_id == tenant_id, AssistantRow.request_id == request_id
            )
        )
        if winner is None:
            raise
        return same_request(winner, name, settings)
    return to_record(row)


def get_assistant(s: Session, tenant_id: str, assistant_id: str) -> AssistantRecord:
    return to_record(find_row(s, tenant_id, assistant_id))


# The version of an assistant's row: the id of the transaction that wrote it (Postgres's xmin),
# which every UPDATE of the row changes, whatever wrote it. VACUUM's freezing keeps the value
# (since PostgreSQL 9.4 it sets flag bits instead; VACUUM FREEZE left it as it was on the
# stack's Postgres 18), and a change for any other reason would only have the settings read
# again. An answer compares it to the version its remembered settings were read at (chat.early),
# as a column of a statement it runs anyway. Transaction ids wrap around after 2^32; the same id
# would have to come back to the same row, with the process remembering the old settings all
# along, to go unseen.
ROW_VERSION = "xmin::text::bigint"

# What an answer reads of its assistant, without the ORM (see session.fetch).
SETTINGS_SQL = text(
    f"SELECT {', '.join(sorted(SETTING_NAMES))}, {ROW_VERSION} AS version FROM assistants"
    " WHERE id = :id AND tenant_id = :tenant"
)


@dataclass(frozen=True)
class VersionedSettings:
    settings: AssistantSettings
    version: int  # of the row they were read from (ROW_VERSION)


def get_settings(s: Reader, tenant_id: str, assistant_id: str) -> VersionedSettings:
    """The tenant's assistant's settings and their row's version; NOT_FOUND exactly as
    get_assistant."""
    rows = fetch(s, SETTINGS_SQL, {"id": parse_id(assistant_id), "tenant": tenant_id})
    if not rows:
        raise NotFound("assistant", assistant_id)
    return VersionedSettings(settings_of(rows[0]), int(rows[0].version))


def list_assistants(
    s: Session, tenant_id: str, requested_size: int, token: str
) -> tuple[list[AssistantRecord], str]:
    size = page_size(requested_size)
    after = decode_position(token, "assistants")
    query = select(AssistantRow).where(AssistantRow.tenant_id == tenant_id)
    if after is not None:
        query = query.where(tuple_(AssistantRow.create_time, AssistantRow.id) > after)
    rows = s.scalars(
        query.order_by(AssistantRow.create_time, AssistantRow.id).limit(size + 1)
    ).all()
    next_token = ""
    if len(rows) > size:
        rows = rows[:size]
        next_token = position_token("assistants", rows[-1].create_time, rows[-1].id)
    return [to_record(r) for r in rows], next_token


def update_assistant(
    s: Session,
    tenant_id: str,
    assistant_id: str,
    display_name: str | None,
    settings_changes: dict[str, Any],
) -> AssistantRecord:
    """Applies the changes; display_name None leaves the name as it is."""
    row = find_row(s, tenant_id, assistant_id, field="assistant.id")
    settings = apply_settings(settings_of(row), settings_changes)
    if display_name is not None:
        row.display_name = validate_display_name(display_name)
    write_settings(row, settings)
    row.update_time = utcnow()
    s.flush()
    return to_record(row)


def delete_assistant(s: Session, tenant_id: str, assistant_id: str) -> None:
    s.delete(find_row(s, tenant_id, assistant_id))
