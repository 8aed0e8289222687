"""Ingestion survives a worker killed mid-task and an object store that stops answering.

Each test runs its own worker on its own broker, so the session's worker cannot take the
task first. The document state lives in SQL, so recovery goes through the lease holder and
the reconciler, exactly as in production: a reconciler on this host (the new worker's, or the
session worker's) sees that the killed holder's process is gone and re-sends the document.
"""

from __future__ import annotations

import signal
import socket
import time
import uuid

from sqlalchemy import func, select

from services.config import Settings
from services.db.models import Chunk
from services.db.models import Document as DocumentRow
from services.tasks import TaskClient, create_celery
from tests.conftest import kill_group, start_worker, wait_worker_ready, worker_env
from tests.support import stored_document


def send_ingest(broker_url: str, document_id: str) -> None:
    tasks = TaskClient(create_celery(Settings(_env_file=None, broker_url=broker_url)))
    try:
        tasks.ingest(document_id)
    finally:
        tasks.close()


def document(db, doc_id: str) -> DocumentRow:
    return db.transact(lambda s: s.get(DocumentRow, uuid.UUID(doc_id)))


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def big_handbook() -> bytes:
    sections = []
    for n in range(600):
        sections.append(
            f"## Procedure {n}\n\nStep {n} of the runbook: check the queue depth, drain node {n}, "
            f"and confirm that replica {n % 7} has caught up before you continue.\n"
        )
    return ("# Runbook\n\n" + "\n".join(sections)).encode()


# Far longer than the test waits: a recovery that waited for the lease would time out.
LONG_LEASE_SECONDS = 600


def test_sigkilled_worker_mid_ingest_is_taken_over_without_waiting_for_the_lease(
    db, storage, settings, tenant, private_broker, tmp_path
):
    env = worker_env(
        settings,
        FOOTNOTE_BROKER_URL=private_broker,
        FOOTNOTE_INGEST_LEASE_SECONDS=str(LONG_LEASE_SECONDS),
    )
    first = start_worker(env, tmp_path / "first.log")
    try:
        wait_worker_ready(private_broker)
        # Stored only now, so that no other reconciler sees it waiting before this worker does.
        doc_id = stored_document(db, storage, tenant, big_handbook(), "runbook.md")
        send_ingest(private_broker, doc_id)
        wait_for(lambda: document(db, doc_id).state == "PROCESSING", 60, "PROCESSING")
        time.sleep(0.5)  # let it get into parsing and embedding
    finally:
        kill_group(first, signal.SIGKILL)
    killed = document(db, doc_id)
    assert killed.lease_holder, "the lease names its holder"
    assert killed.attempts >= 1

    second = start_worker(env, tmp_path / "second.log")
    try:
        wait_worker_ready(private_broker)
        began = time.monotonic()
        ready = wait_for(
            lambda: (d := document(db, doc_id)).state in ("READY", "FAILED") and d,
            LONG_LEASE_SECONDS / 4,
            "READY well before the lease runs out",
        )
        print(f"recovered {time.monotonic() - began:.1f}s after a live worker was ready")
    finally:
        kill_group(second)
    assert ready.state == "READY", ready.error
    assert ready.attempts >= 2
    assert ready.lease_holder is None and ready.failure_kind is None
    count, distinct = db.transact(
        lambda s: s.execute(
            select(func.count(), func.count(func.distinct(Chunk.chunk_index))).where(
                Chunk.document_id == uuid.UUID(doc_id)
            )
        ).one()
    )
    assert count == distinct == ready.chunk_count > 0


def dead_endpoint() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_unreachable_storage_retries_then_fails_and_keeps_row_and_object(
    db, storage, settings, tenant, private_broker, tmp_path
):
    env = worker_env(
        settings, FOOTNOTE_BROKER_URL=private_broker, FOOTNOTE_S3_ENDPOINT=dead_endpoint()
    )
    worker = start_worker(env, tmp_path / "worker.log")
    try:
        wait_worker_ready(private_broker)
        doc_id = stored_document(db, storage, tenant, b"# Notes\n\nKept safe.\n", "notes.md")
        key = document(db, doc_id).object_key
        send_ingest(private_broker, doc_id)
        failed = wait_for(
            lambda: (d := document(db, doc_id)).state in ("READY", "FAILED") and d, 120, "FAILED"
        )
    finally:
        kill_group(worker)
    assert failed.state == "FAILED"
    assert failed.attempts == settings.ingest_max_retries + 1
    assert failed.failure_kind == "TRANSIENT"
    assert "temporary failure" in failed.error and "Traceback" not in failed.error
    assert storage.exists(key)
    log = (tmp_path / "worker.log").read_text()
    assert log.count("will retry") >= settings.ingest_max_retries
