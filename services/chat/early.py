"""Retrieval started when a request arrives, before the assistant has been loaded.

The question's embedding needs nothing from the assistant, so it always starts at once. The
search needs the assistant's settings (whether it retrieves, top_k, the score threshold): it
starts at once too when the settings seen in this process's last answer for that assistant
say how. The search's full-text statement, which needs no vector and runs as the call
arrives, also reads the version of the assistant's row (domain.ROW_VERSION) and whether an
answer is stored for the request's request_id. When the version is the one the remembered
settings were read at and no answer is stored, the answer is built from those settings and
nothing else is read: reading the assistant cost plain answers at concurrency 16 about 2.5%
of the requests a server answers (0.24-0.31 ms of its CPU each; see docs/performance.md).
Otherwise (the row changed or is gone, an answer is stored, the statement failed) the
assistant is read, with the stored answer, once that statement has run, and the search's
chunks are used only if the settings read say the same; if not, the search runs again on
them. So an answer's settings are the assistant's as committed when its full-text statement
ran or later, a few milliseconds after the call arrived, never older. The search filters by
tenant and assistant as always, so an early search for an assistant that is not the caller's
finds nothing and is thrown away with the request's NOT_FOUND.

An answer in a conversation (whose earlier turns must be read) reads them as before, with
its assistant: with a search under way, once the question is embedded
(`EarlyRetrieval.embedded`, waiting at most READ_WAIT_SECONDS), since on two cores the read
beside the model run slowed the run, the first delta's critical path.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from services.assistants.domain import AssistantSettings, VersionedSettings
from services.chat.gate import needs_retrieval
from services.futures import discard, read_outcome
from services.retrieval.search import Search

MAX_REMEMBERED = 10_000
# How long the read of an answer in a conversation waits for the question's vector. The local
# model takes a few ms; a remote embedding service takes longer but leaves the CPU to the read,
# and one that is down must not hold up what needs no vector (a replayed answer).
READ_WAIT_SECONDS = 0.05


@dataclass(frozen=True)
class SearchPlan:
    """What a search depends on besides the question and the documents."""

    top_k: int
    score_threshold: float


def plan_for(settings: AssistantSettings, question: str) -> SearchPlan | None:
    """How an answer on these settings searches, or None when it does not retrieve."""
    if not settings.enable_rag:
        return None
    if settings.enable_retrieval_gate and not needs_retrieval(question):
        return None
    return SearchPlan(settings.top_k, settings.score_threshold)


class EarlyRetrieval:
    """One request's early work: the question's vector and maybe its search, and the settings
    that search was started on."""

    def __init__(
        self,
        vector: asyncio.Future[Sequence[float]] | None,
        plan: SearchPlan | None,
        search: Search | None,
        known: VersionedSettings | None = None,
    ) -> None:
        self.vector = vector
        self.plan = plan
        self.search = search
        self.known = known
        # When the work started: retrieval's duration counts from here when it is used.
        self.began = time.perf_counter()

    def searched_with(self, plan: SearchPlan) -> Search | None:
        """The early search if it ran on this plan; None when it must run again."""
        if self.search is not None and self.plan == plan:
            return self.search
        if self.search is not None:
            self.search.cancel()
            self.search = None
        return None

    async def embedded(self) -> None:
        """Once the question's vector is ready (or has failed, or READ_WAIT_SECONDS have
        passed) when a search started early; at once when none did. Never raises: whoever
        awaits the vector meets its failure."""
        if self.search is not None and self.vector is not None:
            await asyncio.wait({self.vector}, timeout=READ_WAIT_SECONDS)

    async def unchanged_settings(self) -> AssistantSettings | None:
        """The settings the early search started on, once its full-text statement has found
        the assistant's row at the version they were read at and no answer stored for the
        request's request_id; None when it did not (or none started, or it failed). Never
        raises: whoever awaits the search meets its failure."""
        if self.search is None or self.known is None:
            return None
        text = self.search.text
        await asyncio.wait({text})
        if text.cancelled() or text.exception() is not None:
            return None
        seen = text.result()
        if seen.answered or seen.assistant_version != self.known.version:
            return None
        return self.known.settings

    def cancel(self) -> None:
        if self.vector is not None:
            discard(self.vector)
        if self.search is not None:
            self.search.cancel()


class EarlyStarter:
    """Starts a request's retrieval early, from the settings its assistant had last time."""

    def __init__(self, max_remembered: int = MAX_REMEMBERED) -> None:
        self.max_remembered = max_remembered
        self._settings: dict[tuple[str, str], VersionedSettings] = {}

    def remember(self, tenant_id: str, assistant_id: str, settings: VersionedSettings) -> None:
        if len(self._settings) >= self.max_remembered:
            self._settings.clear()
        self._settings[(tenant_id, assistant_id)] = settings

    def start(
        self,
        tenant_id: str,
        assistant_id: str,
        question: str,
        embed: Callable[[str], Awaitable[Sequence[float]]],
        search: Callable[[SearchPlan, Awaitable[Sequence[float]]], Search],
    ) -> EarlyRetrieval:
        known = self._settings.get((tenant_id, assistant_id))
        plan = plan_for(known.settings, question) if known is not None else None
        if known is not None and plan is None:
            # It did not retrieve last time: nothing is started on a guess.
            return EarlyRetrieval(None, None, None)
        vector = asyncio.ensure_future(embed(question))
        if plan is None:
            return EarlyRetrieval(vector, None, None)
        # Shielded: cancelling the early search must leave the vector to a search run again.
        # The shield's own future is nobody's to await: its failure is read here, or asyncio
        # would report it as never retrieved when the early search is cancelled first.
        shielded = asyncio.shield(vector)
        shielded.add_done_callback(read_outcome)
        return EarlyRetrieval(vector, plan, search(plan, shielded), known)
