"""Conversations and messages in SQL: loading the earlier turns, storing an exchange."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from services.db.models import Conversation, Message, utcnow
from services.errors import InvalidArgument, NotFound
from services.ids import parse_id

# Earlier turns beyond this many are left out of the prompt.
MAX_HISTORY_MESSAGES = 20
TITLE_CHARS = 80


@dataclass(frozen=True)
class Turn:
    role: str  # "user" or "assistant" (or "system" for request messages)
    content: str


@dataclass(frozen=True)
class StoredAnswer:
    conversation_id: str
    message_id: str
    content: str
    citations: dict[str, Any] | None
    response: dict[str, Any]


def find_conversation(
    s: Session, tenant_id: str, conversation_id: str, field: str = "id"
) -> Conversation:
    row = s.scalar(
        select(Conversation).where(
            Conversation.id == parse_id(conversation_id, field),
            Conversation.tenant_id == tenant_id,
        )
    )
    if row is None:
        raise NotFound("conversation", conversation_id)
    return row


def earlier_turns(
    s: Session, tenant_id: str, conversation_id: str, assistant_id: str
) -> list[Turn]:
    conversation = find_conversation(s, tenant_id, conversation_id, field="conversation_id")
    if str(conversation.assistant_id) != assistant_id:
        raise InvalidArgument("conversation_id", "the conversation belongs to another assistant")
    rows = s.scalars(
        select(Message)
        .where(Message.conversation_id == conversation.id)
        .order_by(Message.seq.desc())
        .limit(MAX_HISTORY_MESSAGES)
    ).all()
    return [Turn(r.role, r.content) for r in reversed(rows)]


def find_answer(s: Session, tenant_id: str, request_id: str) -> StoredAnswer | None:
    row = s.scalar(
        select(Message).where(
            Message.tenant_id == tenant_id,
            Message.request_id == request_id,
            Message.role == "assistant",
        )
    )
    if row is None:
        return None
    return StoredAnswer(
        conversation_id=str(row.conversation_id),
        message_id=str(row.id),
        content=row.content,
        citations=row.citations,
        response=row.response or {},
    )


def store_exchange(
    s: Session,
    *,
    tenant_id: str,
    assistant_id: str,
    conversation_id: str,
    new_turns: Sequence[Turn],
    answer: str,
    citations: dict[str, Any] | None,
    response: dict[str, Any],
    request_id: str,
) -> tuple[str, str]:
    """Appends the request's turns and the answer; returns (conversation id, message id)."""
    now = utcnow()
    if conversation_id:
        conversation = find_conversation(s, tenant_id, conversation_id, field="conversation_id")
        # Lock the conversation so two answers to it get distinct sequence numbers.
        s.refresh(conversation, with_for_update=True)
    else:
        first_question = next((t.content for t in new_turns if t.role == "user"), "")
        conversation = Conversation(
            id=uuid.uuid4(),
            tenant_id=tenant_id,
            assistant_id=uuid.UUID(assistant_id),
            title=" ".join(first_question.split())[:TITLE_CHARS],
            message_count=0,
            create_time=now,
        )
        s.add(conversation)
        s.flush()
    seq = (
        s.scalar(
            select(func.coalesce(func.max(Message.seq), 0)).where(
                Message.conversation_id == conversation.id
            )
        )
        or 0
    )
    for turn in new_turns:
        seq += 1
        s.add(
            Message(
                conversation_id=conversation.id,
                tenant_id=tenant_id,
                seq=seq,
                role=turn.role,
                content=turn.content,
                create_time=now,
            )
        )
    answer_row = Message(
        id=uuid.uuid4(),
        conversation_id=conversation.id,
        tenant_id=tenant_id,
        seq=seq + 1,
        role="assistant",
        content=answer,
        request_id=request_id or None,
        citations=citations,
        response=response,
        create_time=now,
    )
    s.add(answer_row)
    conversation.message_count += len(new_turns) + 1
    conversation.update_time = now
    s.flush()
    return str(conversation.id), str(answer_row.id)
