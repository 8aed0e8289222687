"""ChatService against the real local model: streaming, cancellation, cited documents."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from devstack.local_llm import LocalLLM
from footnote.v1 import assistants_service_pb2 as apb
from footnote.v1 import assistants_service_pb2_grpc as apb_grpc
from footnote.v1 import chat_service_pb2 as pb
from tests.conftest import running_server
from tests.llm.conftest import busy_slots
from tests.support import bearer, ingest

pytestmark = [pytest.mark.llm, pytest.mark.usefixtures("worker")]

DOCS = {
    "paris.md": b"# France\n\nParis is the capital of France.\n",
    "tokyo.md": b"# Japan\n\nTokyo is the capital of Japan.\n",
}


@pytest.fixture(scope="module")
async def llm_target(settings, llama_server: LocalLLM) -> AsyncIterator[str]:
    configured = settings.model_copy(
        update={
            "llm_base_url": llama_server.base_url,
            "llm_model": llama_server.model_name,
            "llm_timeout_seconds": 120.0,
        }
    )
    async with running_server(configured) as target:
        yield target


@pytest.fixture
async def capitals(channel, docs, api_key) -> str:
    made = await apb_grpc.AssistantsServiceStub(channel).CreateAssistant(
        apb.CreateAssistantRequest(
            assistant=apb.Assistant(
                display_name="capitals",
                # Greedy decoding, so the answer is the same on every run.
                settings=apb.AssistantSettings(temperature=0.0, max_output_tokens=96),
            )
        ),
        metadata=bearer(api_key),
    )
    for name, data in DOCS.items():
        await ingest(docs, api_key, made.id, name, data)
    return made.id


def question(assistant_id: str, text: str) -> pb.CompleteRequest:
    return pb.CompleteRequest(
        assistant_id=assistant_id, messages=[pb.ChatMessage(role=pb.ROLE_USER, content=text)]
    )


async def test_streamed_answer_cites_the_right_documents(llm_chat, api_key, capitals):
    request = question(capitals, "What are the capitals of France and Japan?")
    events = [e async for e in llm_chat.StreamComplete(request, metadata=bearer(api_key))]
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[-1] == "complete" and kinds.count("complete") == 1
    assert kinds.count("delta") > 1, "the answer did not stream"
    complete = events[-1].complete
    text = complete.message.content
    assert "".join(e.delta.content for e in events if e.WhichOneof("event") == "delta") == text
    c = complete.citations
    cited = {s.document_name for s in c.sources if s.index in c.referenced_indices}
    assert cited == {"paris.md", "tokyo.md"}, text
    assert list(c.invalid_indices) == [], text
    assert complete.usage.completion_tokens > 0 and complete.usage.prompt_tokens > 0


async def test_cancelling_the_stream_stops_the_model(llm_chat, api_key, capitals, llama_server):
    call = llm_chat.StreamComplete(
        question(capitals, "Describe France and Japan in as much detail as you can."),
        metadata=bearer(api_key),
    )
    async for event in call:
        if event.WhichOneof("event") == "delta":
            break
    assert await busy_slots(llama_server.base_url) == 1
    call.cancel()
    async with asyncio.timeout(5):
        while await busy_slots(llama_server.base_url):
            await asyncio.sleep(0.1)
