"""Renders the manifest into the context block of the prompt.

Each source is one `<source id="N" ...>` block. Only this module writes those tags: source
text and names are escaped so that nothing a document says can open or close a block, and
numbered markers inside them are rewritten (`[7]` -> `(7)`) so that a model copying them does
not cite an unrelated source.
"""

from __future__ import annotations

import re

from services.citations.manifest import Manifest
from services.citations.types import SourceLocation

CITATION_INSTRUCTIONS = (
    "Answer from the sources below. Each source is a block between a source tag, which gives "
    "its number as id, and a closing source tag; the tags are not part of the text. Write a "
    "short answer, one to three sentences, in your own words; do not copy the tags, titles or "
    "long passages. Put the number of the source that supports a claim in square brackets "
    "right after it, like [1]; several as [1][3]. Use only the numbers of the sources below. "
    "If the sources do not answer the question, say that the documents do not say, and cite "
    "nothing."
)
PLAIN_INSTRUCTIONS = (
    "Answer from the sources below, each a block between a source tag and a closing source "
    "tag. Write a short answer in your own words. If the sources do not answer the question, "
    "say so."
)

# Anything the marker grammar (docs/citations.md) could read as a citation, and a little more:
# brackets around digits, separators, dashes and spaces, ASCII or full-width.
_MARKER_LIKE = re.compile(
    r"[\[【［]([\s0-9０-９,，、\-–—]*[0-9０-９][\s0-9０-９,，、\-–—]*)[\]】］]"
)
# Something a model could read as a source tag, opening or closing: `<source`, `</ source`,
# `&lt;source` (in case a reader unescapes), in any case.
_TAG_LIKE = re.compile(r"<(?=\s*/?\s*source)|&(?=lt;\s*/?\s*source)", re.IGNORECASE)


def neutralize_markers(text: str) -> str:
    """Rewrites numbered markers so they no longer parse as citations: `[7]` -> `(7)`.

    `[1][2][3]` becomes `(1)(2)(3)` and `【5】` becomes `(5)`; other brackets are left alone.
    """
    return _MARKER_LIKE.sub(lambda m: f"({m.group(1)})", text)


def escape_source_text(text: str) -> str:
    """Source text as it goes into a block: markers neutralised, no source tag can form."""
    return _TAG_LIKE.sub(
        lambda m: "&lt;" if m.group() == "<" else "&amp;", neutralize_markers(text)
    )


def escape_attribute(value: str) -> str:
    """A value for a tag attribute: one line, markers neutralised, XML-escaped."""
    flat = " ".join(neutralize_markers(value).split())
    return (
        flat.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
    )


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


def source_open_tag(name: str, location: SourceLocation, index: int | None) -> str:
    """`<source id="2" title="guide.md" location="p. 4, §Install">`; id only with citations."""
    attributes = [] if index is None else [f'id="{index}"']
    attributes.append(f'title="{escape_attribute(name)}"')
    where = ", ".join(location_parts(location))
    if where:
        attributes.append(f'location="{escape_attribute(where)}"')
    return f"<source {' '.join(attributes)}>"


def build_context(manifest: Manifest, *, citations: bool = True) -> str:
    """The context block for the prompt, or "" when there are no sources.

    With citations each source is `<source id="N" title="..." location="...">`, its escaped
    text, then `</source>`, N being its index in the manifest, so the numbers the model writes
    are the manifest's; without, the tags carry no id and the model gets no citation
    instruction.
    """
    if not manifest.sources:
        return ""
    blocks = [CITATION_INSTRUCTIONS if citations else PLAIN_INSTRUCTIONS]
    for source, chunk in zip(manifest.sources, manifest.chunks, strict=True):
        tag = source_open_tag(
            source.document_name, source.location, source.index if citations else None
        )
        blocks.append(f"{tag}\n{escape_source_text(chunk.text.strip())}\n</source>")
    return "\n\n".join(blocks)
