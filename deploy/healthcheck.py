#!/usr/bin/env python3
"""Container health check for every Footnote role; exit status 0 means healthy.

    footnote-healthcheck                 the check that fits the container's command (PID 1)
    footnote-healthcheck grpc [--target HOST:PORT] [--service NAME]
    footnote-healthcheck worker [--app MODULE:ATTR]

`grpc` asks grpc.health.v1 on the local server; the server answers NOT_SERVING while Postgres,
Redis or S3 cannot be reached. `worker` pings this host's Celery worker through the broker.
The image installs this file as /usr/local/bin/footnote-healthcheck (deploy/Dockerfile);
docker-compose.yml and the image's HEALTHCHECK run it. Kubernetes uses its own probes.
"""

from __future__ import annotations

import argparse
import importlib
import os
import socket
import sys
from pathlib import Path

WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}


def default_target() -> str:
    host = os.environ.get("FOOTNOTE_GRPC_HOST", "")
    port = os.environ.get("FOOTNOTE_GRPC_PORT", "50051")
    if host in WILDCARD_HOSTS:
        host = "127.0.0.1"
    return f"{host}:{port}"


def check_grpc(target: str, service: str, timeout: float) -> tuple[bool, str]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError as err:
            return False, f"{target}: {err.code().name}: {err.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{target}: {status}"


def check_worker(app_path: str, timeout: float) -> tuple[bool, str]:
    module_name, _, attr = app_path.partition(":")
    app = getattr(importlib.import_module(module_name), attr or "app")
    # `footnote worker` keeps Celery's default node name, celery@<hostname>.
    node = f"celery@{socket.gethostname()}"
    try:
        replies = app.control.ping(destination=[node], timeout=timeout)
    except Exception as err:  # the broker is unreachable: report it rather than a traceback
        return False, f"{node}: {type(err).__name__}: {err}"
    for reply in replies:
        if reply.get(node, {}).get("ok") == "pong":
            return True, f"{node}: pong"
    return False, f"{node}: no reply within {timeout:g}s"


def role_of_pid1(cmdline: Path = Path("/proc/1/cmdline")) -> str | None:
    """'grpc' for `footnote serve`, 'worker' for `footnote worker`, None for anything else."""
    try:
        args = cmdline.read_bytes().split(b"\0")
    except OSError:
        return None
    if b"serve" in args:
        return "grpc"
    if b"worker" in args:
        return "worker"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="footnote-healthcheck", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for a reply")
    sub = parser.add_subparsers(dest="check")
    grpc_parser = sub.add_parser("grpc", help="grpc.health.v1 Check on the local server")
    grpc_parser.add_argument("--target", default=None, help="HOST:PORT (default: from FOOTNOTE_*)")
    grpc_parser.add_argument("--service", default="", help='service name ("" = the whole server)')
    worker_parser = sub.add_parser("worker", help="ping this host's Celery worker")
    worker_parser.add_argument("--app", default="workers.app:app", help="the Celery app")
    args = parser.parse_args(argv)

    check = args.check or role_of_pid1()
    if check == "grpc":
        ok, detail = check_grpc(
            getattr(args, "target", None) or default_target(),
            getattr(args, "service", ""),
            args.timeout,
        )
    elif check == "worker":
        ok, detail = check_worker(getattr(args, "app", "workers.app:app"), args.timeout)
    else:
        # A one-shot command (migrate, keys create, ...): nothing long-running to check.
        ok, detail = True, "no long-running role to check"
    print(f"footnote-healthcheck: {'healthy' if ok else 'unhealthy'}: {detail}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
