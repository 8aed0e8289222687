"""Series read at scrape time: broker queue depths and documents by state, each bounded.

A collector that cannot answer in time yields no samples for its series and reports
`footnote_scrape_collector_success{collector=...} 0`, so one slow dependency never fails
the whole scrape. The success family is one for all collectors: a name may appear only once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import redis
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select, text

from services.db.models import Document as DocumentRow
from services.db.session import Database
from services.documents.domain import DocumentState
from services.tasks import QUEUES

log = logging.getLogger(__name__)

SCRAPE_TIMEOUT_SECONDS = 1.0
# kombu's Redis transport keeps one list per queue and priority step: "ingest", "ingest\x06\x163"...
PRIORITY_SEPARATOR = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)
DOCUMENT_STATES = tuple(state.value for state in DocumentState)


def success_family(results: Iterable[tuple[str, bool]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "footnote_scrape_collector_success",
        "1 if the collector answered within its time limit during this scrape, else 0.",
        labels=["collector"],
    )
    for collector, ok in results:
        family.add_metric([collector], 1.0 if ok else 0.0)
    return family


class ScrapeCollector(Protocol):
    name: str

    def scrape(self) -> list[Metric] | None:
        """This scrape's families, or None when the source did not answer in time."""

    def close(self) -> None: ...


def queue_keys(queue: str) -> list[str]:
    return [queue if step == 0 else f"{queue}{PRIORITY_SEPARATOR}{step}" for step in PRIORITY_STEPS]


class QueueDepthCollector:
    """Messages waiting in each Celery queue, read with LLEN from a Redis broker."""

    name = "queue_depth"

    def __init__(
        self, broker_url: str, queues: Iterable[str] = QUEUES, timeout: float = 0.5
    ) -> None:
        self.queues = tuple(queues)
        self.client: redis.Redis | None = None
        if broker_url.startswith(("redis://", "rediss://", "unix://")):
            self.client = redis.Redis.from_url(
                broker_url, socket_timeout=timeout, socket_connect_timeout=timeout
            )

    def scrape(self) -> list[Metric] | None:
        if self.client is None:
            return []  # another broker (RabbitMQ): its own exporter has queue depths
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for queue in self.queues:
                    for key in queue_keys(queue):
                        pipe.llen(key)
                lengths = pipe.execute()
        except redis.RedisError as err:
            log.warning("queue depth not collected: %s", type(err).__name__)
            return None
        family = GaugeMetricFamily(
            "footnote_queue_messages",
            "Messages waiting in the broker for a worker, by Celery queue.",
            labels=["queue"],
        )
        steps = len(PRIORITY_STEPS)
        for i, queue in enumerate(self.queues):
            family.add_metric([queue], float(sum(lengths[i * steps : (i + 1) * steps])))
        return [family]

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


class DocumentStateCollector:
    """Documents in each state (deleted ones left out), with one GROUP BY per scrape."""

    name = "documents"

    def __init__(self, db: Database, timeout: float = SCRAPE_TIMEOUT_SECONDS) -> None:
        self.db = db
        self.timeout = timeout
        # One thread: a query that hangs holds it, and later scrapes time out instead of
        # piling up connections.
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="metrics-documents")

    def count(self) -> dict[str, int]:
        def query(s) -> dict[str, int]:
            s.execute(text(f"SET LOCAL statement_timeout = {int(self.timeout * 1000)}"))
            rows = s.execute(
                select(DocumentRow.state, func.count())
                .where(DocumentRow.delete_time.is_(None))
                .group_by(DocumentRow.state)
            ).all()
            return {state: n for state, n in rows}

        return self.db.transact(query)

    def scrape(self) -> list[Metric] | None:
        try:
            counts = self.executor.submit(self.count).result(self.timeout)
        except Exception as err:  # a timeout (FutureTimeout) or the database failing
            log.warning("document states not collected: %s", type(err).__name__)
            return None
        family = GaugeMetricFamily(
            "footnote_documents",
            "Documents by state (PENDING, PROCESSING, READY, FAILED); deleted ones left out.",
            labels=["state"],
        )
        for state in DOCUMENT_STATES:
            family.add_metric([state], float(counts.get(state, 0)))
        return [family]

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


class ScrapeRegistry(Collector):
    """The process-wide series plus this server's scrape-time collectors, as one registry."""

    def __init__(self, *collectors: ScrapeCollector, base: CollectorRegistry = REGISTRY) -> None:
        self.base = base
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        yield from self.base.collect()
        results = []
        for collector in self.collectors:
            families = collector.scrape()
            results.append((collector.name, families is not None))
            yield from families or ()
        if results:
            yield success_family(results)

    def close(self) -> None:
        for collector in self.collectors:
            collector.close()


def exposition(registry: Collector, accept: str | None) -> tuple[bytes, str]:
    """The registry in the format the scraper asked for (OpenMetrics or Prometheus text)."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type  # type: ignore[arg-type]
