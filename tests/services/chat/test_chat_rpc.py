"""ChatService and ConversationsService end to end with the extractive generator."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import httpx
import pytest
from google.protobuf import field_mask_pb2

from footnote.v1 import assistants_service_pb2 as apb
from footnote.v1 import assistants_service_pb2_grpc as apb_grpc
from footnote.v1 import chat_service_pb2 as pb
from footnote.v1 import chat_service_pb2_grpc as pb_grpc
from footnote.v1 import conversations_service_pb2 as hpb
from footnote.v1 import conversations_service_pb2_grpc as hpb_grpc
from footnote.v1 import documents_service_pb2 as dpb
from footnote.v1 import documents_service_pb2_grpc as dpb_grpc
from tests.support import bearer, error_info, ingest

pytestmark = pytest.mark.usefixtures("worker")

LEAVE = b"""# Leave policy

## Annual leave
Everyone gets 25 days of paid annual leave each year. Unused days expire at the end of March.

## Sick leave
Tell your manager before 10:00 on the first day you are sick.
"""
KITCHEN = b"""# Kitchen

The espresso machine is descaled every Friday. Oat milk is on the second shelf.
"""
QUESTION = "How many days of annual leave do I get each year?"


@pytest.fixture
def chat(channel) -> pb_grpc.ChatServiceStub:
    return pb_grpc.ChatServiceStub(channel)


async def make_assistant(channel, key: str, **settings) -> str:
    stub = apb_grpc.AssistantsServiceStub(channel)
    made = await stub.CreateAssistant(
        apb.CreateAssistantRequest(
            assistant=apb.Assistant(
                display_name="handbook", settings=apb.AssistantSettings(**settings)
            )
        ),
        metadata=bearer(key),
    )
    return made.id


@pytest.fixture
async def corpus(channel, api_key):
    """An assistant with two READY documents; returns (assistant id, {name: Document})."""
    assistant = await make_assistant(channel, api_key)
    docs = dpb_grpc.DocumentsServiceStub(channel)
    leave = await ingest(docs, api_key, assistant, "leave.md", LEAVE)
    kitchen = await ingest(docs, api_key, assistant, "kitchen.md", KITCHEN)
    return assistant, {"leave.md": leave, "kitchen.md": kitchen}


def ask(assistant_id: str, text: str = QUESTION, **kw) -> pb.CompleteRequest:
    return pb.CompleteRequest(
        assistant_id=assistant_id,
        messages=[pb.ChatMessage(role=pb.ROLE_USER, content=text)],
        **kw,
    )


async def stream(chat, key, request) -> tuple[list[pb.StreamCompleteResponse], pb.CompleteResponse]:
    events = [e async for e in chat.StreamComplete(request, metadata=bearer(key))]
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[-1] == "complete" and kinds.count("complete") == 1, kinds
    return events, events[-1].complete


def comparable(response: pb.CompleteResponse) -> pb.CompleteResponse:
    """The response without what differs between two calls: ids and timings."""
    copy = pb.CompleteResponse()
    copy.CopyFrom(response)
    copy.id = copy.conversation_id = copy.message_id = ""
    copy.retrieval.ClearField("duration")
    return copy


async def test_answer_cites_the_right_source_with_provenance(chat, api_key, corpus):
    assistant, docs = corpus
    reply = await chat.Complete(ask(assistant), metadata=bearer(api_key))
    text = reply.message.content
    assert "25 days" in text
    c = reply.citations
    by_index = {s.index: s for s in c.sources}
    assert [s.index for s in c.sources] == list(range(1, len(c.sources) + 1))
    assert c.referenced_indices, text
    for index in c.referenced_indices:
        source = by_index[index]
        assert f"[{index}]" in text
        assert source.document_id == docs["leave.md"].id and source.document_name == "leave.md"
        assert source.document_sha256 == docs["leave.md"].sha256
        assert source.location.heading == "Annual leave"
        assert list(source.location.heading_path) == ["Leave policy", "Annual leave"]
        assert (
            source.location.start_line >= 1
            and source.location.end_line >= source.location.start_line
        )
        assert source.excerpt and source.excerpt.replace("...", "").split()[0] in LEAVE.decode()
        assert 0.0 < source.score <= 1.0
        assert source.indexed_time.seconds > 0 and source.chunk_id
        assert source.download_url == ""  # link mode NONE
    assert list(c.invalid_indices) == []
    for span in c.spans:
        assert text[span.start : span.end].startswith(span.cited_text.split()[0])
        assert set(span.source_indices) <= set(c.referenced_indices)
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.retrieval.chunks_returned > 0 and reply.retrieval.duration.ToNanoseconds() > 0
    assert reply.finish_reason == pb.FINISH_REASON_STOP


async def test_stream_matches_unary(chat, api_key, corpus):
    assistant, _ = corpus
    unary = await chat.Complete(ask(assistant), metadata=bearer(api_key))
    events, complete = await stream(chat, api_key, ask(assistant))
    joined = "".join(e.delta.content for e in events if e.WhichOneof("event") == "delta")
    assert joined == complete.message.content
    assert sum(e.WhichOneof("event") == "delta" for e in events) > 1
    assert comparable(complete) == comparable(unary)
    announced = sorted(
        i for e in events if e.WhichOneof("event") == "citation" for i in e.citation.source_indices
    )
    assert announced == list(complete.citations.referenced_indices)
    for e in events:
        if e.WhichOneof("event") == "citation":
            end = e.citation.offset
            assert joined[:end].endswith("]")


async def test_citations_off_and_rag_off_leave_citations_unset(chat, channel, api_key, corpus):
    assistant, _ = corpus
    off = await chat.Complete(
        ask(assistant, options=pb.CompletionOptions(include_citations=False)),
        metadata=bearer(api_key),
    )
    assert not off.HasField("citations") and "[" not in off.message.content
    assert "25 days" in off.message.content

    no_rag = await make_assistant(channel, api_key, enable_rag=False)
    reply = await chat.Complete(ask(no_rag), metadata=bearer(api_key))
    assert not reply.HasField("citations")
    assert reply.retrieval.skip_reason == pb.RETRIEVAL_SKIP_REASON_RAG_DISABLED
    stored = await hpb_grpc.ConversationsServiceStub(channel).ListMessages(
        hpb.ListMessagesRequest(conversation_id=reply.conversation_id), metadata=bearer(api_key)
    )
    assert [m.HasField("citations") for m in stored.messages] == [False, False]


async def test_changed_settings_win_over_the_search_started_early(chat, channel, api_key, corpus):
    # Each answer starts its search before the assistant is loaded, on the settings the
    # previous answer saw; a search on settings that have changed since must not be used.
    assistant, _ = corpus
    first = await chat.Complete(ask(assistant), metadata=bearer(api_key))
    assert first.retrieval.chunks_returned > 1
    stub = apb_grpc.AssistantsServiceStub(channel)

    async def update(path: str, **settings) -> None:
        await stub.UpdateAssistant(
            apb.UpdateAssistantRequest(
                assistant=apb.Assistant(id=assistant, settings=apb.AssistantSettings(**settings)),
                update_mask=field_mask_pb2.FieldMask(paths=[f"settings.{path}"]),
            ),
            metadata=bearer(api_key),
        )

    await update("top_k", top_k=1)
    narrowed = await chat.Complete(ask(assistant), metadata=bearer(api_key))
    assert narrowed.retrieval.chunks_returned == 1
    await update("enable_rag", enable_rag=False)
    off = await chat.Complete(ask(assistant), metadata=bearer(api_key))
    assert off.retrieval.skip_reason == pb.RETRIEVAL_SKIP_REASON_RAG_DISABLED
    await update("enable_rag", enable_rag=True)
    on = await chat.Complete(ask(assistant), metadata=bearer(api_key))
    assert on.retrieval.chunks_returned == 1 and "25 days" in on.message.content
    # A change the search does not depend on: the early search is used, but not the settings
    # this process remembers, since the search saw the assistant's row change.
    await update("enable_citations", enable_citations=False)
    uncited = await chat.Complete(ask(assistant), metadata=bearer(api_key))
    assert uncited.retrieval.chunks_returned == 1 and not uncited.HasField("citations")
    await update("enable_citations", enable_citations=True)
    cited = await chat.Complete(ask(assistant), metadata=bearer(api_key))
    assert cited.HasField("citations")


async def test_a_deleted_assistant_is_not_found_though_its_settings_are_remembered(
    chat, channel, api_key
):
    assistant = await make_assistant(channel, api_key)
    await chat.Complete(ask(assistant), metadata=bearer(api_key))
    await apb_grpc.AssistantsServiceStub(channel).DeleteAssistant(
        apb.DeleteAssistantRequest(id=assistant), metadata=bearer(api_key)
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await chat.Complete(ask(assistant), metadata=bearer(api_key))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_greeting_skips_retrieval(chat, api_key, corpus):
    assistant, _ = corpus
    reply = await chat.Complete(ask(assistant, "Hello there!"), metadata=bearer(api_key))
    assert reply.retrieval.skip_reason == pb.RETRIEVAL_SKIP_REASON_GATED
    assert reply.retrieval.chunks_returned == 0 and not reply.HasField("citations")


async def test_nothing_retrieved_says_so(chat, channel, api_key):
    empty = await make_assistant(channel, api_key)
    reply = await chat.Complete(ask(empty), metadata=bearer(api_key))
    assert not reply.HasField("citations")
    assert "could not find anything relevant" in reply.message.content


async def test_conversation_history_keeps_citations_and_flags_stale(chat, channel, api_key, corpus):
    assistant, docs = corpus
    first = await chat.Complete(ask(assistant), metadata=bearer(api_key))
    second = await chat.Complete(
        ask(
            assistant,
            "When is the espresso machine descaled?",
            conversation_id=first.conversation_id,
        ),
        metadata=bearer(api_key),
    )
    assert second.conversation_id == first.conversation_id
    history = hpb_grpc.ConversationsServiceStub(channel)
    page = await history.ListMessages(
        hpb.ListMessagesRequest(conversation_id=first.conversation_id), metadata=bearer(api_key)
    )
    roles = [m.role for m in page.messages]
    assert roles == [pb.ROLE_USER, pb.ROLE_ASSISTANT] * 2
    answers = [m for m in page.messages if m.role == pb.ROLE_ASSISTANT]
    assert [m.id for m in answers] == [first.message_id, second.message_id]
    assert answers[0].content == first.message.content
    assert answers[0].citations == first.citations
    assert not any(s.stale for m in answers for s in m.citations.sources)

    conv = await history.GetConversation(
        hpb.GetConversationRequest(id=first.conversation_id), metadata=bearer(api_key)
    )
    assert conv.message_count == 4 and conv.title.startswith("How many days")

    docs_stub = dpb_grpc.DocumentsServiceStub(channel)
    await docs_stub.DeleteDocument(
        dpb.DeleteDocumentRequest(id=docs["leave.md"].id), metadata=bearer(api_key)
    )
    page = await history.ListMessages(
        hpb.ListMessagesRequest(conversation_id=first.conversation_id), metadata=bearer(api_key)
    )
    for source in page.messages[1].citations.sources:
        assert source.stale == (source.document_id == docs["leave.md"].id)


async def test_request_id_replays_the_stored_answer(chat, api_key, corpus):
    assistant, _ = corpus
    rid = str(uuid.uuid4())
    first = await chat.Complete(ask(assistant, request_id=rid), metadata=bearer(api_key))
    again = await chat.Complete(ask(assistant, request_id=rid), metadata=bearer(api_key))
    assert again.message_id == first.message_id and again.id == first.id
    assert again.message.content == first.message.content and again.citations == first.citations
    _, streamed = await stream(chat, api_key, ask(assistant, request_id=rid))
    assert streamed.message_id == first.message_id


async def test_calls_racing_with_one_request_id_store_one_answer(chat, api_key, corpus):
    # Calls sent together with the same request_id each look for a stored answer before any is
    # stored. The first to store its answer wins; a later one that then cannot store its own
    # is ABORTED (never INTERNAL), and sending it again replays the winner's answer.
    assistant, _ = corpus
    await chat.Complete(ask(assistant), metadata=bearer(api_key))  # settings remembered
    for _ in range(3):
        rid = str(uuid.uuid4())
        outcomes = await asyncio.gather(
            *(
                chat.Complete(ask(assistant, request_id=rid), metadata=bearer(api_key))
                for _ in range(6)
            ),
            return_exceptions=True,
        )
        answered = {o.message_id for o in outcomes if isinstance(o, pb.CompleteResponse)}
        assert len(answered) == 1, outcomes
        for failed in (o for o in outcomes if not isinstance(o, pb.CompleteResponse)):
            assert isinstance(failed, grpc.aio.AioRpcError), failed
            assert failed.code() == grpc.StatusCode.ABORTED, failed.details()
            info = error_info(failed)
            assert info.reason == "REQUEST_ID_ANSWERED_CONCURRENTLY"
            assert info.metadata["message_id"] in answered
        again = await chat.Complete(ask(assistant, request_id=rid), metadata=bearer(api_key))
        assert {again.message_id} == answered


async def test_link_modes(chat, channel, api_key, settings):
    docs = dpb_grpc.DocumentsServiceStub(channel)
    history = hpb_grpc.ConversationsServiceStub(channel)
    for mode in (apb.CITATION_LINK_MODE_AUTHENTICATED, apb.CITATION_LINK_MODE_PUBLIC):
        assistant = await make_assistant(channel, api_key, citation_link_mode=mode)
        leave = await ingest(docs, api_key, assistant, "leave.md", LEAVE)
        reply = await chat.Complete(ask(assistant), metadata=bearer(api_key))
        page = await history.ListMessages(
            hpb.ListMessagesRequest(conversation_id=reply.conversation_id),
            metadata=bearer(api_key),
        )
        # The answer and its history both carry links, signed when each was served.
        for citations in (reply.citations, page.messages[1].citations):
            cited = [s for s in citations.sources if s.index in citations.referenced_indices]
            assert cited
            for source in cited:
                if mode == apb.CITATION_LINK_MODE_AUTHENTICATED:
                    assert source.download_url.endswith(f"/v1/documents/{leave.id}/download")
                    assert not source.HasField("download_url_expire_time")
                else:
                    assert source.HasField("download_url_expire_time")
                    async with httpx.AsyncClient(timeout=10) as http:
                        got = await http.get(source.download_url)
                    assert got.status_code == 200 and got.content == LEAVE


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.CompleteRequest(), "assistant_id"),
        (pb.CompleteRequest(assistant_id="ASSISTANT"), "messages"),
        (
            pb.CompleteRequest(
                assistant_id="ASSISTANT",
                messages=[pb.ChatMessage(role=pb.ROLE_ASSISTANT, content="hi")],
            ),
            "messages",
        ),
        (
            pb.CompleteRequest(
                assistant_id="ASSISTANT", messages=[pb.ChatMessage(content="no role")]
            ),
            "messages[0].role",
        ),
        (
            pb.CompleteRequest(
                assistant_id="ASSISTANT",
                messages=[pb.ChatMessage(role=pb.ROLE_USER, content="x" * 40_000)],
            ),
            "messages[0].content",
        ),
        (
            pb.CompleteRequest(
                assistant_id="ASSISTANT",
                messages=[pb.ChatMessage(role=pb.ROLE_USER, content="hi?")],
                options=pb.CompletionOptions(temperature=9),
            ),
            "options.temperature",
        ),
        (
            pb.CompleteRequest(
                assistant_id="ASSISTANT",
                messages=[pb.ChatMessage(role=pb.ROLE_USER, content="nul\x00byte?")],
            ),
            "messages[0].content",
        ),
        (
            pb.CompleteRequest(
                assistant_id="ASSISTANT",
                messages=[pb.ChatMessage(role=pb.ROLE_USER, content="hi?")],
                options=pb.CompletionOptions(citation_style=42),
            ),
            "options.citation_style",
        ),
        (
            pb.CompleteRequest(
                assistant_id="ASSISTANT",
                conversation_id="not-an-id",
                messages=[pb.ChatMessage(role=pb.ROLE_USER, content="hi?")],
            ),
            "conversation_id",
        ),
    ],
)
async def test_bad_requests_name_the_field(chat, channel, api_key, request_, field):
    request = pb.CompleteRequest()
    request.CopyFrom(request_)
    if request.assistant_id == "ASSISTANT":
        request.assistant_id = await make_assistant(channel, api_key)
    for call in (
        chat.Complete(request, metadata=bearer(api_key)),
        chat.StreamComplete(request, metadata=bearer(api_key)).read(),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(err.value).metadata["field"] == field


async def test_foreign_assistant_and_conversation_are_not_found(chat, make_key, api_key, corpus):
    assistant, _ = corpus
    mine = await chat.Complete(ask(assistant), metadata=bearer(api_key))
    stranger = make_key("stranger-" + uuid.uuid4().hex[:6])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await chat.Complete(ask(assistant), metadata=bearer(stranger))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await chat.Complete(
            ask(assistant, conversation_id=mine.conversation_id), metadata=bearer(stranger)
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
