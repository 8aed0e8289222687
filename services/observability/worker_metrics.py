"""Prometheus series recorded in the worker processes: tasks and the stages of ingestion.

With a prefork pool the tasks run in child processes, so these series use prometheus-client's
multiprocess mode; `services.observability.exporter` serves the pool's sum from the worker's
main process. Every series here has labels, so a process that never records one writes none.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import Counter, Histogram

from services.observability.tracing import tracer

STAGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
# Celery's task states, as a small fixed set of label values.
TASK_OUTCOMES = {
    "SUCCESS": "success",
    "FAILURE": "failure",
    "RETRY": "retry",
    "IGNORED": "ignored",
    "REJECTED": "rejected",
    "REVOKED": "revoked",
}

TASK_DURATION = Histogram(
    "footnote_task_duration_seconds",
    "Celery task run time in a worker, by task name and outcome.",
    ["task", "outcome"],
    buckets=STAGE_BUCKETS,
)
INGEST_STAGE_DURATION = Histogram(
    "footnote_ingest_stage_duration_seconds",
    "Time spent in each stage of ingesting one document, by stage and outcome (ok, error).",
    ["stage", "outcome"],
    buckets=STAGE_BUCKETS,
)
INGEST_DOCUMENTS = Counter(
    "footnote_ingest_documents",
    "Ingestion runs by the state they left the document in (ready, failed, skipped).",
    ["outcome"],
)


def task_outcome(state: str | None) -> str:
    return TASK_OUTCOMES.get(state or "", "other")


@contextmanager
def ingest_stage(name: str) -> Iterator[None]:
    """Times one stage of ingestion and traces it as a span `ingest.<name>`."""
    began = time.perf_counter()
    outcome = "error"
    with tracer().start_as_current_span(f"ingest.{name}"):
        try:
            yield
            outcome = "ok"
        finally:
            INGEST_STAGE_DURATION.labels(name, outcome).observe(time.perf_counter() - began)
