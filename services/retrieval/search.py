"""Hybrid search: pgvector cosine and Postgres full-text, fused by reciprocal rank."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, text
from sqlalchemy.orm import Session

from services.citations import RetrievedChunk, ScoreKind, SourceLocation, join_heading
from services.retrieval.fusion import fuse, normalize_score

MIN_CANDIDATES = 20

VECTOR_SQL = text(
    """
    SELECT c.id, 1 - (c.embedding <=> CAST(:query AS vector)) AS similarity
    FROM chunks c JOIN documents d ON d.id = c.document_id
    WHERE c.tenant_id = :tenant AND c.assistant_id = :assistant
      AND d.state = 'READY' AND d.delete_time IS NULL
    ORDER BY c.embedding <=> CAST(:query AS vector)
    LIMIT :limit
    """
)

# Questions are natural language: OR-ing their terms finds chunks that share some of them,
# where plainto_tsquery's AND would demand every word. plainto_tsquery still does the parsing,
# so no user text reaches to_tsquery's syntax.
TEXT_SQL = text(
    """
    WITH q AS (
      SELECT to_tsquery('english', replace(plainto_tsquery('english', :query)::text, '&', '|'))
        AS query
    )
    SELECT c.id, ts_rank_cd(c.tsv, q.query) AS rank
    FROM chunks c JOIN documents d ON d.id = c.document_id, q
    WHERE c.tenant_id = :tenant AND c.assistant_id = :assistant
      AND d.state = 'READY' AND d.delete_time IS NULL
      AND q.query <> ''::tsquery AND c.tsv @@ q.query
    ORDER BY rank DESC, c.id
    LIMIT :limit
    """
)

DETAILS_SQL = text(
    """
    SELECT c.id, c.document_id, d.display_name, d.content_type, c.chunk_index, c.text,
           c.start_offset, c.end_offset, c.start_byte, c.end_byte, c.start_line, c.end_line,
           c.page_start, c.page_end, c.heading_path, d.sha256, d.indexed_time
    FROM chunks c JOIN documents d ON d.id = c.document_id
    WHERE c.id = ANY(:ids)
    """
)


def vector_literal(vector: Sequence[float]) -> str:
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


def hybrid_search(
    s: Session,
    *,
    tenant_id: str,
    assistant_id: str,
    query: str,
    query_vector: Sequence[float],
    top_k: int,
    score_threshold: float = 0.0,
) -> list[RetrievedChunk]:
    """The best chunks of one assistant's READY documents, best first, with provenance."""
    limit = max(MIN_CANDIDATES, 4 * top_k)
    params = {"tenant": tenant_id, "assistant": uuid.UUID(assistant_id), "limit": limit}
    # Filtering after an HNSW scan can leave too few rows; iterative scans keep looking.
    s.execute(text("SET LOCAL hnsw.iterative_scan = 'relaxed_order'"))
    vector_rows = s.execute(VECTOR_SQL, {**params, "query": vector_literal(query_vector)}).all()
    # relaxed_order may return rows slightly out of order; the ranking must be exact.
    vector_rows = sorted(vector_rows, key=lambda r: (-r.similarity, r.id))
    text_rows = s.execute(TEXT_SQL, {**params, "query": query}).all() if query.strip() else []
    fused = fuse([[r.id for r in vector_rows], [r.id for r in text_rows]])
    similarity = {r.id: float(r.similarity) for r in vector_rows}
    ranked = sorted(fused, key=lambda i: (-fused[i], -similarity.get(i, -1.0), i))
    scores = {i: normalize_score(fused[i], ScoreKind.FUSED) for i in ranked}
    kept = [i for i in ranked if scores[i] >= score_threshold][:top_k]
    if not kept:
        return []
    details = {r.id: r for r in s.execute(DETAILS_SQL, {"ids": kept}).all()}
    return [to_retrieved(details[i], scores[i]) for i in kept if i in details]


def to_retrieved(r: Row[Any], score: float) -> RetrievedChunk:
    """A DETAILS_SQL row as the citation engine's input."""
    return RetrievedChunk(
        chunk_id=str(r.id),
        document_id=str(r.document_id),
        document_name=r.display_name,
        content_type=r.content_type,
        chunk_index=r.chunk_index,
        text=r.text,
        score=score,
        score_kind=ScoreKind.FUSED,
        location=SourceLocation(
            start_offset=r.start_offset,
            end_offset=r.end_offset,
            start_line=r.start_line,
            end_line=r.end_line,
            page_start=r.page_start or 0,
            page_end=r.page_end or 0,
            heading=join_heading(r.heading_path or ()),
            start_byte=r.start_byte or 0,
            end_byte=r.end_byte or 0,
        ),
        document_sha256=r.sha256,
        indexed_time=r.indexed_time,
    )
