"""Throughput of citation extraction and stream buffering against a naive regex, same run.

Usage: .venv/bin/python bench/citations.py [--mb 2] [--repeat 5]
"""

from __future__ import annotations

import argparse
import random
import re
import time
from collections.abc import Callable

from services.citations import MarkerBuffer, extract

N_SOURCES = 5
WORDS = [
    "revenue", "grew", "costs", "fell", "the", "quarter", "report", "install", "linux",
    "package", "service", "answer", "source", "document", "chunk", "index", "latency",
    "model", "retrieval", "vector", "policy", "customer", "support", "release",
]  # fmt: skip
NAIVE_MARKER = re.compile(r"\[(\d+)\]")
NAIVE_PARTIAL = re.compile(r"\[[\d, -]*\Z")


def make_corpus(size: int, seed: int = 7) -> str:
    """LLM-like answers: sentences with markers, bullets, inline code, fences and links."""
    rng = random.Random(seed)
    markers = ["[1]", "[2]", "[1][3]", "[2, 4]", "[1-3]", "【2】", "[9]", "[5]"]
    parts: list[str] = []
    total = 0
    while total < size:
        roll = rng.random()
        if roll < 0.05:
            block = "```python\nitems[1] = load('[2]')\nprint(items[0])\n```\n"
        elif roll < 0.15:
            block = f"- {' '.join(rng.choices(WORDS, k=6))} {rng.choice(markers)}\n"
        else:
            sentence = " ".join(rng.choices(WORDS, k=rng.randint(6, 18))).capitalize()
            extra = rng.random()
            if extra < 0.1:
                sentence += " with `cfg[1]` set"
            elif extra < 0.15:
                sentence += " per [the docs](https://example.test/a[1])"
            block = f"{sentence} {rng.choice(markers)}. " if rng.random() < 0.6 else f"{sentence}. "
            if rng.random() < 0.1:
                block += "\n\n"
        parts.append(block)
        total += len(block)
    return "".join(parts)


def split_pieces(text: str, seed: int = 11) -> list[str]:
    """Token-sized pieces, 1 to 8 code points, as an LLM would stream them."""
    rng = random.Random(seed)
    pieces, i = [], 0
    while i < len(text):
        step = rng.randint(1, 8)
        pieces.append(text[i : i + step])
        i += step
    return pieces


def naive_extract(text: str) -> list[int]:
    return sorted({int(n) for n in NAIVE_MARKER.findall(text)})


def naive_stream(pieces: list[str]) -> int:
    """Hold back a trailing "[12, " and count markers in what is sent."""
    held, sent, found = "", 0, 0
    for piece in pieces:
        held += piece
        m = NAIVE_PARTIAL.search(held)
        cut = m.start() if m else len(held)
        found += len(NAIVE_MARKER.findall(held, 0, cut))
        sent += cut
        held = held[cut:]
    return found + len(NAIVE_MARKER.findall(held))


def engine_stream(pieces: list[str], strip: bool) -> int:
    buffer = MarkerBuffer(N_SOURCES, strip_invalid=strip)
    events = 0
    for piece in pieces:
        events += len(buffer.feed(piece))
    events += len(buffer.finish())
    return events


def best_seconds(run: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=2.0, help="corpus size in MB of UTF-8")
    parser.add_argument("--repeat", type=int, default=5, help="runs per case; the best counts")
    args = parser.parse_args()

    corpus = make_corpus(int(args.mb * 1_000_000))
    megabytes = len(corpus.encode()) / 1e6
    pieces = split_pieces(corpus)
    print(f"corpus: {megabytes:.2f} MB, {len(corpus):,} code points, {len(pieces):,} pieces")
    print(
        f"markers found: engine {len(extract(corpus, N_SOURCES).markers):,}, "
        f"naive {len(NAIVE_MARKER.findall(corpus)):,} (naive also counts code and links)"
    )

    cases = [
        ("extract", lambda: extract(corpus, N_SOURCES), lambda: naive_extract(corpus)),
        (
            "extract+strip",
            lambda: extract(corpus, N_SOURCES, strip_invalid=True),
            lambda: NAIVE_MARKER.sub(lambda m: m[0] if int(m[1]) <= N_SOURCES else "", corpus),
        ),
        ("stream", lambda: engine_stream(pieces, False), lambda: naive_stream(pieces)),
        ("stream+strip", lambda: engine_stream(pieces, True), lambda: naive_stream(pieces)),
    ]
    print(f"{'case':<14} {'engine MB/s':>12} {'naive MB/s':>12} {'engine/naive':>13}")
    for name, engine, naive in cases:
        ours = megabytes / best_seconds(engine, args.repeat)
        base = megabytes / best_seconds(naive, args.repeat)
        print(f"{name:<14} {ours:>12.1f} {base:>12.1f} {ours / base:>12.2f}x")


if __name__ == "__main__":
    main()
