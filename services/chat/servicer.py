"""ChatService: converts proto messages to the chat pipeline's types and back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from google.protobuf import duration_pb2
from opentelemetry import trace

from footnote.v1 import chat_service_pb2 as pb
from footnote.v1 import chat_service_pb2_grpc as pb_grpc
from services.chat.pipeline import (
    FIRST_DELTA_EVENT,
    AnswerCitation,
    AnswerComplete,
    AnswerDelta,
    AnswerSpan,
    ChatEngine,
    ChatInput,
    ChatOptions,
    ChatResult,
)
from services.chat.relay import coalesced
from services.citations import CitationStyle
from services.conversations.convert import citations_to_proto, span_to_proto
from services.conversations.store import Turn
from services.errors import InvalidArgument
from services.llm.base import FinishReason, Retrieval
from services.observability.metrics import StreamStats
from services.rpc import principal

ROLE_FROM_PROTO = {pb.ROLE_SYSTEM: "system", pb.ROLE_USER: "user", pb.ROLE_ASSISTANT: "assistant"}
FINISH_TO_PROTO = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.CONTENT_FILTER: pb.FINISH_REASON_CONTENT_FILTER,
}
SKIP_TO_PROTO = {
    Retrieval.RAN: pb.RETRIEVAL_SKIP_REASON_UNSPECIFIED,
    Retrieval.GATED: pb.RETRIEVAL_SKIP_REASON_GATED,
    Retrieval.DISABLED: pb.RETRIEVAL_SKIP_REASON_RAG_DISABLED,
}


def to_input(request: pb.CompleteRequest) -> ChatInput:
    turns = []
    for i, m in enumerate(request.messages):
        role = ROLE_FROM_PROTO.get(m.role)
        if role is None:
            raise InvalidArgument(f"messages[{i}].role", "role must be SYSTEM, USER or ASSISTANT")
        turns.append(Turn(role, m.content))
    o = request.options
    try:
        style = CitationStyle(o.citation_style)
    except ValueError:
        raise InvalidArgument("options.citation_style", "unknown citation_style") from None
    options = ChatOptions(
        include_citations=o.include_citations if o.HasField("include_citations") else None,
        style=style,
        strip_invalid=o.strip_invalid_markers,
        temperature=o.temperature if o.HasField("temperature") else None,
        max_output_tokens=o.max_output_tokens if o.HasField("max_output_tokens") else None,
        attribute=o.enable_attribution if o.HasField("enable_attribution") else None,
    )
    return ChatInput(
        assistant_id=request.assistant_id,
        conversation_id=request.conversation_id,
        messages=turns,
        options=options,
        request_id=request.request_id,
    )


def to_response(result: ChatResult) -> pb.CompleteResponse:
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(int(result.retrieval.duration_seconds * 1e9))
    response = pb.CompleteResponse(
        id=result.id,
        conversation_id=result.conversation_id,
        message_id=result.message_id,
        message=pb.ChatMessage(role=pb.ROLE_ASSISTANT, content=result.text),
        finish_reason=FINISH_TO_PROTO[result.finish_reason],
        usage=pb.Usage(
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            total_tokens=result.prompt_tokens + result.completion_tokens,
        ),
        retrieval=pb.RetrievalInfo(
            duration=duration,
            chunks_returned=result.retrieval.chunks_returned,
            skip_reason=SKIP_TO_PROTO[result.retrieval.mode],
        ),
    )
    if result.citations is not None:
        response.citations.CopyFrom(citations_to_proto(result.citations))
    return response


class ChatServicer(pb_grpc.ChatServiceServicer):
    def __init__(self, engine: ChatEngine) -> None:
        self.engine = engine

    async def Complete(
        self, request: pb.CompleteRequest, context: grpc.aio.ServicerContext
    ) -> pb.CompleteResponse:
        final = None
        async for event in self.engine.answer(principal().tenant_id, to_input(request)):
            if isinstance(event, AnswerComplete):
                final = event.result
        assert final is not None, "the pipeline always ends with a complete event"
        return to_response(final)

    async def StreamComplete(
        self, request: pb.CompleteRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StreamCompleteResponse]:
        events = coalesced(self.engine.answer(principal().tenant_id, to_input(request)))
        stats = StreamStats()
        first = True
        try:
            async for event in events:
                if isinstance(event, AnswerDelta):
                    if first:
                        trace.get_current_span().add_event(FIRST_DELTA_EVENT)
                        first = False
                    stats.delta()
                    yield pb.StreamCompleteResponse(delta=pb.CompletionDelta(content=event.text))
                elif isinstance(event, AnswerCitation):
                    yield pb.StreamCompleteResponse(
                        citation=pb.CitationEvent(source_indices=[event.index], offset=event.offset)
                    )
                elif isinstance(event, AnswerSpan):
                    yield pb.StreamCompleteResponse(span=span_to_proto(event.span))
                elif isinstance(event, AnswerComplete):
                    stats.completed()
                    yield pb.StreamCompleteResponse(complete=to_response(event.result))
        finally:
            # A cancelled client closes this generator; closing the pipeline closes upstream.
            await events.aclose()
