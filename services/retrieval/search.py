"""Hybrid search: pgvector cosine and Postgres full-text, fused by reciprocal rank.

Ties are broken by stable keys (document name, document sha256, chunk index), never by the
random row ids, so the same question over the same documents ranks the same way every time.
The tunables (weights, candidate depth, the per-document cap) live in fusion.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, text
from sqlalchemy.orm import Session

from services.citations import RetrievedChunk, ScoreKind, SourceLocation, join_heading
from services.retrieval import fusion
from services.retrieval.fusion import diversify, fuse, normalize_score

# A document is searched unless an older READY document of the same assistant holds the same
# bytes: uploading a file twice must not fill the sources with the same passages twice.
SEARCHABLE = """
      c.tenant_id = :tenant AND c.assistant_id = :assistant
      AND d.state = 'READY' AND d.delete_time IS NULL
      AND NOT EXISTS (
        SELECT 1 FROM documents older
        WHERE older.assistant_id = d.assistant_id AND older.sha256 = d.sha256
          AND older.state = 'READY' AND older.delete_time IS NULL
          AND (older.create_time, older.id) < (d.create_time, d.id)
      )
"""

VECTOR_SQL = text(
    f"""
    SELECT c.id, 1 - (c.embedding <=> CAST(:query AS vector)) AS similarity
    FROM chunks c JOIN documents d ON d.id = c.document_id
    WHERE {SEARCHABLE}
    ORDER BY c.embedding <=> CAST(:query AS vector)
    LIMIT :limit
    """
)

# Questions are natural language: OR-ing their terms finds chunks that share some of them,
# where plainto_tsquery's AND would demand every word. plainto_tsquery still does the parsing,
# so no user text reaches to_tsquery's syntax. The title and headings are weighted 'A', the
# text 'D' (fusion.TEXT_RANK_WEIGHTS).
TEXT_SQL = text(
    f"""
    WITH q AS (
      SELECT to_tsquery('english', replace(plainto_tsquery('english', :query)::text, '&', '|'))
        AS query
    )
    SELECT c.id, ts_rank_cd(CAST(:weights AS float4[]), c.tsv, q.query) AS rank
    FROM chunks c JOIN documents d ON d.id = c.document_id, q
    WHERE {SEARCHABLE}
      AND q.query <> ''::tsquery AND c.tsv @@ q.query
    ORDER BY rank DESC, d.display_name, d.sha256, c.chunk_index
    LIMIT :limit
    """
)

# What ranking needs of every candidate: its document and the stable tie-break keys.
KEYS_SQL = text(
    """
    SELECT c.id, c.document_id, d.display_name, d.sha256, c.chunk_index
    FROM chunks c JOIN documents d ON d.id = c.document_id
    WHERE c.id = ANY(:ids)
    """
)

DETAILS_SQL = text(
    """
    SELECT c.id, c.document_id, d.display_name, d.content_type, c.chunk_index, c.text,
           c.start_offset, c.end_offset, c.start_byte, c.end_byte, c.start_line, c.end_line,
           c.page_start, c.page_end, c.paragraph_start, c.paragraph_end, c.heading_path,
           d.sha256, d.indexed_time
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
    limit = max(fusion.MIN_CANDIDATES, fusion.CANDIDATES_PER_RESULT * top_k)
    params = {"tenant": tenant_id, "assistant": uuid.UUID(assistant_id), "limit": limit}
    # Filtering after an HNSW scan can leave too few rows; iterative scans keep looking.
    s.execute(text("SET LOCAL hnsw.iterative_scan = 'relaxed_order'"))
    vector_rows = s.execute(VECTOR_SQL, {**params, "query": vector_literal(query_vector)}).all()
    text_rows = []
    if query.strip():
        weights = "{" + ",".join(str(w) for w in fusion.TEXT_RANK_WEIGHTS) + "}"
        text_rows = s.execute(TEXT_SQL, {**params, "query": query, "weights": weights}).all()
    similarity = {r.id: float(r.similarity) for r in vector_rows}
    candidates = {r.id for r in vector_rows} | {r.id for r in text_rows}
    if not candidates:
        return []
    keys = {r.id: r for r in s.execute(KEYS_SQL, {"ids": list(candidates)}).all()}
    # A chunk purged between the statements is no candidate.
    similarity = {i: value for i, value in similarity.items() if i in keys}
    by_text = [r.id for r in text_rows if r.id in keys]

    def stable(chunk_id: uuid.UUID) -> tuple[str, str, int]:
        row = keys[chunk_id]
        return (row.display_name, row.sha256, row.chunk_index)

    # relaxed_order may return rows slightly out of order; the ranking must be exact.
    by_vector = sorted(similarity, key=lambda i: (-similarity[i], stable(i)))
    fused = fuse(
        [by_vector, by_text],
        weights=(fusion.VECTOR_WEIGHT, fusion.TEXT_WEIGHT),
    )
    ranked = sorted(fused, key=lambda i: (-fused[i], -similarity.get(i, -1.0), stable(i)))
    scores = {i: normalize_score(fused[i], ScoreKind.FUSED) for i in ranked}
    passing = [i for i in ranked if scores[i] >= score_threshold]
    kept = diversify(
        passing, lambda i: keys[i].document_id, lambda i: similarity.get(i, 0.0), top_k
    )
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
            paragraph_start=r.paragraph_start or 0,
            paragraph_end=r.paragraph_end or 0,
        ),
        document_sha256=r.sha256,
        indexed_time=r.indexed_time,
    )
