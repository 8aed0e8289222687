"""Conversations and messages in SQL: storing an exchange, and reading history back.

Conversations list newest first, messages oldest first.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import func, select, text, tuple_
from sqlalchemy.orm import Session

from services.citations import DocumentVersion
from services.db.models import Conversation, Message, utcnow
from services.db.models import Document as DocumentRow
from services.db.session import Reader, fetch
from services.errors import InvalidArgument, NotFound
from services.ids import parse_id
from services.pagination import (
    decode_position,
    decode_token,
    encode_token,
    page_size,
    position_token,
)

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


def answered_request(s: Session, message_id: str) -> tuple[str, str]:
    """(assistant id, question) of the request a stored answer answered, for request_id checks."""
    answer = s.get(Message, uuid.UUID(message_id))
    if answer is None:
        return "", ""
    conversation = s.get(Conversation, answer.conversation_id)
    question = s.scalar(
        select(Message.content)
        .where(
            Message.conversation_id == answer.conversation_id,
            Message.seq < answer.seq,
            Message.role == "user",
        )
        .order_by(Message.seq.desc())
        .limit(1)
    )
    return (str(conversation.assistant_id) if conversation else ""), question or ""


@dataclass(frozen=True)
class Exchange:
    """What one answered request adds to a conversation: its turns and the answer."""

    tenant_id: str
    assistant_id: str
    new_turns: Sequence[Turn]
    answer: str
    citations: dict[str, Any] | None
    response: dict[str, Any]
    request_id: str


def store_exchange(s: Session, exchange: Exchange, conversation_id: str) -> tuple[str, str]:
    """Appends the exchange to the conversation; returns (conversation id, message id). An
    exchange that starts a conversation is written by write_new_conversation."""
    tenant_id, new_turns = exchange.tenant_id, exchange.new_turns
    now = utcnow()
    conversation = find_conversation(s, tenant_id, conversation_id, field="conversation_id")
    # Lock the conversation so two answers to it get distinct sequence numbers.
    s.refresh(conversation, with_for_update=True)
    seq = (
        s.scalar(
            select(func.coalesce(func.max(Message.seq), 0)).where(
                Message.conversation_id == conversation.id
            )
        )
        or 0
    )
    conversation.message_count += len(new_turns) + 1
    conversation.update_time = now
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
        content=exchange.answer,
        request_id=exchange.request_id or None,
        citations=exchange.citations,
        response=exchange.response,
        create_time=now,
    )
    s.add(answer_row)
    s.flush()
    return str(conversation.id), str(answer_row.id)


# A new conversation and all its messages in one statement: one round trip, and none of the
# ORM's unit of work, which was most of the CPU of storing an exchange. The foreign keys are
# checked at the end of the statement, when the conversation is there. Every row's id is chosen
# before the statement runs and a row whose id is there already is skipped, so the statement
# may run again after a connection died without knowing whether it had committed.
NEW_CONVERSATION_SQL = text(
    """
    WITH conversation AS (
      INSERT INTO conversations
        (id, tenant_id, assistant_id, title, message_count, create_time, update_time)
      VALUES (:conversation_id, :tenant_id, :assistant_id, :title, :message_count, :now, :now)
      ON CONFLICT (id) DO NOTHING
    ), turns AS (
      INSERT INTO messages (id, conversation_id, tenant_id, seq, role, content, create_time)
      SELECT t.id, :conversation_id, :tenant_id, t.seq, t.role, t.content, :now
      FROM unnest(CAST(:turn_ids AS uuid[]), CAST(:roles AS text[]), CAST(:contents AS text[]))
        WITH ORDINALITY AS t(id, role, content, seq)
      ON CONFLICT (id) DO NOTHING
    )
    INSERT INTO messages
      (id, conversation_id, tenant_id, seq, role, content, request_id, citations, response,
       create_time)
    VALUES (:answer_id, :conversation_id, :tenant_id, :answer_seq, 'assistant', :answer,
            :request_id, CAST(:citations AS jsonb), CAST(:response AS jsonb), :now)
    ON CONFLICT (id) DO NOTHING
    """
)


@dataclass(frozen=True)
class NewConversation:
    """A new conversation's rows (NEW_CONVERSATION_SQL's parameters), ids and times chosen
    once: written twice, it is there once."""

    params: dict[str, Any]


def new_conversation(exchange: Exchange) -> NewConversation:
    """The rows of a conversation the exchange starts."""
    new_turns = exchange.new_turns
    now = utcnow()
    conversation_id, answer_id = uuid.uuid4(), uuid.uuid4()
    first_question = next((t.content for t in new_turns if t.role == "user"), "")
    return NewConversation(
        {
            "conversation_id": conversation_id,
            "tenant_id": exchange.tenant_id,
            "assistant_id": uuid.UUID(exchange.assistant_id),
            "title": " ".join(first_question.split())[:TITLE_CHARS],
            "message_count": len(new_turns) + 1,
            "now": now,
            "turn_ids": [uuid.uuid4() for _ in new_turns],
            "roles": [t.role for t in new_turns],
            "contents": [t.content for t in new_turns],
            "answer_id": answer_id,
            "answer_seq": len(new_turns) + 1,
            "answer": exchange.answer,
            "request_id": exchange.request_id or None,
            # As the ORM stored them: no citations is JSON null, not SQL NULL. orjson: the same
            # JSON in a tenth of json's time (57 against 5 us for eight sources).
            "citations": orjson.dumps(exchange.citations).decode(),
            "response": orjson.dumps(exchange.response).decode(),
        },
    )


def write_new_conversation(s: Reader, new: NewConversation) -> tuple[str, str]:
    """Writes a new conversation in one statement, which needs no transaction of its own;
    returns (conversation id, message id)."""
    fetch(s, NEW_CONVERSATION_SQL, new.params)
    return str(new.params["conversation_id"]), str(new.params["answer_id"])


@dataclass(frozen=True)
class ConversationRecord:
    id: str
    assistant_id: str
    title: str
    message_count: int
    create_time: datetime
    update_time: datetime


@dataclass(frozen=True)
class MessageRecord:
    id: str
    conversation_id: str
    role: str
    content: str
    citations: dict[str, Any] | None
    create_time: datetime


def to_conversation(row: Conversation) -> ConversationRecord:
    return ConversationRecord(
        id=str(row.id),
        assistant_id=str(row.assistant_id),
        title=row.title,
        message_count=row.message_count,
        create_time=row.create_time,
        update_time=row.update_time,
    )


def get_conversation(s: Session, tenant_id: str, conversation_id: str) -> ConversationRecord:
    return to_conversation(find_conversation(s, tenant_id, conversation_id))


def list_conversations(
    s: Session, tenant_id: str, requested_size: int, token: str, assistant_id: str = ""
) -> tuple[list[ConversationRecord], str]:
    size = page_size(requested_size)
    kind = f"conversations:{assistant_id}"
    after = decode_position(token, kind)
    query = select(Conversation).where(Conversation.tenant_id == tenant_id)
    if assistant_id:
        query = query.where(Conversation.assistant_id == parse_id(assistant_id, "assistant_id"))
    if after is not None:  # newest first, so the next page holds the smaller positions
        query = query.where(tuple_(Conversation.update_time, Conversation.id) < after)
    rows = s.scalars(
        query.order_by(Conversation.update_time.desc(), Conversation.id.desc()).limit(size + 1)
    ).all()
    next_token = ""
    if len(rows) > size:
        rows = rows[:size]
        next_token = position_token(kind, rows[-1].update_time, rows[-1].id)
    return [to_conversation(r) for r in rows], next_token


def list_messages(
    s: Session, tenant_id: str, conversation_id: str, requested_size: int, token: str
) -> tuple[ConversationRecord, list[MessageRecord], str]:
    conversation = find_conversation(s, tenant_id, conversation_id, field="conversation_id")
    size = page_size(requested_size, default=50)
    kind = f"messages:{conversation.id}"
    cursor = decode_token(token, kind)
    query = select(Message).where(Message.conversation_id == conversation.id)
    if cursor is not None:
        seq = cursor.get("seq")
        if not isinstance(seq, int):
            raise InvalidArgument("page_token", "page_token is not a token from this list")
        query = query.where(Message.seq > seq)
    rows = s.scalars(query.order_by(Message.seq).limit(size + 1)).all()
    next_token = ""
    if len(rows) > size:
        rows = rows[:size]
        next_token = encode_token(kind, {"seq": rows[-1].seq})
    records = [
        MessageRecord(
            id=str(r.id),
            conversation_id=str(r.conversation_id),
            role=r.role,
            content=r.content,
            citations=r.citations,
            create_time=r.create_time,
        )
        for r in rows
    ]
    return to_conversation(conversation), records, next_token


def current_versions(
    s: Session, tenant_id: str, document_ids: Iterable[str]
) -> dict[str, DocumentVersion]:
    """The live documents among the ids; a deleted or missing one is simply absent."""
    ids = [uuid.UUID(i) for i in set(document_ids)]
    if not ids:
        return {}
    rows = s.execute(
        select(DocumentRow.id, DocumentRow.sha256, DocumentRow.indexed_time).where(
            DocumentRow.id.in_(ids),
            DocumentRow.tenant_id == tenant_id,
            DocumentRow.delete_time.is_(None),
        )
    ).all()
    return {
        str(r.id): DocumentVersion(
            document_id=str(r.id), sha256=r.sha256, indexed_time=r.indexed_time
        )
        for r in rows
    }
