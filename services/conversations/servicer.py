"""ConversationsService: converts proto messages to the conversation service's calls and back."""

from __future__ import annotations

import grpc

from footnote.v1 import chat_service_pb2 as chat_pb
from footnote.v1 import conversations_service_pb2 as pb
from footnote.v1 import conversations_service_pb2_grpc as pb_grpc
from services.conversations.convert import citations_to_proto
from services.conversations.service import ConversationService, HistoryMessage
from services.conversations.store import ConversationRecord
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


def message_to_proto(message: HistoryMessage) -> pb.Message:
    out = pb.Message(
        id=message.id,
        conversation_id=message.conversation_id,
        role=ROLE_TO_PROTO.get(message.role, chat_pb.ROLE_UNSPECIFIED),
        content=message.content,
        create_time=to_timestamp(message.create_time),
    )
    if message.citations is not None:
        out.citations.CopyFrom(citations_to_proto(message.citations))
    return out


class ConversationsServicer(pb_grpc.ConversationsServiceServicer):
    def __init__(self, conversations: ConversationService) -> None:
        self.conversations = conversations

    async def GetConversation(
        self, request: pb.GetConversationRequest, context: grpc.aio.ServicerContext
    ) -> pb.Conversation:
        record = await self.conversations.get(principal().tenant_id, request.id)
        return conversation_to_proto(record)

    async def ListConversations(
        self, request: pb.ListConversationsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListConversationsResponse:
        records, token = await self.conversations.list(
            principal().tenant_id, request.page_size, request.page_token, request.assistant_id
        )
        return pb.ListConversationsResponse(
            conversations=[conversation_to_proto(r) for r in records], next_page_token=token
        )

    async def ListMessages(
        self, request: pb.ListMessagesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListMessagesResponse:
        messages, token = await self.conversations.list_messages(
            principal().tenant_id, request.conversation_id, request.page_size, request.page_token
        )
        return pb.ListMessagesResponse(
            messages=[message_to_proto(m) for m in messages], next_page_token=token
        )
