"""The chat engine loads the local question model once the server serves, not in an answer."""

from __future__ import annotations

import logging

import httpx
import pytest

from services.chat.pipeline import ChatEngine
from services.retrieval.embeddings import LocalEmbedder, OpenAIEmbedder


def engine(embedder: object) -> ChatEngine:
    # Only the embedder takes part in preparing; nothing else is touched.
    return ChatEngine(None, embedder, None, None, evidence=object())  # type: ignore[arg-type]


async def test_the_local_question_model_is_loaded_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[str] = []
    monkeypatch.setattr(LocalEmbedder, "load_questions", lambda self: loaded.append(self.questions))
    await engine(LocalEmbedder()).prepare()
    await engine(LocalEmbedder(questions="float32")).prepare()
    assert loaded == ["int8", "float32"]


async def test_a_remote_embedder_is_not_called_at_start(caplog: pytest.LogCaptureFixture) -> None:
    requests: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(503)

    remote = OpenAIEmbedder(
        base_url="http://embeddings.invalid",
        model=None,
        api_key=None,
        dim=384,
        transport=httpx.MockTransport(record),
    )
    try:
        with caplog.at_level(logging.WARNING):
            await engine(remote).prepare()
    finally:
        remote.close()
    assert requests == []
    assert caplog.text == ""


async def test_a_model_that_cannot_load_is_logged_and_left_to_the_first_question(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: LocalEmbedder) -> None:
        raise RuntimeError("no model here")

    monkeypatch.setattr(LocalEmbedder, "load_questions", broken)
    with caplog.at_level(logging.WARNING, logger="services.chat.pipeline"):
        await engine(LocalEmbedder()).prepare()
    assert "could not load the local embedding model" in caplog.text
    assert "no model here" in caplog.text
