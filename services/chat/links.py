"""Download links on cited sources, by the assistant's link mode; signed when served."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from datetime import timedelta

from services.assistants.domain import LinkMode
from services.citations import Citations, CitationSource, CitationStyle, apply_style
from services.documents.links import LinkSigner
from services.errors import FootnoteError

log = logging.getLogger(__name__)
PUBLIC_LINK_TTL = timedelta(hours=1)


async def attach_links(
    sources: Sequence[CitationSource],
    mode: LinkMode,
    signer: LinkSigner,
    public_base_url: str,
) -> tuple[CitationSource, ...]:
    """The sources with download_url set; a links pool that fails leaves them without one."""
    if mode is LinkMode.AUTHENTICATED:
        base = public_base_url.rstrip("/")
        return tuple(
            dataclasses.replace(s, download_url=f"{base}/v1/documents/{s.document_id}/download")
            for s in sources
        )
    if mode is LinkMode.PUBLIC and sources:
        ids = sorted({s.document_id for s in sources})
        try:
            links = await signer.presign(ids, PUBLIC_LINK_TTL)
        except FootnoteError as err:
            # The answer matters more than its links: serve it without them, and say why.
            log.warning("serving sources without public links: %s", err.message)
            return tuple(sources)
        return tuple(
            dataclasses.replace(
                s,
                download_url=links[s.document_id].url,
                download_url_expire_time=links[s.document_id].expire_time,
            )
            if s.document_id in links
            else s
            for s in sources
        )
    return tuple(sources)


async def present_citations(
    citations: Citations,
    mode: LinkMode,
    style: CitationStyle,
    signer: LinkSigner,
    public_base_url: str,
) -> Citations:
    """Links signed now and the style applied: what an answer or a history page shows."""
    sources = await attach_links(citations.sources, mode, signer, public_base_url)
    return dataclasses.replace(citations, sources=apply_style(sources, style))
