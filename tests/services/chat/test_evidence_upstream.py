"""Evidence, verdicts, attribution and uncited claims over gRPC, with a scripted upstream.

The upstream reads the numbered sources from the prompt and writes an answer whose markers
point where the script says: at the right source, the wrong one, or none at all.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from footnote.v1 import assistants_service_pb2 as apb
from footnote.v1 import assistants_service_pb2_grpc as apb_grpc
from footnote.v1 import chat_service_pb2 as pb
from footnote.v1 import citations_pb2 as cpb
from footnote.v1 import conversations_service_pb2 as hpb
from footnote.v1 import conversations_service_pb2_grpc as hpb_grpc
from footnote.v1 import documents_service_pb2_grpc as dpb_grpc
from tests.conftest import running_server
from tests.support import bearer, ingest, scripted_upstream, sse

pytestmark = pytest.mark.usefixtures("worker")

DOCS = {
    "paris.md": "# Paris\n\nParis is the capital of France and sits on the Seine. "
    "The city had 2,100,000 inhabitants in 2020.\n",
    "tokyo.md": "# Tokyo\n\nTokyo is the capital of Japan and its largest city.\n",
    "berlin.md": "# Berlin\n\nBerlin is the capital of Germany and sits on the Spree.\n",
    "cafe.md": "# Café\n\nÀ Tōkyō, un café coûte 500 円 ☕ dans la gare.\n",
}
# Each answer piece; {name} becomes the source number the prompt gave that document.
ANSWER = [
    "Hello! ",
    "Paris is the capital of France [{paris}]. ",  # correctly cited
    "Berlin sits on the Spree [{paris}]. ",  # cited to the wrong source
    "Tokyo is the largest city of Japan. ",  # supported, no marker
    "The moon is made of green cheese [{tokyo}]. ",  # fabricated, with a marker
    "The Eiffel Tower was moved to Lyon in 1999. ",  # fabricated, no marker
    "Paris had 3,100,000 inhabitants in 2020 [{paris}]. ",  # a changed number
    "À Tōkyō, un café coûte 500 円 ☕ [{cafe}]. ",  # non-ASCII
    "The documents do not say what a metro ticket costs. ",  # an abstention, not a claim
    "Do you want to know more?",  # a question back, not a claim
]
QUESTION = "Tell me about these cities"
# The prompt gives each source as <source id="N" title="name" ...>.
_SOURCE = re.compile(r'<source id="(\d+)" title="([^"]+)"')


class Upstream:
    def __init__(self) -> None:
        self.numbers: dict[str, int] = {}

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        system = body["messages"][0]["content"]
        self.numbers = {name.removesuffix(".md"): int(n) for n, name in _SOURCE.findall(system)}
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in ANSWER:
            text = piece.format(**self.numbers)
            await response.write(sse({"choices": [{"index": 0, "delta": {"content": text}}]}))
            await asyncio.sleep(0.01)
        await response.write(
            sse(
                {
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 80, "completion_tokens": 60},
                }
            )
        )
        await response.write(b"data: [DONE]\n\n")
        return response


@pytest.fixture(scope="module")
async def upstream() -> AsyncIterator[tuple[Upstream, str]]:
    fake = Upstream()
    async with scripted_upstream(fake.completions) as base_url:
        yield fake, base_url


@pytest.fixture(scope="module")
async def llm_target(settings, upstream) -> AsyncIterator[str]:
    _, base_url = upstream
    configured = settings.model_copy(update={"llm_base_url": base_url, "llm_model": "scripted"})
    async with running_server(configured) as target:
        yield target


@pytest.fixture
async def cities(channel, api_key) -> str:
    made = await apb_grpc.AssistantsServiceStub(channel).CreateAssistant(
        apb.CreateAssistantRequest(
            assistant=apb.Assistant(
                display_name="cities", settings=apb.AssistantSettings(enable_retrieval_gate=False)
            )
        ),
        metadata=bearer(api_key),
    )
    docs = dpb_grpc.DocumentsServiceStub(channel)
    for name, text in DOCS.items():
        await ingest(docs, api_key, made.id, name, text.encode())
    return made.id


def request(assistant: str, **options) -> pb.CompleteRequest:
    return pb.CompleteRequest(
        assistant_id=assistant,
        messages=[pb.ChatMessage(role=pb.ROLE_USER, content=QUESTION)],
        options=pb.CompletionOptions(**options),
    )


async def streamed(llm_chat, key, assistant, **options) -> list[pb.StreamCompleteResponse]:
    return [
        e
        async for e in llm_chat.StreamComplete(request(assistant, **options), metadata=bearer(key))
    ]


def by_sentence(complete: pb.CompleteResponse) -> dict[str, cpb.CitationSpan]:
    return {s.cited_text: s for s in complete.citations.spans}


def sentence(i: int, numbers: dict[str, int]) -> str:
    """The i-th scripted sentence without its marker, as CitationSpan.cited_text has it."""
    return re.sub(r"\s*\[\{\w+\}\]", "", ANSWER[i]).strip()


def check_quote(evidence: cpb.Evidence, source: cpb.CitationSource) -> None:
    text = DOCS[source.document_name]
    loc = evidence.location
    assert evidence.quote
    assert text[loc.start_offset : loc.end_offset] == evidence.quote
    assert text.encode()[loc.start_byte : loc.end_byte] == evidence.quote.encode()
    assert loc.start_line == text.count("\n", 0, loc.start_offset) + 1
    assert 0.0 <= evidence.support_score <= 1.0


async def test_verdicts_attribution_and_uncited_claims(llm_chat, api_key, cities, upstream):
    fake, _ = upstream
    events = await streamed(llm_chat, api_key, cities)
    complete = events[-1].complete
    n = fake.numbers
    c = complete.citations
    sources = {s.index: s for s in c.sources}
    assert {sources[i].document_name for i in sources} == set(DOCS)
    spans = by_sentence(complete)
    text = complete.message.content

    right = spans[sentence(1, n)]
    assert list(right.source_indices) == [n["paris"]]
    assert right.verdict == cpb.SUPPORT_VERDICT_SUPPORTED
    [ev] = right.evidence
    assert (ev.source_index, ev.origin) == (n["paris"], cpb.CITATION_ORIGIN_MODEL)
    assert "Paris is the capital of France" in ev.quote
    check_quote(ev, sources[n["paris"]])

    wrong = spans[sentence(2, n)]
    assert list(wrong.source_indices) == [n["paris"]]
    assert wrong.verdict == cpb.SUPPORT_VERDICT_UNSUPPORTED
    origins = {e.source_index: e.origin for e in wrong.evidence}
    assert origins == {
        n["paris"]: cpb.CITATION_ORIGIN_MODEL,
        n["berlin"]: cpb.CITATION_ORIGIN_ATTRIBUTED,
    }
    for ev in wrong.evidence:
        check_quote(ev, sources[ev.source_index])
    attributed = next(e for e in wrong.evidence if e.origin == cpb.CITATION_ORIGIN_ATTRIBUTED)
    assert attributed.verdict in (cpb.SUPPORT_VERDICT_SUPPORTED, cpb.SUPPORT_VERDICT_PARTIAL)
    assert "Spree" in attributed.quote

    unmarked = spans[sentence(3, n)]
    assert list(unmarked.source_indices) == [n["tokyo"]]
    assert unmarked.verdict == cpb.SUPPORT_VERDICT_SUPPORTED
    assert [e.origin for e in unmarked.evidence] == [cpb.CITATION_ORIGIN_ATTRIBUTED]
    check_quote(unmarked.evidence[0], sources[n["tokyo"]])

    fabricated = spans[sentence(4, n)]
    assert fabricated.verdict == cpb.SUPPORT_VERDICT_UNSUPPORTED
    assert [e.origin for e in fabricated.evidence] == [cpb.CITATION_ORIGIN_MODEL]

    number = spans[sentence(6, n)]
    assert number.verdict == cpb.SUPPORT_VERDICT_UNSUPPORTED
    assert "2,100,000" in number.evidence[0].quote

    accented = spans[sentence(7, n)]
    assert accented.verdict == cpb.SUPPORT_VERDICT_SUPPORTED
    check_quote(accented.evidence[0], sources[n["cafe"]])
    assert accented.evidence[0].location.start_byte > accented.evidence[0].location.start_offset

    # Offsets of every span, in code points and bytes of the answer.
    for span in [*c.spans, *c.uncited_claims]:
        assert span.start_byte == len(text[: span.start].encode())
        assert span.end_byte == len(text[: span.end].encode())
        assert (
            text.encode()[span.start_byte : span.end_byte].decode() == text[span.start : span.end]
        )
    assert accented.end_byte - accented.start_byte > accented.end - accented.start

    # Only the fabricated sentence without a marker is an uncited claim.
    assert [u.cited_text for u in c.uncited_claims] == [sentence(5, n)]
    assert c.uncited_claims[0].verdict == cpb.SUPPORT_VERDICT_UNSUPPORTED
    assert not c.uncited_claims[0].source_indices
    for not_claim in ("Hello!", sentence(8, n), sentence(9, n)):
        assert not_claim not in spans

    assert list(c.referenced_indices) == sorted({n["paris"], n["tokyo"], n["cafe"]})
    assert list(c.attributed_indices) == [n["berlin"]]


async def test_span_events_stream_as_sentences_complete_and_match_unary(llm_chat, api_key, cities):
    events = await streamed(llm_chat, api_key, cities)
    kinds = [e.WhichOneof("event") for e in events]
    complete = events[-1].complete
    span_events = [e.span for e in events if e.WhichOneof("event") == "span"]
    # Every span of the final record was streamed once, in order, before complete.
    assert span_events == list(complete.citations.spans)
    # The first span arrives while the answer is still streaming, not at its end.
    first_span = kinds.index("span")
    assert "delta" in kinds[first_span:]
    unary = await llm_chat.Complete(request(cities), metadata=bearer(api_key))
    assert unary.message.content == complete.message.content
    assert unary.citations.spans == complete.citations.spans
    assert unary.citations.uncited_claims == complete.citations.uncited_claims
    assert unary.citations.attributed_indices == complete.citations.attributed_indices


async def test_attribution_can_be_turned_off(llm_chat, api_key, cities, upstream):
    fake, _ = upstream
    events = await streamed(llm_chat, api_key, cities, enable_attribution=False)
    complete = events[-1].complete
    n = fake.numbers
    spans = by_sentence(complete)
    assert sentence(3, n) not in spans  # supported but unmarked: no longer attributed
    wrong = spans[sentence(2, n)]
    assert [e.origin for e in wrong.evidence] == [cpb.CITATION_ORIGIN_MODEL]
    assert list(complete.citations.attributed_indices) == []
    assert [u.cited_text for u in complete.citations.uncited_claims] == [sentence(5, n)]


async def test_history_keeps_the_evidence(llm_chat, llm_target, api_key, cities):
    unary = await llm_chat.Complete(request(cities), metadata=bearer(api_key))
    import grpc

    async with grpc.aio.insecure_channel(llm_target) as channel:
        page = await hpb_grpc.ConversationsServiceStub(channel).ListMessages(
            hpb.ListMessagesRequest(conversation_id=unary.conversation_id),
            metadata=bearer(api_key),
        )
    stored = page.messages[-1].citations
    assert stored.spans == unary.citations.spans
    assert stored.uncited_claims == unary.citations.uncited_claims
    assert stored.attributed_indices == unary.citations.attributed_indices
