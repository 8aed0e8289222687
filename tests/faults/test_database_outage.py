"""A stream cut by a database outage ends with UNAVAILABLE, never INTERNAL.

Expected outcome: WatchDocument streams a PENDING document from a Postgres of the test's own;
when that Postgres is killed, the stream ends with the status UNAVAILABLE (retry), and health
sees it as down.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from devstack.stack import EmbeddedStack
from footnote.v1 import documents_service_pb2 as dpb
from footnote.v1 import documents_service_pb2_grpc as dpb_grpc
from services import auth
from services.db import migrate
from services.db.session import Database, make_engine
from services.health import database_probe
from tests.faults.conftest import serve_on_thread
from tests.support import bearer, stored_document


@pytest.fixture
def own_postgres(settings) -> Iterator[tuple[EmbeddedStack, str]]:
    state = Path(tempfile.mkdtemp(prefix="fnp", dir="/tmp"))
    stack = EmbeddedStack(
        state,
        broker_url=settings.broker_url,
        s3_endpoint=settings.s3_endpoint,
        s3_access_key=settings.s3_access_key,
        s3_secret_key=settings.s3_secret_key,
        s3_bucket=settings.s3_bucket,
    )
    with stack:
        url = stack.endpoints.database_url
        migrate.upgrade(url)
        yield stack, url
    shutil.rmtree(state, ignore_errors=True)


def test_a_watch_cut_by_a_database_outage_ends_unavailable(settings, storage, own_postgres):
    stack, url = own_postgres
    db = Database(make_engine(url, pool_size=1))
    try:
        key = db.transact(lambda s: auth.create_key(s, "outage"))
        doc_id = stored_document(db, storage, "outage", b"# Waiting\n\nfor a worker\n", "w.md")
    finally:
        db.dispose()
    postgres = next(c for c in stack.children() if c.name == "postgres")
    serving = contextlib.contextmanager(serve_on_thread)
    with (
        serving(settings.model_copy(update={"database_url": url})) as target,
        grpc.insecure_channel(target) as channel,
    ):
        stream = dpb_grpc.DocumentsServiceStub(channel).WatchDocument(
            dpb.WatchDocumentRequest(id=doc_id), metadata=bearer(key), timeout=120
        )
        first = next(stream)
        assert first.state == dpb.DOCUMENT_STATE_PENDING
        os.kill(postgres.proc.pid, signal.SIGKILL)
        with pytest.raises(grpc.RpcError) as err:
            for _ in stream:
                pass
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
    # And the health check sees it: the probe of that database fails.
    with pytest.raises(Exception):  # noqa: B017 - any failure to connect counts
        database_probe(url, timeout=1)()
