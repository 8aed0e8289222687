"""ConversationsService: history with the citations it was answered with, links signed anew."""

from __future__ import annotations

import dataclasses
from functools import partial

import grpc
from sqlalchemy.orm import Session

from footnote.v1 import chat_service_pb2 as chat_pb
from footnote.v1 import conversations_service_pb2 as pb
from footnote.v1 import conversations_service_pb2_grpc as pb_grpc
from services.assistants.domain import AssistantRecord, get_assistant
from services.chat.convert import citations_to_proto
from services.chat.links import document_links, presented
from services.chat.snapshot import citations_from_json
from services.citations import DocumentVersion, mark_stale
from services.conversations import domain
from services.conversations.domain import ConversationRecord
from services.db.session import Database
from services.documents.links import LinkSigner
from services.rpc import principal, to_timestamp

ROLE_TO_PROTO = {
    "system": chat_pb.ROLE_SYSTEM,
    "user": chat_pb.ROLE_USER,
    "assistant": chat_pb.ROLE_ASSISTANT,
}


def conversation_to_proto(record: ConversationRecord) -> pb.Conversation:
    return pb.Conversation(
        id=record.id,
        assistant_id=record.assistant_id,
        title=record.title,
        message_count=record.message_count,
        create_time=to_timestamp(record.create_time),
        update_time=to_timestamp(record.update_time),
    )


class ConversationsServicer(pb_grpc.ConversationsServiceServicer):
    def __init__(self, db: Database, signer: LinkSigner, public_base_url: str) -> None:
        self.db = db
        self.signer = signer
        self.public_base_url = public_base_url

    async def GetConversation(
        self, request: pb.GetConversationRequest, context: grpc.aio.ServicerContext
    ) -> pb.Conversation:
        record = await self.db.run(
            partial(
                domain.get_conversation,
                tenant_id=principal().tenant_id,
                conversation_id=request.id,
            )
        )
        return conversation_to_proto(record)

    async def ListConversations(
        self, request: pb.ListConversationsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListConversationsResponse:
        records, token = await self.db.run(
            partial(
                domain.list_conversations,
                tenant_id=principal().tenant_id,
                requested_size=request.page_size,
                token=request.page_token,
                assistant_id=request.assistant_id,
            )
        )
        return pb.ListConversationsResponse(
            conversations=[conversation_to_proto(r) for r in records], next_page_token=token
        )

    async def ListMessages(
        self, request: pb.ListMessagesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListMessagesResponse:
        tenant = principal().tenant_id
        conversation, records, token = await self.db.run(
            partial(
                domain.list_messages,
                tenant_id=tenant,
                conversation_id=request.conversation_id,
                requested_size=request.page_size,
                token=request.page_token,
            )
        )
        snapshots = {r.id: citations_from_json(r.citations) for r in records if r.citations}
        document_ids = {s.document_id for c, _ in snapshots.values() for s in c.sources}

        def lookups(s: Session) -> tuple[AssistantRecord, dict[str, DocumentVersion]]:
            assistant = get_assistant(s, tenant, conversation.assistant_id)
            return assistant, domain.current_versions(s, tenant, document_ids)

        assistant, current = await self.db.run(lookups)
        # Links follow the assistant's link mode as it is now, and the whole page is signed
        # in one round trip to the links pool.
        links = await document_links(
            document_ids, assistant.settings.citation_link_mode, self.signer, self.public_base_url
        )
        messages = []
        for record in records:
            message = pb.Message(
                id=record.id,
                conversation_id=record.conversation_id,
                role=ROLE_TO_PROTO.get(record.role, chat_pb.ROLE_UNSPECIFIED),
                content=record.content,
                create_time=to_timestamp(record.create_time),
            )
            if record.id in snapshots:
                stored, style = snapshots[record.id]
                stored = dataclasses.replace(stored, sources=mark_stale(stored.sources, current))
                message.citations.CopyFrom(citations_to_proto(presented(stored, links, style)))
            messages.append(message)
        return pb.ListMessagesResponse(messages=messages, next_page_token=token)
