"""The Celery app of the worker pools: Footnote's queues and settings, plus the task modules."""

from __future__ import annotations

from services.config import get_settings
from services.tasks import create_celery

app = create_celery(get_settings())
app.conf.include = ["workers.ingest", "workers.links"]
