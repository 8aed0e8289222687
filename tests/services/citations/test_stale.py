"""Staleness of stored citations."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from services.citations import CitationSource, DocumentVersion, is_stale, mark_stale

T0 = datetime(2025, 1, 1, 12, tzinfo=UTC)
SHA = "ab" * 32


def test_unchanged_document_is_fresh() -> None:
    stored = DocumentVersion("d", SHA, T0)
    assert not is_stale(stored, DocumentVersion("d", SHA.upper(), T0))
    # The same instant in another zone, or naive UTC, is the same time.
    assert not is_stale(
        stored, DocumentVersion("d", SHA, T0.astimezone(timezone(timedelta(hours=2))))
    )
    assert not is_stale(stored, DocumentVersion("d", SHA, T0.replace(tzinfo=None)))


@pytest.mark.parametrize(
    "current",
    [
        None,
        DocumentVersion("d", "cd" * 32, T0),
        DocumentVersion("d", SHA, T0 + timedelta(seconds=1)),
        DocumentVersion("d", SHA, None),
    ],
)
def test_deleted_changed_or_reindexed_is_stale(current) -> None:
    assert is_stale(DocumentVersion("d", SHA, T0), current)


def test_unknown_sha_leaves_the_decision_to_indexed_time() -> None:
    assert not is_stale(DocumentVersion("d", "", T0), DocumentVersion("d", SHA, T0))
    assert is_stale(DocumentVersion("d", "", T0), DocumentVersion("d", SHA, T0 + timedelta(days=1)))


def test_different_documents_are_not_comparable() -> None:
    with pytest.raises(ValueError):
        is_stale(DocumentVersion("a", SHA, T0), DocumentVersion("b", SHA, T0))


def test_mark_stale_treats_missing_documents_as_deleted() -> None:
    def source(index: int, doc: str) -> CitationSource:
        return CitationSource(
            index, doc, "n", "t", 0.5, "", f"c{index}", 0, document_sha256=SHA, indexed_time=T0
        )

    marked = mark_stale(
        [source(1, "kept"), source(2, "gone"), source(3, "edited")],
        {
            "kept": DocumentVersion("kept", SHA, T0),
            "edited": DocumentVersion("edited", "ee" * 32, T0),
        },
    )
    assert [s.stale for s in marked] == [False, True, True]
