"""How well the local model follows the prompt: the old header format against the new blocks.

Needs the `llm` extra (make test-llm builds it). Indexes licence texts with the real parser,
chunker and local embedder, retrieves 6 chunks per question by vector and word rank, and asks
the local llama-server each question twice in the same run: with the earlier prompt
(`[N] (Source: "name")` headers, "Cite your sources.") and with the current one
(`build_context`, `CITE_REMINDER`). For each it prints how many answers paste a source header,
cite nothing, are cut at the token limit, and the share of answer text inside cited spans.

    .venv/bin/python bench/llm_prompt.py [--docs /usr/share/common-licenses]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import tempfile
from pathlib import Path

from devstack import local_llm
from services.chat.pipeline import CITE_REMINDER, DEFAULT_SYSTEM_PROMPT
from services.citations import (
    RetrievedChunk,
    ScoreKind,
    SourceLocation,
    build_context,
    build_manifest,
    build_spans,
    extract,
    source_label,
)
from services.documents.chunking import chunk
from services.documents.parsing import parse
from services.llm.base import GenerationRequest, PromptMessage, TextPiece
from services.llm.openai_compat import OpenAIGenerator
from services.retrieval.embeddings import create_embedder

DOCS = ["Apache-2.0", "GPL-3", "MPL-2.0", "CC0-1.0", "Artistic", "LGPL-2.1"]
QUESTIONS = [
    "When does the license terminate under GPL version 3?",
    "What does the Apache License say about warranties?",
    "What does CC0 waive?",
    "Can I charge a fee for distributing copies of a package under the Artistic License?",
    "What patent license does a contributor grant under the Apache License?",
    "Can I reinstate my GPL license after a violation is cured?",
    "Do I have to give recipients a copy of the Apache License when I redistribute the work?",
    "What is a Legal Entity in the Apache License?",
    "What does Covered Software mean in the MPL?",
    "Is there any warranty for a program under the GPL?",
    "What is the capital of Australia?",
    "How many vacation days do employees get per year?",
]
OLD_INSTRUCTIONS = (
    "Answer from the numbered sources below. Cite each source you use with its number in "
    "square brackets right after the sentence that uses it, like [1]; cite several sources "
    "as [1][3]. Cite only the sources you actually used, and only the numbers listed here."
)
HEADER = re.compile(r"\[\d+\]\s*\(Source:|<\s*/?\s*source\b|^Source:", re.IGNORECASE | re.M)


def old_context(manifest) -> str:
    blocks = [OLD_INSTRUCTIONS]
    for source, c in zip(manifest.sources, manifest.chunks, strict=True):
        label = source_label(source.document_name, source.location)
        blocks.append(f"[{source.index}] (Source: {label})\n{c.text.strip()}")
    return "\n\n".join(blocks)


def index(folder: Path, embedder):
    chunks = []
    for name in DOCS:
        path = folder / name
        if path.is_file():
            for c in chunk(parse(path.read_bytes(), "text/plain", name)):
                chunks.append((name, c))
    vectors = embedder.embed_documents([c.text for _, c in chunks])
    return chunks, vectors


def retrieve(question: str, chunks, vectors, embedder, k: int = 6) -> list[RetrievedChunk]:
    query = embedder.embed_query(question)
    words = set(re.findall(r"\w+", question.lower()))
    cos = [sum(a * b for a, b in zip(query, v, strict=True)) for v in vectors]
    lex = [len(words & set(re.findall(r"\w+", c.text.lower()))) for _, c in chunks]
    fused: dict[int, float] = {}
    for ranks in (cos, lex):
        for r, i in enumerate(sorted(range(len(chunks)), key=lambda i: -ranks[i])[:30]):
            fused[i] = fused.get(i, 0.0) + 1 / (61 + r)
    top = sorted(fused, key=lambda i: (-fused[i], i))[:k]
    return [
        RetrievedChunk(
            f"c{i}",
            f"d-{chunks[i][0]}",
            chunks[i][0],
            "text/plain",
            chunks[i][1].index,
            chunks[i][1].text,
            min(1.0, fused[i] * 61 / 2),
            ScoreKind.FUSED,
            SourceLocation(),
        )
        for i in top
    ]


def measure(answer: str, n: int) -> dict[str, float]:
    extraction = extract(answer, n_sources=n)
    spans = build_spans(answer, extraction.markers)
    inside = sum(s.end - s.start for s in spans)
    return {
        "header": bool(HEADER.search(answer)),
        "cited": bool(extraction.referenced_indices),
        "in_spans": inside / max(1, len(answer.strip())),
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=Path, default=Path("/usr/share/common-licenses"))
    parser.add_argument("--show", action="store_true", help="print every answer")
    args = parser.parse_args()
    embedder = create_embedder()
    chunks, vectors = index(args.docs, embedder)
    state = Path(tempfile.gettempdir()) / "footnote-bench-llm"
    llm = local_llm.prepare_local_llm(state)
    proc = subprocess.Popen(
        llm.args, env=llm.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        local_llm.wait_ready(llm.base_url, 120.0, proc=proc)
        generator = OpenAIGenerator(llm.base_url, llm.model_name, timeout_seconds=300.0)
        results: dict[str, list[dict]] = {"before": [], "after": []}
        for question in QUESTIONS:
            manifest = build_manifest(retrieve(question, chunks, vectors, embedder))
            prompts = {
                "before": (old_context(manifest), "Cite your sources.", 1024),
                "after": (build_context(manifest), CITE_REMINDER, 512),
            }
            for kind, (context, reminder, limit) in prompts.items():
                request = GenerationRequest(
                    messages=[
                        PromptMessage("system", f"{DEFAULT_SYSTEM_PROMPT}\n\n{context}"),
                        PromptMessage("user", f"{question}\n\n{reminder}"),
                    ],
                    temperature=0.0,
                    max_output_tokens=limit,
                )
                events = [e async for e in generator.generate(request)]
                answer = "".join(e.text for e in events if isinstance(e, TextPiece))
                row = measure(answer, len(manifest.sources))
                row["cut"] = events[-1].reason.value == "LENGTH"
                row["chars"] = len(answer)
                results[kind].append(row)
                if args.show:
                    print(f"--- {kind}: {question}\n{answer}\n")
        await generator.aclose()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    n = len(QUESTIONS)
    print(f"{n} questions, {len(chunks)} chunks, model {llm.model_name}")
    print("prompt  pasted-header  cite-nothing  cut-at-limit  mean-in-spans  min-in-spans  chars")
    for kind, rows in results.items():
        shares = [r["in_spans"] for r in rows]
        headers = sum(r["header"] for r in rows)
        uncited = sum(not r["cited"] for r in rows)
        cut = sum(r["cut"] for r in rows)
        chars = sum(r["chars"] for r in rows) // n
        print(
            f"{kind:7} {headers:>6}/{n}  {uncited:>8}/{n}  {cut:>9}/{n}"
            f"  {sum(shares) / n:>12.2f}  {min(shares):>12.2f}  {chars:>5}"
        )


if __name__ == "__main__":
    asyncio.run(main())
