"""Cost of the evidence step per answer sentence, against the answer's own generation, same run.

The examples/ documents are parsed and chunked as ingestion does; for each question the best
chunks by embedding similarity become the sources, the extractive generator answers through
the marker buffer, and the evidence builder judges every sentence. Two runs per question:
the answer as generated (every sentence cited), and the same answer with its markers removed
(the model forgot to cite), which takes the attribution path over every source.

Extractive answers copy their sources, so the checks settle most verdicts without the
embedder. A second set makes the embedder work: each hand-written claim of eval/claims.jsonl
(paraphrases, traps) is an answer of one sentence over eight sources, its own passage and the
next seven distinct passages of the file; once cited to its passage, once with no marker.

Each evidence embedder is timed in turn (static, the default, then local MiniLM); retrieval
and the extractive answers use the local model either way.

Usage: .venv/bin/python bench/evidence.py [--repeat 3] [--top-k 8] [--claims 278]
       [--embedders static local]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
from pathlib import Path

import numpy as np
from harness import percentile

from services.citations import (
    MarkerBuffer,
    RetrievedChunk,
    ScoreKind,
    SourceLocation,
    answer_sentences,
    build_manifest,
    extract,
    finalize_extraction,
    join_heading,
)
from services.documents.chunking import chunk
from services.documents.parsing import parse
from services.evidence.builder import EvidenceBuilder, evidence_builder
from services.llm.base import GenerationRequest, PromptMessage, TextPiece
from services.llm.extractive import ExtractiveGenerator
from services.retrieval.embeddings import LocalEmbedder

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CLAIMS = Path(__file__).resolve().parents[1] / "eval" / "claims.jsonl"
QUESTIONS = [
    "How much is the per diem on the day of departure?",
    "Who approves an expense claim above 1,000 EUR?",
    "Which class of travel is allowed on long flights?",
    "How often must passwords be changed?",
    "What should I do if I lose my laptop?",
    "Can I be reimbursed for a hotel minibar?",
    "How many days do I have to submit receipts?",
    "Is multi-factor authentication required for remote access?",
    "What is the mileage rate for a private car?",
    "Who do I report a phishing email to?",
]
_MARKERS = re.compile(r" ?\[\d+(?:[,-] ?\d+)*\]")


def load_chunks() -> list[RetrievedChunk]:
    chunks: list[RetrievedChunk] = []
    for path in sorted(EXAMPLES.iterdir()):
        extracted = parse(path.read_bytes(), filename=path.name)
        for piece in chunk(extracted):
            chunks.append(
                RetrievedChunk(
                    chunk_id=f"{path.name}#{piece.index}",
                    document_id=path.name,
                    document_name=path.name,
                    content_type="text/plain",
                    chunk_index=piece.index,
                    text=piece.text,
                    score=0.0,
                    score_kind=ScoreKind.SIMILARITY,
                    location=SourceLocation(
                        start_offset=piece.start_offset,
                        end_offset=piece.end_offset,
                        start_line=piece.start_line,
                        end_line=piece.end_line,
                        heading=join_heading(piece.heading_path),
                        start_byte=piece.start_byte,
                        end_byte=piece.end_byte,
                    ),
                )
            )
    return chunks


async def generate(request: GenerationRequest, n_sources: int) -> tuple[str, object]:
    buffer = MarkerBuffer(n_sources)
    async for event in ExtractiveGenerator().generate(request):
        if isinstance(event, TextPiece):
            buffer.feed(event.text)
    buffer.finish()
    return buffer.output, buffer.result()


def claim_cases(limit: int) -> list[tuple[str, list[RetrievedChunk]]]:
    """(claim, eight passages as chunks with the claim's own first) for the first claims."""
    rows = [json.loads(line) for line in CLAIMS.read_text(encoding="utf-8").splitlines() if line]
    passages = list(dict.fromkeys(r["passage"] for r in rows))
    cases = []
    for row in rows[:limit]:
        at = passages.index(row["passage"])
        chosen = [passages[(at + k) % len(passages)] for k in range(8)]
        chunks = [
            RetrievedChunk(
                chunk_id=f"p{passages.index(text)}",
                document_id=f"p{passages.index(text)}",
                document_name=row["document"] if k == 0 else f"passage-{passages.index(text)}",
                content_type="text/plain",
                chunk_index=0,
                text=text,
                score=0.0,
                score_kind=ScoreKind.SIMILARITY,
                location=SourceLocation(start_offset=0, end_offset=len(text)),
            )
            for k, text in enumerate(chosen)
        ]
        cases.append((row["claim"], chunks))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--claims", type=int, default=278)
    parser.add_argument(
        "--embedders", nargs="+", choices=("static", "local"), default=["static", "local"]
    )
    args = parser.parse_args()

    embedder = LocalEmbedder()
    embedder.load()
    chunks = load_chunks()
    vectors = np.asarray(embedder.embed_documents([c.text for c in chunks]), dtype=np.float32)
    for name in args.embedders:
        print(f"evidence embedder: {name}")
        run(evidence_builder(name), embedder, chunks, vectors, args)


def run(
    builder: EvidenceBuilder,
    embedder: LocalEmbedder,
    chunks: list[RetrievedChunk],
    vectors: np.ndarray,
    args: argparse.Namespace,
) -> None:
    # One untimed answer first: the process's one-time costs (word tables, caches) are not a
    # sentence's.
    warm = build_manifest(chunks[:2])
    warm_text = f"{chunks[0].text[:200]} [1]"
    warm_ex = extract(warm_text, len(warm.sources))
    builder.for_answer(warm.sources, warm.chunks).finish(
        warm_ex.text, warm_ex.markers, finalize_extraction(warm_ex, warm.sources)[1]
    )

    per_sentence: dict[str, list[float]] = {"cited": [], "unmarked": []}
    generation_ms: list[float] = []
    query_ms: list[float] = []
    sentences_total = {"cited": 0, "unmarked": 0}
    for _ in range(args.repeat):
        for question in QUESTIONS:
            began = time.perf_counter()
            query = np.asarray(embedder.embed_query(question), dtype=np.float32)
            query_ms.append((time.perf_counter() - began) * 1000)
            order = np.argsort(-(vectors @ query))[: args.top_k]
            hits = [chunks[i] for i in order]
            manifest = build_manifest(hits)
            request = GenerationRequest(
                messages=[PromptMessage("user", question)],
                sources=manifest.sources,
                source_texts=[c.text for c in manifest.chunks],
                question=question,
            )
            began = time.perf_counter()
            text, extraction = asyncio.run(generate(request, len(manifest.sources)))
            finalize_extraction(extraction, manifest.sources)
            generation_ms.append((time.perf_counter() - began) * 1000)
            unmarked = _MARKERS.sub("", text)
            for kind, answer in (("cited", text), ("unmarked", unmarked)):
                ex = extract(answer, len(manifest.sources))
                _, base = finalize_extraction(ex, manifest.sources)
                n = len(answer_sentences(ex.text, ex.markers))
                if not n:
                    continue
                began = time.perf_counter()
                builder.for_answer(manifest.sources, manifest.chunks).finish(
                    ex.text, ex.markers, base
                )
                spent = (time.perf_counter() - began) * 1000
                per_sentence[kind].extend([spent / n] * n)
                sentences_total[kind] += n

    claim_ms: dict[str, list[float]] = {"claims cited": [], "claims unmarked": []}
    for claim, hits in claim_cases(args.claims):
        manifest = build_manifest(hits)
        for kind, answer in (("claims cited", f"{claim} [1]"), ("claims unmarked", claim)):
            ex = extract(answer, len(manifest.sources))
            _, base = finalize_extraction(ex, manifest.sources)
            began = time.perf_counter()
            builder.for_answer(manifest.sources, manifest.chunks).finish(ex.text, ex.markers, base)
            claim_ms[kind].append((time.perf_counter() - began) * 1000)

    gen = statistics.median(generation_ms)
    query = statistics.median(query_ms)
    print(f"answers: {len(QUESTIONS) * args.repeat}, top-k {args.top_k}, chunks {len(chunks)}")
    print(f"baseline: extractive generation median {gen:.1f} ms per answer")
    print(f"baseline: one query embedding median {query:.1f} ms")
    for kind, values in per_sentence.items():
        print(
            f"evidence ({kind}): {sentences_total[kind]} sentences, per sentence "
            f"p50 {statistics.median(values):.1f} ms, p95 {percentile(values, 95):.1f} ms; "
            f"p95 = {percentile(values, 95) / gen:.1f}x an answer's generation, "
            f"{percentile(values, 95) / query:.2f}x a query embedding"
        )
    for kind, values in claim_ms.items():
        print(
            f"evidence ({kind}): {len(values)} sentences, per sentence "
            f"p50 {statistics.median(values):.1f} ms, p95 {percentile(values, 95):.1f} ms; "
            f"p95 = {percentile(values, 95) / query:.2f}x a query embedding"
        )


if __name__ == "__main__":
    main()
