"""A pool process killed mid-ingest: Celery redelivers its task, which takes the document over.

Expected outcome (slow, `make faults`): with a lease of 10 minutes, killing the pool process
that holds the document (SIGKILL; the worker's main process survives and requeues the task)
leads to READY without waiting for the lease, with no duplicate chunks, and the redelivered
attempt logs that it took the document over.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest
from sqlalchemy import func, select

from services.db.models import Chunk
from services.documents.ingest import Holder
from tests.conftest import kill_group, start_worker, wait_worker_ready, worker_env
from tests.support import stored_document
from tests.workers.test_failures import (
    LONG_LEASE_SECONDS,
    big_handbook,
    document,
    send_ingest,
    wait_for,
)


@pytest.mark.faults
def test_a_killed_pool_process_is_taken_over_by_its_redelivered_task(
    db, storage, settings, tenant, private_broker, tmp_path
):
    env = worker_env(
        settings,
        FOOTNOTE_BROKER_URL=private_broker,
        FOOTNOTE_INGEST_LEASE_SECONDS=str(LONG_LEASE_SECONDS),
    )
    log = tmp_path / "worker.log"
    worker = start_worker(env, log)
    try:
        wait_worker_ready(private_broker)
        doc_id = stored_document(db, storage, tenant, big_handbook(), "runbook.md")
        send_ingest(private_broker, doc_id)
        holding = wait_for(
            lambda: (d := document(db, doc_id)).state == "PROCESSING" and d.lease_holder and d,
            60,
            "PROCESSING",
        )
        holder = Holder.decode(holding.lease_holder)
        assert holder is not None and holder.pid != worker.pid
        time.sleep(0.5)
        os.kill(holder.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        ready = wait_for(
            lambda: (d := document(db, doc_id)).state in ("READY", "FAILED") and d,
            LONG_LEASE_SECONDS / 4,
            "READY well before the lease runs out",
        )
        print(f"READY {time.monotonic() - killed_at:.1f}s after the kill")
    finally:
        kill_group(worker)
    assert ready.state == "READY", ready.error
    assert "taking over" in log.read_text()
    count, distinct = db.transact(
        lambda s: s.execute(
            select(func.count(), func.count(func.distinct(Chunk.chunk_index))).where(
                Chunk.document_id == uuid.UUID(doc_id)
            )
        ).one()
    )
    assert count == distinct == ready.chunk_count > 0
