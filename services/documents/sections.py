"""Merging of runs of tiny sections, so that a file of headings alone cannot make a chunk each.

A Markdown file of 200,000 headings would otherwise become one chunk per heading: tens of
thousands of near-empty chunks to embed and store. In a run of at least MIN_RUN consecutive
sections each shorter than 1/TINY_FRACTION of a chunk, sections are merged into groups of at
most a chunk, under the first heading of each group. Ordinary documents, whose sections hold
text, keep every heading.
"""

from __future__ import annotations

from dataclasses import replace

from services.documents.extracted import ExtractedText, Heading

# A section is tiny below this fraction of the chunk size (150 characters for 1,200).
TINY_FRACTION = 8
# Runs shorter than this are left alone.
MIN_RUN = 8


def merge_tiny_sections(extracted: ExtractedText, max_chars: int) -> ExtractedText:
    """The same text with fewer headings: each run of tiny sections keeps only its first.

    A heading is dropped only into a run led by a heading of the same or a higher rank, so the
    headings that stay still nest as they did; a run stops before it would exceed max_chars.
    """
    text = extracted.text
    ordered = sorted(
        (h for h in extracted.headings if 0 <= h.offset <= len(text)), key=lambda h: h.offset
    )
    if len(ordered) < 2:
        return extracted
    tiny = max(1, max_chars // TINY_FRACTION)
    ends = [h.offset for h in ordered[1:]] + [len(text)]
    small = [len(text[h.offset : end].strip()) < tiny for h, end in zip(ordered, ends, strict=True)]
    # Only long runs merge: a few short sections in a row are ordinary and keep their headings.
    in_long_run = [False] * len(ordered)
    start = 0
    while start < len(ordered):
        stop = start
        while stop < len(ordered) and small[stop]:
            stop += 1
        if stop - start >= MIN_RUN:
            in_long_run[start:stop] = [True] * (stop - start)
        start = stop + 1
    kept: list[Heading] = []
    lead: Heading | None = None  # the first heading of the current merged group
    for number, (heading, end) in enumerate(zip(ordered, ends, strict=True)):
        mergeable = in_long_run[number]
        if (
            lead is not None
            and mergeable
            and heading.level >= lead.level
            and end - lead.offset <= max_chars
        ):
            continue  # merged into the group that lead opened
        kept.append(heading)
        lead = heading if mergeable else None
    if len(kept) == len(ordered):
        return extracted
    return replace(extracted, headings=tuple(kept))
