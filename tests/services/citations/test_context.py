"""The prompt's context block."""

from services.citations import (
    RetrievedChunk,
    ScoreKind,
    SourceLocation,
    build_context,
    build_manifest,
    source_label,
)


def hit(chunk_id: str, name: str, score: float, location: SourceLocation, text: str):
    return RetrievedChunk(
        chunk_id,
        f"d-{chunk_id}",
        name,
        "text/plain",
        0,
        text,
        score,
        ScoreKind.SIMILARITY,
        location,
    )


def test_numbered_context_matches_the_manifest() -> None:
    manifest = build_manifest(
        [
            hit("a", "guide.md", 0.5, SourceLocation(heading="Install > Linux"), "Run make."),
            hit(
                "b", "Q3 Report.pdf", 0.9, SourceLocation(page_start=4, heading="Revenue"), "Up 5%."
            ),
            hit("c", "notes.txt", 0.1, SourceLocation(page_start=4, page_end=5), "  Misc.  "),
        ]
    )
    context = build_context(manifest)
    assert "cite several sources as [1][3]" in context
    assert "only the sources you actually used" in context
    assert context.endswith(
        '[1] (Source: "Q3 Report.pdf", p. 4, §Revenue)\nUp 5%.\n\n'
        '[2] (Source: "guide.md", §Install > Linux)\nRun make.\n\n'
        '[3] (Source: "notes.txt", pp. 4-5)\nMisc.'
    )


def test_plain_context_has_no_numbers() -> None:
    manifest = build_manifest([hit("a", "guide.md", 0.5, SourceLocation(), "Run make.")])
    context = build_context(manifest, citations=False)
    assert context.endswith('Source: "guide.md"\nRun make.')
    assert "[1]" not in context and "cite" not in context.lower()


def test_no_sources_no_context() -> None:
    assert build_context(build_manifest([])) == ""


def test_label_quotes_and_flattens_the_name() -> None:
    label = source_label('My "big"\nreport', SourceLocation(page_start=3, page_end=3))
    assert label == '"My \\"big\\" report", p. 3'
