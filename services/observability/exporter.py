"""The worker's metrics endpoint: its pool processes' series, summed in its main process.

Celery runs tasks in forked pool processes, each with its own memory, so the series in
`worker_metrics` use prometheus-client's multiprocess mode: every process writes its samples
to files in PROMETHEUS_MULTIPROC_DIR, and the main process adds them up at scrape time.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"


def prepare_multiprocess_dir(port: int | None) -> None:
    """Points prometheus-client at a directory for pool processes' samples.

    Must run before prometheus_client is first imported: it picks its storage then. An
    operator's PROMETHEUS_MULTIPROC_DIR is kept; otherwise one per worker is chosen.
    """
    if port is None or os.environ.get(MULTIPROC_DIR):
        return
    os.environ[MULTIPROC_DIR] = str(
        Path(tempfile.gettempdir()) / f"footnote-worker-metrics-{os.getpid()}"
    )


def start_worker_exporter(host: str, port: int) -> int:
    """Serves /metrics for the whole pool on host:port; returns the bound port.

    Call in the worker's main process before the pool starts: files of an earlier run are
    removed, as prometheus-client requires.
    """
    directory = os.environ.get(MULTIPROC_DIR)
    if not directory:
        raise RuntimeError(f"{MULTIPROC_DIR} must be set before prometheus_client is imported")
    path = Path(directory)
    if path.is_dir():
        for stale in path.glob("*.db"):
            stale.unlink(missing_ok=True)
    path.mkdir(parents=True, exist_ok=True)

    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(path))
    server, _thread = start_http_server(port, addr=host, registry=registry)
    bound = server.server_address[1]
    log.info(
        "serving worker metrics on http://%s:%d/metrics",
        host,
        bound,
        extra={"event": "metrics_exporter", "port": bound},
    )
    return int(bound)


def process_exited(pid: int) -> None:
    """Drops a pool process's live gauges (counters and histograms keep their totals)."""
    if os.environ.get(MULTIPROC_DIR):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


def remove_multiprocess_dir() -> None:
    directory = os.environ.get(MULTIPROC_DIR, "")
    if Path(directory).name.startswith("footnote-worker-metrics-"):
        shutil.rmtree(directory, ignore_errors=True)
