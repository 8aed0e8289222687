"""Prometheus series recorded by the gRPC frontends (docs/operations.md lists them all).

Labels take values from small fixed sets (method names, status codes, error reasons); never
ids. Series recorded by the workers live in `worker_metrics`, so each process only exposes
what it records.
"""

from __future__ import annotations

import time

from prometheus_client import Counter, Gauge, Histogram

# Seconds, from a fast unary call to a long streamed answer.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
DELTA_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)

RPC_REQUESTS = Counter(
    "footnote_rpc_requests",
    "gRPC calls handled, by method and status code.",
    ["service", "method", "code"],
)
RPC_DURATION = Histogram(
    "footnote_rpc_duration_seconds",
    "Time from the start of a gRPC call to its status, by method and status code.",
    ["service", "method", "code"],
    buckets=LATENCY_BUCKETS,
)
RPC_IN_FLIGHT = Gauge(
    "footnote_rpc_in_flight",
    "gRPC calls being handled now, by method.",
    ["service", "method"],
)
CHAT_TIME_TO_FIRST_DELTA = Histogram(
    "footnote_chat_time_to_first_delta_seconds",
    "StreamComplete: time from the call's start to its first answer delta.",
    buckets=LATENCY_BUCKETS,
)
CHAT_DELTAS_PER_STREAM = Histogram(
    "footnote_chat_deltas_per_stream",
    "StreamComplete: answer deltas sent in one completed stream.",
    buckets=DELTA_BUCKETS,
)
RETRIEVAL_DURATION = Histogram(
    "footnote_retrieval_duration_seconds",
    "Retrieval for one question: embedding the query and the hybrid search.",
    buckets=LATENCY_BUCKETS,
)
LLM_TIME_TO_FIRST_TOKEN = Histogram(
    "footnote_llm_time_to_first_token_seconds",
    "OpenAI-compatible upstream: time from sending the request to the first answer text.",
    buckets=LATENCY_BUCKETS,
)
LLM_ERRORS = Counter(
    "footnote_llm_errors",
    "OpenAI-compatible upstream: failed answers, by ErrorInfo reason (LLM_TIMEOUT, ...).",
    ["reason"],
)


class StreamStats:
    """Time to first delta and deltas per stream, for one StreamComplete call."""

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.deltas = 0

    def delta(self) -> None:
        if self.deltas == 0:
            CHAT_TIME_TO_FIRST_DELTA.observe(time.perf_counter() - self.began)
        self.deltas += 1

    def completed(self) -> None:
        CHAT_DELTAS_PER_STREAM.observe(self.deltas)


VECTOR_SEARCHES = Counter(
    "footnote_vector_searches",
    "Vector searches, by how each was answered: exact (in Postgres, a small assistant),"
    " index (HNSW), memory (exact, over the assistant's vectors held in memory).",
    ["path"],
)
VECTOR_MEMORY_BYTES = Gauge(
    "footnote_vector_memory_bytes",
    "Bytes of assistants' vectors held in memory for exact search (FOOTNOTE_VECTOR_MEMORY_MB).",
)
VECTOR_MEMORY_ASSISTANTS = Gauge(
    "footnote_vector_memory_assistants",
    "Assistants whose vectors are held in memory for exact search.",
)
