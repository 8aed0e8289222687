"""coalesced(): deltas ready together leave as one, and the streaming contract still holds."""

from __future__ import annotations

import asyncio
import random

import pytest

from services.chat.pipeline import AnswerCitation, AnswerComplete, AnswerDelta, answer_events
from services.chat.relay import coalesced
from services.citations import MarkerBuffer

TEXT = "Paris is in France [1]. Tokyo [2] is big [1][3]. Berlin [2-3] too 【1】."


def pieces_of(text: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), 25))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


async def source(pieces: list[str], log: list[str]):
    buffer = MarkerBuffer(3)
    try:
        for piece in pieces:
            for event in answer_events(buffer.feed(piece)):
                yield event
            await asyncio.sleep(0)  # the next piece comes from the network later
        for event in answer_events(buffer.finish()):
            yield event
        yield AnswerComplete(result=None)  # type: ignore[arg-type]
    finally:
        log.append("closed")


def delta_ends(events) -> set[int]:
    ends, at = set(), 0
    for e in events:
        if isinstance(e, AnswerDelta):
            at += len(e.text)
            ends.add(at)
    return ends


@pytest.mark.parametrize("seed", range(5))
async def test_a_slow_client_gets_fewer_deltas_with_the_same_text_and_markers_whole(seed):
    pieces = pieces_of(TEXT, seed)
    direct = [e async for e in source(pieces, [])]
    out = []
    async for event in coalesced(source(pieces, [])):
        out.append(event)
        await asyncio.sleep(0.002)  # a client slower than the upstream

    text = "".join(e.text for e in out if isinstance(e, AnswerDelta))
    assert text == "".join(e.text for e in direct if isinstance(e, AnswerDelta)) == TEXT
    assert len(out) < len(direct)
    # Every delta ends where an uncoalesced one ended: never inside a marker.
    assert delta_ends(out) <= delta_ends(direct)
    assert [e for e in out if isinstance(e, AnswerCitation)] == [
        e for e in direct if isinstance(e, AnswerCitation)
    ]
    assert isinstance(out[-1], AnswerComplete)


async def test_a_fast_client_gets_every_delta_as_it_comes():
    pieces = ["Paris ", "is ", "in ", "France."]
    out = [e async for e in coalesced(source(pieces, []))]
    assert [e.text for e in out if isinstance(e, AnswerDelta)] == pieces


async def test_the_first_delta_leaves_alone_even_when_more_of_the_answer_is_waiting():
    async def burst():
        for piece in ["Paris ", "is ", "in ", "France."]:
            yield AnswerDelta(piece)  # all of them ready at once, as after one network read

    out = [e.text async for e in coalesced(burst())]
    # The first delta is not held back to be joined; what waited behind it still is.
    assert out == ["Paris ", "is in France."]


async def test_a_failure_of_the_answer_reaches_the_client_after_its_deltas():
    async def failing():
        yield AnswerDelta("partial ")
        raise RuntimeError("upstream failed")

    out = []
    with pytest.raises(RuntimeError, match="upstream failed"):
        async for event in coalesced(failing()):
            out.append(event)
    assert out == [AnswerDelta("partial ")]


async def test_a_client_that_leaves_closes_the_answer():
    log: list[str] = []

    async def endless():
        try:
            while True:
                yield AnswerDelta("la ")
                await asyncio.sleep(0.001)
        finally:
            log.append("closed")

    stream = coalesced(endless())
    await anext(stream)
    await stream.aclose()
    assert log == ["closed"]
