"""Renders the manifest into the context block of the prompt."""

from __future__ import annotations

from services.citations.manifest import Manifest
from services.citations.types import SourceLocation

CITATION_INSTRUCTIONS = (
    "Answer from the numbered sources below. Cite each source you use with its number in "
    "square brackets right after the sentence that uses it, like [1]; cite several sources "
    "as [1][3]. Cite only the sources you actually used, and only the numbers listed here."
)
PLAIN_INSTRUCTIONS = "Answer from the sources below."


def page_label(location: SourceLocation) -> str:
    """The page part of a label: "p. 4", "pp. 4-5", or "" when the page is unknown."""
    first, last = location.page_start, location.page_end
    if first <= 0:
        return ""
    if last > first:
        return f"pp. {first}-{last}"
    return f"p. {first}"


def location_parts(location: SourceLocation) -> list[str]:
    """The known parts of a location as shown to readers: pages, then "§Heading > Sub"."""
    parts = []
    pages = page_label(location)
    if pages:
        parts.append(pages)
    heading = " ".join(location.heading.split())
    if heading:
        parts.append(f"§{heading}")
    return parts


def source_label(name: str, location: SourceLocation) -> str:
    """'"Q3 Report.pdf", p. 4, §Revenue': the quoted name, then what is known of the place."""
    flat = " ".join(name.split()).replace("\\", "\\\\").replace('"', '\\"')
    return ", ".join([f'"{flat}"', *location_parts(location)])


def build_context(manifest: Manifest, *, citations: bool = True) -> str:
    """The context block for the prompt, or "" when there are no sources.

    With citations each source opens with "[N] (Source: ...)", N being its index in the
    manifest, so the numbers the model writes are the manifest's; without, sources carry no
    number and the model gets no citation instruction.
    """
    if not manifest.sources:
        return ""
    blocks = [CITATION_INSTRUCTIONS if citations else PLAIN_INSTRUCTIONS]
    for source, chunk in zip(manifest.sources, manifest.chunks, strict=True):
        label = source_label(source.document_name, source.location)
        header = f"[{source.index}] (Source: {label})" if citations else f"Source: {label}"
        blocks.append(f"{header}\n{chunk.text.strip()}")
    return "\n\n".join(blocks)
