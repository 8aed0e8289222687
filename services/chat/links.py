"""Download links on cited sources, by the assistant's link mode; signed when served."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta

from services.assistants.domain import LinkMode
from services.citations import Citations, CitationSource, CitationStyle, apply_style
from services.documents.links import Link, LinkSigner
from services.errors import FootnoteError

log = logging.getLogger(__name__)
PUBLIC_LINK_TTL = timedelta(hours=1)


async def document_links(
    document_ids: Iterable[str], mode: LinkMode, signer: LinkSigner, public_base_url: str
) -> dict[str, Link]:
    """One link per document, all signed in one round trip; a failing pool gives none."""
    ids = sorted(set(document_ids))
    if mode is LinkMode.AUTHENTICATED:
        base = public_base_url.rstrip("/")
        return {i: Link(url=f"{base}/v1/documents/{i}/download") for i in ids}
    if mode is LinkMode.PUBLIC and ids:
        try:
            return await signer.presign(ids, PUBLIC_LINK_TTL)
        except FootnoteError as err:
            # The answer matters more than its links: serve it without them, and say why.
            log.warning("serving sources without public links: %s", err.message)
    return {}


def with_links(
    sources: Sequence[CitationSource], links: Mapping[str, Link]
) -> tuple[CitationSource, ...]:
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


async def attach_links(
    sources: Sequence[CitationSource],
    mode: LinkMode,
    signer: LinkSigner,
    public_base_url: str,
) -> tuple[CitationSource, ...]:
    """The sources with download_url set; a links pool that fails leaves them without one."""
    links = await document_links((s.document_id for s in sources), mode, signer, public_base_url)
    return with_links(sources, links)


def presented(citations: Citations, links: Mapping[str, Link], style: CitationStyle) -> Citations:
    """What an answer or a history page shows: links signed now and the style applied."""
    return dataclasses.replace(
        citations, sources=apply_style(with_links(citations.sources, links), style)
    )
