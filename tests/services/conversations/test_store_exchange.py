"""A new conversation is written in one statement (write_new_conversation): the rows must be
what a reader of history, a replayed request_id and store_exchange's next exchange expect."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from services.assistants.domain import create_assistant
from services.conversations import store
from services.conversations.store import Turn
from services.db.models import Conversation, Message
from services.db.session import Database


def test_a_new_conversation_is_written_whole(db: Database) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    assistant = db.transact(lambda s: create_assistant(s, tenant, "store", {}))
    turns = [Turn("system", "Be brief."), Turn("user", "  What  is\nthe notice period? ")]
    request_id = f"r-{uuid.uuid4().hex}"
    exchange = store.Exchange(
        tenant_id=tenant,
        assistant_id=assistant.id,
        new_turns=turns,
        answer="Thirty days [1].",
        citations=None,
        response={"id": "cmpl-1", "finish_reason": "stop"},
        request_id=request_id,
    )
    new = store.new_conversation(exchange)
    conversation_id, message_id = db.autocommit(
        lambda conn: store.write_new_conversation(conn, new)
    )

    def rows(s):
        conversation = s.get(Conversation, uuid.UUID(conversation_id))
        messages = s.scalars(
            select(Message).where(Message.conversation_id == conversation.id).order_by(Message.seq)
        ).all()
        return (
            store.to_conversation(conversation),
            [
                (m.seq, m.role, m.content, m.request_id, m.citations, m.response, m.tenant_id)
                for m in messages
            ],
            messages[-1].id,
            {m.create_time for m in messages} == {conversation.create_time},
        )

    conversation, messages, last_id, same_time = db.transact(rows)
    assert conversation.title == "What is the notice period?"
    assert conversation.message_count == 3 and conversation.assistant_id == assistant.id
    assert conversation.create_time == conversation.update_time and same_time
    assert messages == [
        (1, "system", "Be brief.", None, None, None, tenant),
        (2, "user", "  What  is\nthe notice period? ", None, None, None, tenant),
        (3, "assistant", "Thirty days [1].", request_id, None,
         {"id": "cmpl-1", "finish_reason": "stop"}, tenant),
    ]  # fmt: skip
    assert str(last_id) == message_id
    # The request_id finds the answer again, and the next exchange continues the numbering.
    stored = db.transact(lambda s: store.find_answer(s, tenant, request_id))
    assert stored is not None and stored.message_id == message_id
    assert stored.response == {"id": "cmpl-1", "finish_reason": "stop"}
    follow_up = store.Exchange(
        tenant_id=tenant,
        assistant_id=assistant.id,
        new_turns=[Turn("user", "And after that?")],
        answer="Nothing.",
        citations={"sources": []},
        response={},
        request_id="",
    )
    db.transact(lambda s: store.store_exchange(s, follow_up, conversation_id))
    assert [(seq, role) for seq, role, *_ in db.transact(rows)[1]] == [
        (1, "system"), (2, "user"), (3, "assistant"), (4, "user"), (5, "assistant"),
    ]  # fmt: skip


def test_a_new_conversation_written_twice_is_there_once(db: Database) -> None:
    # The pipeline writes a new conversation outside a transaction; a connection found dead
    # makes Database run the statement again, which must not store the exchange twice.
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    assistant = db.transact(lambda s: create_assistant(s, tenant, "store", {}))
    exchange = store.Exchange(
        tenant_id=tenant,
        assistant_id=assistant.id,
        new_turns=[Turn("user", "Who signs?")],
        answer="The tenant [1].",
        citations={"sources": []},
        response={},
        request_id=f"r-{uuid.uuid4().hex}",
    )
    new = store.new_conversation(exchange)

    first = db.autocommit(lambda conn: store.write_new_conversation(conn, new))
    second = db.autocommit(lambda conn: store.write_new_conversation(conn, new))

    assert first == second
    conversations, _ = db.transact(lambda s: store.list_conversations(s, tenant, 10, ""))
    assert [c.id for c in conversations] == [first[0]] and conversations[0].message_count == 2
    turns = db.transact(lambda s: store.earlier_turns(s, tenant, first[0], assistant.id))
    assert [(t.role, t.content) for t in turns] == [
        ("user", "Who signs?"),
        ("assistant", "The tenant [1]."),
    ]
    # Only the same rows are skipped: another exchange with the request_id is still refused.
    other = store.new_conversation(exchange)
    with pytest.raises(IntegrityError):
        db.autocommit(lambda conn: store.write_new_conversation(conn, other))
