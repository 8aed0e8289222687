"""The scrape-time collectors against real Redis and Postgres, and what a failing one does."""

from __future__ import annotations

from collections import Counter

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from services.config import Settings
from services.db.session import Database, make_engine
from services.observability.collectors import (
    DocumentStateCollector,
    QueueDepthCollector,
    ScrapeRegistry,
    exposition,
)
from services.ports import free_port
from services.tasks import TaskClient, create_celery
from tests.support import stored_document


def scrape(registry: ScrapeRegistry) -> tuple[str, dict]:
    body, _ = exposition(registry, None)
    text = body.decode()
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return text, values


def test_queue_depth_counts_the_messages_waiting_in_each_queue(private_broker):
    tasks = TaskClient(create_celery(Settings(_env_file=None, broker_url=private_broker)))
    try:
        for n in range(3):
            tasks.ingest(f"doc-{n}")
        tasks.celery.send_task("links.presign", args=[["doc-0"], 60])
    finally:
        tasks.close()
    collector = QueueDepthCollector(private_broker)
    try:
        _, values = scrape(ScrapeRegistry(collector, base=CollectorRegistry()))
    finally:
        collector.close()
    assert values[("footnote_queue_messages", (("queue", "ingest"),))] == 3
    assert values[("footnote_queue_messages", (("queue", "links"),))] == 1
    success = ("footnote_scrape_collector_success", (("collector", "queue_depth"),))
    assert values[success] == 1


def test_documents_are_counted_by_state(settings, db, storage, tenant):
    collector = DocumentStateCollector(db)
    registry = ScrapeRegistry(collector, base=CollectorRegistry())
    try:
        _, before = scrape(registry)
        stored_document(db, storage, tenant, b"# Notes\n\nSome text.\n", "notes.md")
        _, after = scrape(registry)
    finally:
        collector.close()
    pending = ("footnote_documents", (("state", "PENDING"),))
    assert after[pending] == before[pending] + 1
    assert {labels[0][1] for name, labels in after if name == "footnote_documents"} == {
        "PENDING",
        "PROCESSING",
        "READY",
        "FAILED",
    }


def test_a_source_that_is_down_leaves_the_rest_of_the_scrape_intact(settings):
    closed = free_port()
    queue = QueueDepthCollector(f"redis://127.0.0.1:{closed}/0")
    # A Postgres nobody listens on: the connection is refused, within the time limit.
    nowhere = Database(make_engine(f"postgresql://u:p@127.0.0.1:{free_port()}/x", pool_size=1))
    documents = DocumentStateCollector(nowhere)
    working = DocumentStateCollector(Database(make_engine(settings.database_url, pool_size=1)))
    working.name = "documents_working"
    try:
        text, values = scrape(ScrapeRegistry(queue, documents, working, base=CollectorRegistry()))
    finally:
        for c in (queue, documents, working):
            c.close()
        nowhere.dispose()
    success = {
        labels[0][1]: value
        for (name, labels), value in values.items()
        if name == "footnote_scrape_collector_success"
    }
    assert success == {"queue_depth": 0, "documents": 0, "documents_working": 1}
    assert "footnote_queue_messages" not in text
    assert values[("footnote_documents", (("state", "READY"),))] >= 0


def test_each_family_is_declared_once(private_broker, db):
    registry = ScrapeRegistry(QueueDepthCollector(private_broker), DocumentStateCollector(db))
    try:
        text, _ = scrape(registry)
    finally:
        registry.close()
    declared = Counter(line.split()[2] for line in text.splitlines() if line.startswith("# TYPE"))
    assert declared and max(declared.values()) == 1, declared


def test_a_broker_that_is_not_redis_has_no_queue_series():
    collector = QueueDepthCollector("amqp://guest@127.0.0.1//")
    text, _ = scrape(ScrapeRegistry(collector, base=CollectorRegistry()))
    assert "footnote_queue_messages" not in text
    assert 'footnote_scrape_collector_success{collector="queue_depth"} 1.0' in text
