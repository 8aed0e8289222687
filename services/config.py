"""Footnote's configuration: one Settings object read from FOOTNOTE_* environment variables."""

from __future__ import annotations

import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Settings of the server and workers; an unset service URL means "start the embedded one"."""

    model_config = SettingsConfigDict(env_prefix="FOOTNOTE_", extra="ignore")

    database_url: str | None = None
    broker_url: str | None = None
    s3_endpoint: str | None = Field(default=None, description="http(s)://host:port of the S3 API")
    s3_access_key: str | None = None
    s3_secret_key: str | None = None
    s3_bucket: str = "footnote"
    s3_region: str = "us-east-1"

    llm_base_url: str | None = None
    llm_model: str = "default"
    llm_api_key: str | None = None
    llm_timeout_seconds: float = Field(default=60.0, gt=0)
    # Answers streaming at once from the LLM, one connection each; unset = as many as the
    # open-file limit allows. One more waits llm_pool_timeout_seconds, then RESOURCE_EXHAUSTED.
    llm_max_connections: int | None = Field(default=None, ge=1)
    llm_pool_timeout_seconds: float = Field(default=10.0, gt=0)
    # How long an idle upstream connection is kept for the next answer (aiohttp's default is
    # 15 s, httpx's 5 s).
    llm_keepalive_seconds: float = Field(default=60.0, gt=0)

    embeddings_base_url: str | None = None
    embeddings_model: str | None = None
    embeddings_api_key: str | None = None
    embeddings_dim: int | None = Field(default=None, ge=1)
    # Threads of the local embedding model (onnxruntime's intra-op pool) per process. 0 means
    # onnxruntime's default, one per core of the machine; `footnote worker --concurrency N`
    # gives each pool process max(1, cores // N) instead, so that N processes share the cores.
    embedding_threads: int = Field(default=0, ge=0)
    # The local model's arithmetic for questions: "int8" (its 8-bit copy, 2.3x as fast: the
    # first delta about 3 ms sooner at 100k chunks) or "float32" (the passages' own). On
    # labelled sets the two rank the same but for a question or two (docs/embeddings.md).
    question_embedding: Literal["int8", "float32"] = "int8"
    # What the evidence scorer embeds answer sentences and quotes with, whatever retrieval
    # uses: "static" (WordLlama's token table, about 0.1 ms a sentence) or "local" (MiniLM,
    # 13-20 ms a sentence on two cores, verdicts about 1 point closer to the labelled set).
    evidence_embedder: Literal["static", "local"] = "static"
    # HNSW's search breadth (pgvector's hnsw.ef_search): more finds more of the true nearest
    # chunks in a large index, for more time. At 1M chunks, in one build of the index, 100
    # found 0.917 of them in 7.6 ms and 400 found 0.982 in 26 ms (docs/performance.md). An
    # index of more than 500,000 chunks is walked at least search.LARGE_EF_SEARCH (300) wide.
    hnsw_ef_search: int = Field(default=100, ge=10, le=1000)
    # Memory each server process may hold assistants' vectors in, as 8-bit codes (4-bit for
    # assistants of 65,536 chunks or more, where the machine scores them faster), for exact
    # search where HNSW misses (services/retrieval/vector_memory.py): about 0.41 MB per 1,000
    # chunks of 384 dimensions (0.46 in 4 bits), so the default holds 1.3M chunks (an
    # assistant too large for it in 4 bits is held in 8); an assistant larger than all of it
    # stays on HNSW. 0 turns it off.
    vector_memory_mb: int = Field(default=512, ge=0)

    grpc_host: str = "127.0.0.1"
    # 0 for the gRPC and HTTP ports: any free port (the server logs the one it bound).
    grpc_port: int = Field(default=50051, ge=0, le=65535)
    # A call the server has not picked up yet waits this long, then gRPC cancels it. The
    # server picks up one call per turn of its event loop, so a thousand calls arriving while
    # a thousand answers stream can queue for longer than gRPC's own 30 s (CANCELLED).
    grpc_accept_timeout_seconds: int = Field(default=300, ge=1)
    # The server's event loop: uvloop, or asyncio's own. uvloop held 1,000 streams' gaps
    # between deltas closer to a bare gRPC server's in every round measured, and was level
    # elsewhere (docs/performance.md, "Event loop").
    event_loop: Literal["asyncio", "uvloop"] = "uvloop"
    # How long a thread may hold Python's interpreter lock while another waits for it
    # (sys.setswitchinterval; Python's default is 5 ms). The event loop gives the lock up at
    # every turn, and getting it back waits out whatever thread took it meanwhile: a shorter
    # interval shortens the loop's waits behind the database and model threads
    # (docs/performance.md, "Switch interval").
    thread_switch_interval_ms: float = Field(default=1.0, gt=0, le=100)
    http_port: int = Field(default=8080, ge=0, le=65535)
    public_base_url: str | None = None
    state_dir: Path = Path("state")
    dev_api_key: str | None = None

    max_upload_bytes: int = Field(default=100 * 1024 * 1024, ge=1)
    chunk_chars: int = Field(default=1200, ge=1)
    chunk_overlap_chars: int = Field(default=200, ge=0)
    # Ingestion: a worker holds a lease on the document it works on and renews it every few
    # seconds (its heartbeat); a killed attempt is taken over by the redelivered task or the
    # reconciler as soon as its process is gone or three heartbeats are missed.
    ingest_lease_seconds: float = Field(default=60.0, gt=0)
    # Transient failures retry after about 5, 10, 20, 40, 80, 120, 120 and 120 seconds (each
    # with jitter between half and all of it): a horizon of four to nine minutes.
    ingest_max_retries: int = Field(default=8, ge=0)
    ingest_retry_backoff_seconds: int = Field(default=5, ge=0)
    ingest_retry_backoff_max_seconds: int = Field(default=120, ge=0)
    # Per-document limits: past them a document ends FAILED (permanent) naming the limit. The
    # budget stays below the task's soft time limit.
    max_chunks_per_document: int = Field(default=10_000, ge=1)
    ingest_time_budget_seconds: float = Field(default=600.0, gt=0)
    reconcile_interval_seconds: float = Field(default=30.0, gt=0)
    # A PENDING document is re-sent this long after its last send (it may sit in a backlog).
    reconcile_queued_grace_seconds: float = Field(default=300.0, ge=0)
    # A document FAILED for a transient reason is re-sent by the reconciler, once its
    # dependencies answer, after 1, 2, 4, 8 and 16 times this delay; then it stays FAILED.
    reconcile_transient_retries: int = Field(default=5, ge=0)
    reconcile_transient_backoff_seconds: float = Field(default=60.0, ge=0)
    # The server's background health check of Postgres, the broker and S3.
    health_check_interval_seconds: float = Field(default=2.0, gt=0)
    health_check_timeout_seconds: float = Field(default=2.0, gt=0)
    link_timeout_seconds: float = Field(default=5.0, gt=0)
    shutdown_grace_seconds: float = Field(default=5.0, ge=0)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    # json or text; unset means text on a terminal and JSON anywhere else.
    log_format: Literal["json", "text"] | None = None
    # A worker serves its pool's metrics here (Prometheus text format); unset serves none.
    worker_metrics_port: int | None = Field(default=None, ge=1, le=65535)
    worker_metrics_host: str = "127.0.0.1"

    @field_validator("chunk_overlap_chars")
    @classmethod
    def overlap_within_chunk(cls, value: int, info: ValidationInfo) -> int:
        # The chunker refuses an overlap as long as a chunk: every document would fail.
        chunk_chars = info.data.get("chunk_chars")
        if chunk_chars is not None and value >= chunk_chars:
            raise ValueError(f"must be less than FOOTNOTE_CHUNK_CHARS ({chunk_chars})")
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def upper_log_level(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("log_format", mode="before")
    @classmethod
    def lower_log_format(cls, value: object) -> object:
        # JSON and json mean the same; an empty value means "choose for me".
        if isinstance(value, str):
            return value.strip().lower() or None
        return value


def _cgroup_cpu_limit() -> int | None:
    # A container's CPU limit: cgroup v2's cpu.max ("max 100000" when unlimited), else v1's.
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        try:
            quota = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text().strip()
            period = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    try:
        if quota == "max" or int(quota) <= 0:
            return None
        return max(1, math.ceil(int(quota) / int(period)))
    except (ValueError, ZeroDivisionError):
        return None


def available_cpus() -> int:
    """CPUs this process may use: its affinity, capped by a container's cgroup CPU limit."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()
    return max(1, min(cpus, limit) if limit else cpus)


def pool_embedding_threads(concurrency: int, cpus: int | None = None) -> int:
    """Embedding threads for each of a worker's concurrency processes sharing cpus CPUs."""
    return max(1, (cpus or available_cpus()) // max(1, concurrency))


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
