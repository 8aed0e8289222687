"""What a reader sees of stored citations: links signed now, staleness, and the style applied.

The chat answer and a page of history both go through `CitationPresenter.present`, so a
replayed answer looks exactly like the one first served, with fresh links.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from services.assistants.domain import LinkMode
from services.citations import (
    Citations,
    CitationSource,
    CitationStyle,
    apply_style,
    mark_stale,
)
from services.conversations import store
from services.db.session import Database
from services.documents.links import Link, LinkSigner


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


class CitationPresenter:
    def __init__(self, db: Database, signer: LinkSigner) -> None:
        self.db = db
        self.signer = signer

    async def present(
        self,
        tenant_id: str,
        mode: LinkMode,
        items: Sequence[tuple[Citations, CitationStyle]],
        *,
        check_stale: bool,
    ) -> list[Citations]:
        """Each item presented; every link of the batch is signed in one round trip.

        With check_stale, a source whose document changed or was deleted since is marked stale.
        """
        ids = {s.document_id for citations, _ in items for s in citations.sources}
        current = None
        if check_stale and ids:
            current = await self.db.run(lambda s: store.current_versions(s, tenant_id, ids))
        links = await self.signer.links_for(ids, mode)
        presented = []
        for citations, style in items:
            sources = citations.sources
            if current is not None:
                sources = mark_stale(sources, current)
            sources = apply_style(with_links(sources, links), style)
            presented.append(dataclasses.replace(citations, sources=sources))
        return presented
