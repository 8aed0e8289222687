"""The conversations domain service: history with the citations each answer was given."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from services.assistants.domain import LinkMode, get_assistant
from services.citations import Citations
from services.conversations import store
from services.conversations.presenter import CitationPresenter
from services.conversations.snapshot import citations_from_json
from services.conversations.store import ConversationRecord
from services.db.session import Database


@dataclass(frozen=True)
class HistoryMessage:
    id: str
    conversation_id: str
    role: str
    content: str
    citations: Citations | None
    create_time: datetime


class ConversationService:
    def __init__(self, db: Database, presenter: CitationPresenter) -> None:
        self.db = db
        self.presenter = presenter

    async def get(self, tenant_id: str, conversation_id: str) -> ConversationRecord:
        return await self.db.run(lambda s: store.get_conversation(s, tenant_id, conversation_id))

    async def list(
        self, tenant_id: str, page_size: int, page_token: str, assistant_id: str = ""
    ) -> tuple[list[ConversationRecord], str]:
        return await self.db.run(
            lambda s: store.list_conversations(s, tenant_id, page_size, page_token, assistant_id)
        )

    async def list_messages(
        self, tenant_id: str, conversation_id: str, page_size: int, page_token: str
    ) -> tuple[list[HistoryMessage], str]:
        """A page of messages; answers carry their citations, links signed afresh, and
        `stale` where a document changed or was deleted since."""

        def read(s: Session) -> tuple[LinkMode, list[store.MessageRecord], str]:
            conversation, records, token = store.list_messages(
                s, tenant_id, conversation_id, page_size, page_token
            )
            # Links follow the assistant's link mode as it is now.
            assistant = get_assistant(s, tenant_id, conversation.assistant_id)
            return assistant.settings.citation_link_mode, records, token

        mode, records, token = await self.db.run(read)
        stored = [(r.id, citations_from_json(r.citations)) for r in records if r.citations]
        presented = await self.presenter.present(
            tenant_id, mode, [snapshot for _, snapshot in stored], check_stale=True
        )
        by_message = {message_id: c for (message_id, _), c in zip(stored, presented, strict=True)}
        messages = [
            HistoryMessage(
                id=r.id,
                conversation_id=r.conversation_id,
                role=r.role,
                content=r.content,
                citations=by_message.get(r.id),
                create_time=r.create_time,
            )
            for r in records
        ]
        return messages, token
