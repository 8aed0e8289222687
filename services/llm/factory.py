"""Chooses the generator from the configuration."""

from __future__ import annotations

from services.config import Settings
from services.llm.base import Generator
from services.llm.extractive import ExtractiveGenerator


def create_generator(settings: Settings) -> Generator:
    """The OpenAI-compatible client when FOOTNOTE_LLM_BASE_URL is set, else extractive."""
    if not settings.llm_base_url:
        return ExtractiveGenerator()
    from services.llm.openai_compat import OpenAIGenerator

    return OpenAIGenerator(
        base_url=settings.llm_base_url,
        model=settings.llm_model,
        api_key=settings.llm_api_key,
        timeout_seconds=settings.llm_timeout_seconds,
        max_connections=settings.llm_max_connections,
        pool_timeout=settings.llm_pool_timeout_seconds,
    )
