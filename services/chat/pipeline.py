"""One answer: retrieval, the numbered prompt, generation through the marker buffer, storage.

Complete and StreamComplete both run `answer`: the unary call keeps only the last event, so
the two can never disagree.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.assistants.domain import AssistantSettings, VersionedSettings, get_settings
from services.chat.early import EarlyRetrieval, EarlyStarter, SearchPlan, plan_for
from services.citations import (
    Citations,
    CitationSpan,
    CitationStyle,
    Delta,
    MarkerBuffer,
    RetrievedChunk,
    StreamEvent,
    build_context,
    build_manifest,
    finalize_extraction,
)
from services.conversations import store
from services.conversations.presenter import CitationPresenter
from services.conversations.snapshot import citations_from_json, citations_to_json
from services.conversations.store import Turn
from services.db.session import Database
from services.errors import Aborted, AlreadyExists, InvalidArgument
from services.evidence.builder import AnswerEvidence, EvidenceBuilder, evidence_builder
from services.evidence.streaming import SentenceTracker
from services.futures import discard, read_outcome
from services.llm.base import (
    Finished,
    FinishReason,
    GenerationRequest,
    Generator,
    PromptMessage,
    Retrieval,
)
from services.observability.metrics import RETRIEVAL_DURATION
from services.observability.tracing import traced, traced_stream
from services.retrieval.batching import QueryBatcher
from services.retrieval.embeddings import Embedder, LocalEmbedder
from services.retrieval.search import Search, start_search

log = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful assistant. Answer the user's question from the sources below. "
    "If they do not contain the answer, say so plainly instead of guessing."
)
# Small models follow the instruction nearest the question best, so the essentials are repeated
# there: short, own words, a number after each claim.
CITE_REMINDER = (
    "Answer in one to three sentences of your own words, with the source number in square "
    "brackets, like [1], after each claim."
)
# Span events that time an answer's start: the model's first text on the chat.generate span,
# the first delta sent to the client on the call's span (bench/ttft.py reads both).
FIRST_TOKEN_EVENT = "footnote.first_token"
FIRST_DELTA_EVENT = "footnote.first_delta"
MAX_MESSAGES = 50
MAX_MESSAGE_CHARS = 32_000
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatOptions:
    include_citations: bool | None = None
    style: CitationStyle = CitationStyle.UNSPECIFIED
    strip_invalid: bool = False
    temperature: float | None = None
    max_output_tokens: int | None = None
    attribute: bool | None = None  # None means on


@dataclass(frozen=True)
class ChatInput:
    assistant_id: str
    conversation_id: str
    messages: Sequence[Turn]
    options: ChatOptions = ChatOptions()
    request_id: str = ""


@dataclass(frozen=True)
class RetrievalStats:
    duration_seconds: float = 0.0
    chunks_returned: int = 0
    mode: Retrieval = Retrieval.RAN


@dataclass(frozen=True)
class ChatResult:
    id: str
    conversation_id: str
    message_id: str
    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    retrieval: RetrievalStats
    citations: Citations | None


@dataclass(frozen=True)
class AnswerDelta:
    text: str


@dataclass(frozen=True)
class AnswerCitation:
    index: int
    offset: int


@dataclass(frozen=True)
class AnswerSpan:
    """A sentence whose evidence is ready: cited by a marker or attributed."""

    span: CitationSpan


@dataclass(frozen=True)
class AnswerComplete:
    result: ChatResult


AnswerEvent = AnswerDelta | AnswerCitation | AnswerSpan | AnswerComplete
# What an answer starts from: its assistant's settings, the answer stored for its request_id,
# and the earlier turns of its conversation.
Loaded = tuple[VersionedSettings, store.StoredAnswer | None, list[Turn]]


def answer_events(events: Sequence[StreamEvent]) -> list[AnswerEvent]:
    """The marker buffer's events as the pipeline's own."""
    return [
        AnswerDelta(e.text) if isinstance(e, Delta) else AnswerCitation(e.index, e.end)
        for e in events
    ]


class Evidence:
    """An answer's evidence, prepared in a thread once the answer has started streaming.

    Laying out the sources' sentences takes several milliseconds of CPU (6.6 ms p50 at 100k
    chunks) and nothing needs it before the first complete sentence. Built before the model
    was asked, it delayed every first delta; built in a thread while the request to the model
    was being sent, it slowed the sending as much (the two share the interpreter lock).
    """

    def __init__(self, build: Callable[[], AnswerEvidence]) -> None:
        self._build = build
        self._task: asyncio.Future[AnswerEvidence] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(asyncio.to_thread(self._build))
            # An answer that ends early (failed, cancelled) never awaits it: its failure, if it
            # had one, is read here so that asyncio does not report it as never retrieved.
            self._task.add_done_callback(read_outcome)

    async def get(self) -> AnswerEvidence:
        self.start()
        assert self._task is not None
        return await self._task


async def spans_of(evidence: Evidence, sentences: list[CitationSpan]) -> list[CitationSpan]:
    """The spans among complete sentences, with their evidence (scored off the event loop)."""
    if not sentences:
        return []
    judge = await evidence.get()
    judged = await asyncio.to_thread(judge.judge, sentences)
    return [j.span for j in judged if j.span is not None]


def validate(inp: ChatInput) -> None:
    if not inp.assistant_id:
        raise InvalidArgument("assistant_id", "assistant_id is required")
    if not inp.messages:
        raise InvalidArgument("messages", "at least one message is required")
    if len(inp.messages) > MAX_MESSAGES:
        raise InvalidArgument("messages", f"at most {MAX_MESSAGES} messages per request")
    for i, m in enumerate(inp.messages):
        if m.role not in ROLES:
            raise InvalidArgument(f"messages[{i}].role", "role must be SYSTEM, USER or ASSISTANT")
        if "\x00" in m.content:
            raise InvalidArgument(f"messages[{i}].content", "a message must not contain NUL")
        if len(m.content) > MAX_MESSAGE_CHARS:
            raise InvalidArgument(
                f"messages[{i}].content", f"a message is at most {MAX_MESSAGE_CHARS} characters"
            )
    last = inp.messages[-1]
    if last.role != "user" or not last.content.strip():
        raise InvalidArgument("messages", "the last message must be a non-empty USER message")
    if len(inp.request_id) > 128 or any(ord(c) < 32 for c in inp.request_id):
        raise InvalidArgument(
            "request_id", "request_id must be at most 128 characters, without control characters"
        )
    o = inp.options
    if o.temperature is not None and not 0.0 <= o.temperature <= 2.0:
        raise InvalidArgument("options.temperature", "temperature must be between 0 and 2")
    if o.max_output_tokens is not None and not 1 <= o.max_output_tokens <= 32_768:
        raise InvalidArgument(
            "options.max_output_tokens", "max_output_tokens must be between 1 and 32768"
        )


def request_id_reused(what: str, previous_id: str) -> AlreadyExists:
    return AlreadyExists(
        f"request_id was already used for a different request ({what} differs); use a new "
        "request_id for a new question",
        reason="REQUEST_ID_REUSED",
        metadata={"message_id": previous_id},
    )


class ChatEngine:
    async def check_answered_meanwhile(self, tenant_id: str, inp: ChatInput) -> None:
        """Raises ABORTED when another call with the same request_id stored its answer while
        this one was answering (or ALREADY_EXISTS, as a replay would, when that call asked
        another question): this answer is not stored, and the request sent again replays that
        one. Returns when no answer is stored for the request_id, leaving the failure to be."""
        stored = await self.db.run(lambda s: store.find_answer(s, tenant_id, inp.request_id))
        if stored is None:
            return
        await self.check_same_request(inp, stored)
        raise Aborted(
            "another call with this request_id stored its answer first; send the request again"
            " to get that answer",
            reason="REQUEST_ID_ANSWERED_CONCURRENTLY",
            metadata={"message_id": stored.message_id},
        )

    async def check_same_request(self, inp: ChatInput, stored: store.StoredAnswer) -> None:
        """AIP-155: a request_id replays its own answer only, never another question's."""
        assistant_id, question = await self.db.run(
            lambda s: store.answered_request(s, stored.message_id)
        )
        if assistant_id != inp.assistant_id:
            raise request_id_reused("assistant_id", stored.message_id)
        if inp.conversation_id and inp.conversation_id != stored.conversation_id:
            raise request_id_reused("conversation_id", stored.message_id)
        if question != inp.messages[-1].content:
            raise request_id_reused("the question", stored.message_id)

    def __init__(
        self,
        db: Database,
        embedder: Embedder,
        generator: Generator,
        presenter: CitationPresenter,
        evidence: EvidenceBuilder | None = None,
    ) -> None:
        self.db = db
        self.embedder = embedder
        self.questions = QueryBatcher(embedder)
        self.early = EarlyStarter()
        self.generator = generator
        self.presenter = presenter
        # Evidence scores with its own embedder whatever retrieval embeds with: its thresholds
        # are calibrated on that model's cosines (the server passes the configured one).
        self.evidence = evidence or evidence_builder()

    async def prepare(self) -> None:
        """Loads the local model questions are embedded with, which the first answer would
        otherwise wait for (about 2 s with its 8-bit copy); a remote embedder needs nothing.
        A failure is only logged: the first question then meets it, with its status."""
        if not isinstance(self.embedder, LocalEmbedder):
            return
        try:
            await asyncio.to_thread(self.embedder.load_questions)
        except Exception:
            log.warning("could not load the local embedding model ahead of time", exc_info=True)

    async def answer(self, tenant_id: str, inp: ChatInput) -> AsyncIterator[AnswerEvent]:
        validate(inp)

        def read(s: Session) -> Loaded:
            # Everything the answer starts from, read outside a transaction: BEGIN and COMMIT
            # were two of the three round trips of the usual load (the assistant alone), and
            # at READ COMMITTED each statement has its own snapshot in a transaction too.
            settings = get_settings(s, tenant_id, inp.assistant_id)
            stored = store.find_answer(s, tenant_id, inp.request_id) if inp.request_id else None
            earlier: list[Turn] = []
            if inp.conversation_id and stored is None:
                earlier = store.earlier_turns(s, tenant_id, inp.conversation_id, inp.assistant_id)
            return settings, stored, earlier

        async def load() -> Loaded:
            if inp.request_id or inp.conversation_id:
                return await self.db.run_read(read)
            # The usual answer reads its assistant alone, which needs no ORM session.
            return (
                await self.db.run_autocommit(
                    lambda conn: get_settings(conn, tenant_id, inp.assistant_id)
                ),
                None,
                [],
            )

        question = inp.messages[-1].content
        # The question is embedded (and often searched) while the assistant is being loaded.
        early = self.early.start(
            tenant_id,
            inp.assistant_id,
            question,
            functools.partial(self.questions.embed_query, tenant=tenant_id),
            lambda plan, vector: self.search(
                tenant_id, inp.assistant_id, question, plan, vector, inp.request_id
            ),
        )
        try:
            # aclosing: a closed answer closes the upstream request at once (see respond).
            async with contextlib.aclosing(
                self.respond(tenant_id, inp, question, load, early)
            ) as events:
                async for event in events:
                    yield event
        finally:
            early.cancel()

    async def respond(
        self,
        tenant_id: str,
        inp: ChatInput,
        question: str,
        load: Callable[[], Awaitable[Loaded]],
        early: EarlyRetrieval,
    ) -> AsyncIterator[AnswerEvent]:
        # An answer outside a conversation reads nothing when the early search's full-text
        # statement finds its remembered settings current and no answer stored for its
        # request_id (chat.early); otherwise it reads them once that statement has run. In a
        # conversation, with the search under way, the assistant and the earlier turns are read
        # once the question is embedded: the read then runs beside the vector query instead of
        # taking CPU from the model, which is the critical path on two cores (0.6-1.2 ms off
        # the first delta's p50 at 100k chunks). With nothing started early, the search waits
        # for the settings: read now.
        unchanged = None
        if not inp.conversation_id:
            unchanged = await early.unchanged_settings()
        else:
            await early.embedded()
        if unchanged is not None:
            settings, stored, earlier = unchanged, None, []
        else:
            versioned, stored, earlier = await traced("chat.load", load())
            settings = versioned.settings
            self.early.remember(tenant_id, inp.assistant_id, versioned)
        if stored is not None:
            await self.check_same_request(inp, stored)
            yield AnswerDelta(stored.content)
            yield AnswerComplete(await self.replay(tenant_id, stored, settings))
            return
        chunks, stats, question_vector = await traced(
            "chat.retrieve", self.retrieve(tenant_id, inp.assistant_id, question, settings, early)
        )
        cite = settings.enable_citations
        if inp.options.include_citations is not None:
            cite = inp.options.include_citations
        # The excerpts (most of the manifest's time) wait for the citations: the prompt does
        # not show them, and the first delta does not need them.
        manifest = build_manifest(chunks, max_sources=settings.max_sources, excerpts=False)
        cite = cite and bool(manifest.sources)
        system = settings.system_prompt or DEFAULT_SYSTEM_PROMPT
        context = build_context(manifest, citations=cite)
        prompt = [PromptMessage("system", f"{system}\n\n{context}" if context else system)]
        prompt += [PromptMessage(t.role, t.content) for t in (*earlier, *inp.messages)]
        if cite:
            # Small models follow the instruction nearest the question; measured on the local
            # 0.5B model, a reminder here raised correctly cited answers from 3 of 12 to 7 of 12.
            prompt[-1] = PromptMessage("user", f"{question}\n\n{CITE_REMINDER}")
        request = GenerationRequest(
            messages=prompt,
            sources=manifest.sources,
            source_texts=[c.text for c in manifest.chunks],
            question=question,
            question_vector=question_vector,
            retrieval=stats.mode,
            model=settings.model,
            temperature=settings.temperature
            if inp.options.temperature is None
            else inp.options.temperature,
            max_output_tokens=settings.max_output_tokens
            if inp.options.max_output_tokens is None
            else inp.options.max_output_tokens,
            citations=cite,
        )

        buffer = MarkerBuffer(len(manifest.sources), strip_invalid=inp.options.strip_invalid)
        evidence = Evidence(
            functools.partial(
                self.evidence.for_answer,
                manifest.sources,
                manifest.chunks,
                attribute=inp.options.attribute is not False,
            )
        )
        tracker = SentenceTracker()
        sent: set[tuple[int, int]] = set()  # spans already streamed, by range
        pieces: list[str] = []  # the answer as generated, used when there is no buffer
        finished = Finished()
        # aclosing: a cancelled stream closes the generator, and with it the upstream request,
        # at once rather than whenever the garbage collector gets to it.
        generation = traced_stream(
            "chat.generate",
            self.generator.generate(request),
            {"gen_ai.operation.name": "chat", "gen_ai.request.model": request.model},
            first_event=FIRST_TOKEN_EVENT,
        )
        async with contextlib.aclosing(generation) as generated:
            async for event in generated:
                if isinstance(event, Finished):
                    finished = event
                    break
                if cite:
                    for out in answer_events(buffer.feed(event.text)):
                        yield out
                    # After the first delta has been handed on, not before (see Evidence).
                    evidence.start()
                    complete = tracker.complete(buffer.output, buffer.markers)
                    for span in await spans_of(evidence, complete):
                        sent.add((span.start, span.end))
                        yield AnswerSpan(span)
                else:
                    pieces.append(event.text)
                    yield AnswerDelta(event.text)
        citations = None
        if cite:
            for out in answer_events(buffer.finish()):
                yield out
            extraction = buffer.result()
            sources = manifest.with_excerpts(settings.excerpt_chars, question).sources
            text, citations = finalize_extraction(extraction, sources)
            judge = await evidence.get()
            citations = await asyncio.to_thread(judge.finish, text, extraction.markers, citations)
            for span in citations.spans:
                if (span.start, span.end) not in sent:
                    yield AnswerSpan(span)
            snapshot = citations_to_json(citations, inp.options.style)
        else:
            text, snapshot = "".join(pieces), None
        completion_id = f"cmpl-{uuid.uuid4().hex}"
        response = {
            "id": completion_id,
            "finish_reason": finished.reason.value,
            "prompt_tokens": finished.prompt_tokens,
            "completion_tokens": finished.completion_tokens,
            "retrieval": {
                "duration_seconds": stats.duration_seconds,
                "chunks_returned": stats.chunks_returned,
                "mode": stats.mode.value,
            },
        }
        exchange = store.Exchange(
            tenant_id=tenant_id,
            assistant_id=inp.assistant_id,
            new_turns=inp.messages,
            answer=text,
            citations=snapshot,
            response=response,
            request_id=inp.request_id,
        )
        try:
            if inp.conversation_id:
                conversation_id, message_id = await self.db.run(
                    lambda s: store.store_exchange(s, exchange, inp.conversation_id)
                )
            else:
                # One statement, with no BEGIN and COMMIT around it; its rows' ids are chosen
                # here, so if a dead connection makes Database run it again, it is written once.
                new = store.new_conversation(exchange)
                conversation_id, message_id = await self.db.run_autocommit(
                    lambda conn: store.write_new_conversation(conn, new)
                )
        except IntegrityError:
            if inp.request_id:
                await self.check_answered_meanwhile(tenant_id, inp)
            raise
        if citations is not None:
            # Presenting signs the download links (PUBLIC links by the links worker pool).
            citations = await traced(
                "chat.present_citations",
                self.present(tenant_id, citations, settings, inp.options.style),
                {"footnote.link_mode": settings.citation_link_mode.name},
            )
        yield AnswerComplete(
            ChatResult(
                id=completion_id,
                conversation_id=conversation_id,
                message_id=message_id,
                text=text,
                finish_reason=finished.reason,
                prompt_tokens=finished.prompt_tokens,
                completion_tokens=finished.completion_tokens,
                retrieval=stats,
                citations=citations,
            )
        )

    def search(
        self,
        tenant_id: str,
        assistant_id: str,
        question: str,
        plan: SearchPlan,
        vector: Awaitable[Sequence[float]],
        request_id: str = "",
    ) -> Search:
        # The full-text query runs while the question is being embedded.
        return start_search(
            self.db,
            tenant_id=tenant_id,
            assistant_id=assistant_id,
            query=question,
            query_vector=vector,
            top_k=plan.top_k,
            score_threshold=plan.score_threshold,
            request_id=request_id,
        )

    async def retrieve(
        self,
        tenant_id: str,
        assistant_id: str,
        question: str,
        settings: AssistantSettings,
        early: EarlyRetrieval | None = None,
    ) -> tuple[list[RetrievedChunk], RetrievalStats, Sequence[float] | None]:
        """The chunks, the statistics, and the question's vector when it was embedded."""
        plan = plan_for(settings, question)
        if plan is None:
            if early is not None:
                early.cancel()
            mode = Retrieval.DISABLED if not settings.enable_rag else Retrieval.GATED
            return [], RetrievalStats(mode=mode), None
        began = time.perf_counter()
        vector = early.vector if early is not None else None
        if vector is None:
            vector = asyncio.ensure_future(self.questions.embed_query(question, tenant=tenant_id))
        started = early.searched_with(plan) if early is not None else None
        if started is not None:
            began = early.began  # the search started before the assistant was loaded
        else:
            started = self.search(tenant_id, assistant_id, question, plan, vector)
        try:
            hits = await started.chunks
        except BaseException:
            started.cancel()
            discard(vector)
            raise
        stats = RetrievalStats(
            duration_seconds=time.perf_counter() - began, chunks_returned=len(hits)
        )
        RETRIEVAL_DURATION.observe(stats.duration_seconds)
        embedded = vector.done() and not vector.cancelled() and vector.exception() is None
        return hits, stats, vector.result() if embedded else None

    async def present(
        self,
        tenant_id: str,
        citations: Citations,
        settings: AssistantSettings,
        style: CitationStyle,
    ) -> Citations:
        [presented] = await self.presenter.present(
            tenant_id, settings.citation_link_mode, [(citations, style)], check_stale=False
        )
        return presented

    async def replay(
        self, tenant_id: str, stored: store.StoredAnswer, settings: AssistantSettings
    ) -> ChatResult:
        r = stored.response
        citations = None
        if stored.citations is not None:
            snapshot, style = citations_from_json(stored.citations)
            citations = await self.present(tenant_id, snapshot, settings, style)
        retrieval = r.get("retrieval", {})
        return ChatResult(
            id=r.get("id", ""),
            conversation_id=stored.conversation_id,
            message_id=stored.message_id,
            text=stored.content,
            finish_reason=FinishReason(r.get("finish_reason", FinishReason.STOP.value)),
            prompt_tokens=r.get("prompt_tokens", 0),
            completion_tokens=r.get("completion_tokens", 0),
            retrieval=RetrievalStats(
                duration_seconds=retrieval.get("duration_seconds", 0.0),
                chunks_returned=retrieval.get("chunks_returned", 0),
                mode=Retrieval(retrieval.get("mode", Retrieval.RAN.value)),
            ),
            citations=citations,
        )
