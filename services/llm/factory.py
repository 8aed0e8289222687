"""Chooses the generator from the configuration."""

from __future__ import annotations

from services.config import Settings
from services.llm.base import Generator
from services.llm.extractive import ExtractiveGenerator, SentenceEmbedder


def create_generator(settings: Settings, *, embedder: SentenceEmbedder | None = None) -> Generator:
    """The OpenAI-compatible client when FOOTNOTE_LLM_BASE_URL is set, else extractive.

    The extractive generator ranks sentences by meaning with embedder (the one retrieval
    uses), and by shared words alone without one.
    """
    if not settings.llm_base_url:
        return ExtractiveGenerator(embedder)
    from services.llm.openai_compat import OpenAIGenerator

    return OpenAIGenerator(
        base_url=settings.llm_base_url,
        model=settings.llm_model,
        api_key=settings.llm_api_key,
        timeout_seconds=settings.llm_timeout_seconds,
        max_connections=settings.llm_max_connections,
        pool_timeout=settings.llm_pool_timeout_seconds,
        keepalive_seconds=settings.llm_keepalive_seconds,
    )
