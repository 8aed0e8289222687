"""What a worker process needs, built lazily once per process (after the pool forks)."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from functools import cached_property

from services.config import Settings, get_settings
from services.db.session import Database, make_engine
from services.retrieval.embeddings import Embedder, create_embedder
from services.storage import Storage


@dataclass
class Resources:
    settings: Settings

    @cached_property
    def db(self) -> Database:
        return Database(make_engine(self.settings.database_url or "", pool_size=2))

    @cached_property
    def storage(self) -> Storage:
        s = self.settings
        return Storage(
            s.s3_endpoint or "",
            s.s3_access_key or "",
            s.s3_secret_key or "",
            s.s3_bucket,
            region=s.s3_region,
        )

    @cached_property
    def embedder(self) -> Embedder:
        s = self.settings
        return create_embedder(
            base_url=s.embeddings_base_url,
            model=s.embeddings_model,
            api_key=s.embeddings_api_key,
            dim=s.embeddings_dim,
            threads=s.embedding_threads,
        )


_lock = threading.Lock()
_resources: tuple[int, Resources] | None = None


def resources() -> Resources:
    """This process's resources; a forked child builds its own instead of sharing sockets."""
    global _resources
    with _lock:
        if _resources is None or _resources[0] != os.getpid():
            _resources = (os.getpid(), Resources(get_settings()))
        return _resources[1]
