"""The evidence scorer's static embedder, read from the installed wordllama wheel."""

import numpy as np
import pytest

from services.config import Settings
from services.evidence.builder import evidence_builder
from services.evidence.scorer import CALIBRATION, LOCAL_CALIBRATION
from services.evidence.static import STATIC_DIM, StaticEmbedder
from services.retrieval.embeddings import LocalEmbedder


def test_vectors_are_unit_length_and_closer_for_a_paraphrase() -> None:
    rows = StaticEmbedder().embed_array(
        [
            "You may charge any price or no price for each copy that you convey.",
            "You can sell copies at whatever price you like, or give them away.",
            "Tokyo is the capital of Japan.",
        ]
    )
    assert rows.shape == (3, STATIC_DIM)
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    assert rows[0] @ rows[1] > rows[0] @ rows[2] + 0.2


def test_odd_texts_get_vectors_without_failing() -> None:
    rows = StaticEmbedder().embed_array(
        ["", "   ", "東京は日本の首都です 🎉", "naïve café", "x" * 20_000]
    )
    assert not rows[0].any()  # no tokens: zeros, which match nothing
    assert all(np.isclose(np.linalg.norm(r), 1.0, atol=1e-5) for r in rows[1:])
    assert StaticEmbedder().embed_documents([]) == []


def test_a_texts_vector_does_not_depend_on_its_batch() -> None:
    alone = StaticEmbedder().embed_array(["Cache files must be written atomically."])
    together = StaticEmbedder().embed_array(
        ["Other text.", "Cache files must be written atomically."]
    )
    assert np.array_equal(alone[0], together[1])


def test_each_embedder_comes_with_its_own_calibration() -> None:
    static, local = evidence_builder("static"), evidence_builder("local")
    assert isinstance(static.embedder, StaticEmbedder) and static.calibration == CALIBRATION
    assert isinstance(local.embedder, LocalEmbedder) and local.calibration == LOCAL_CALIBRATION
    with pytest.raises(ValueError, match="static or local"):
        evidence_builder("nli")


def test_the_setting_defaults_to_static_and_rejects_others(monkeypatch) -> None:
    assert Settings().evidence_embedder == "static"
    monkeypatch.setenv("FOOTNOTE_EVIDENCE_EMBEDDER", "local")
    assert Settings().evidence_embedder == "local"
    monkeypatch.setenv("FOOTNOTE_EVIDENCE_EMBEDDER", "nli")
    with pytest.raises(ValueError, match="evidence_embedder"):
        Settings()


def test_word_vectors_survive_the_cache_starting_over(monkeypatch) -> None:
    from services.evidence import static

    monkeypatch.setattr(static, "_WORD_CACHE", 3)
    first = static.word_vectors(["price", "cost"])
    # Three new words overflow the cache, which starts over while "price" is still asked for.
    again = static.word_vectors(["price", "licence", "license", "grant"])
    assert np.array_equal(first[0], again[0])
    assert static.word_vectors([]).shape == (0, STATIC_DIM)


async def test_the_server_scores_evidence_with_the_configured_embedder(settings) -> None:
    from services.server import Deps

    for name, kind in (("static", StaticEmbedder), ("local", LocalEmbedder)):
        deps = Deps.from_settings(settings.model_copy(update={"evidence_embedder": name}))
        try:
            assert isinstance(deps.chat.evidence.embedder, kind)
        finally:
            await deps.aclose()
