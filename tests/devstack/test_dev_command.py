"""`footnote dev` as a user runs it: ready lines, a working key, clean stop, data kept."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import grpc
import psutil
import pytest

from devstack.processes import is_alive, terminate
from footnote.v1 import assistants_service_pb2 as pb
from footnote.v1 import assistants_service_pb2_grpc as pb_grpc
from tests.support import bearer

READY = re.compile(r"^footnote: ready at (\S+:\d+)$")
KEY = re.compile(r"^footnote: api key (\S+)$")


@pytest.fixture
def dev_state() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fnd", dir="/tmp"))
    yield path
    # A failed assertion must not leave a whole stack running: stop what is still up.
    for proc in DevProcess.started:
        terminate(proc)
    DevProcess.started.clear()
    shutil.rmtree(path, ignore_errors=True)


class DevProcess:
    started: ClassVar[list[subprocess.Popen[str]]] = []

    def __init__(self, state_dir: Path, env: dict[str, str] | None = None) -> None:
        clean_env = {k: v for k, v in os.environ.items() if not k.startswith("FOOTNOTE_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "footnote.cli", "dev", "--state-dir", str(state_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**clean_env, **(env or {})},
            text=True,
        )
        DevProcess.started.append(self.proc)
        self.target, self.key = self.wait_ready()

    def wait_ready(self, timeout: float = 120.0) -> tuple[str, str]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        target = key = None
        for line in self.proc.stdout:
            if m := READY.match(line.strip()):
                target = m.group(1)
            elif m := KEY.match(line.strip()):
                key = m.group(1)
            if target and key:
                return target, key
            if time.monotonic() > deadline:
                break
        self.proc.kill()
        raise AssertionError(f"footnote dev did not become ready (exit {self.proc.poll()})")

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def terminate(self) -> list[psutil.Process]:
        """Sends SIGTERM and returns the processes that were its descendants."""
        family = self.descendants()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        return family


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    _gone, still = psutil.wait_procs(procs, timeout=10)
    return [p for p in still if is_alive(p)]


def names_of(procs: list[psutil.Process]) -> set[str]:
    """The names of the processes still running; a short-lived child (a postgres backend,
    say) may exit while we look."""
    names = set()
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            names.add(proc.name())
    return names


def test_dev_starts_serves_stops_and_keeps_data(dev_state):
    first = DevProcess(dev_state)
    children = first.descendants()
    names = names_of(children)
    assert {"postgres", "redis-server", "weed"} <= names, names
    with grpc.insecure_channel(first.target) as channel:
        stub = pb_grpc.AssistantsServiceStub(channel)
        created = stub.CreateAssistant(
            pb.CreateAssistantRequest(
                assistant=pb.Assistant(display_name="kept", settings=pb.AssistantSettings(top_k=17))
            ),
            metadata=bearer(first.key),
        )
    # The CLI finds the running server through the state dir; the dev worker ingests.
    handbook = Path(__file__).parent.parent / "fixtures" / "documents" / "handbook.md"
    uploaded = subprocess.run(
        [
            sys.executable,
            "-m",
            "footnote.cli",
            "upload",
            str(handbook),
            "--assistant",
            created.id,
            "--state-dir",
            str(dev_state),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert uploaded.returncode == 0, uploaded.stdout + uploaded.stderr
    assert "READY" in uploaded.stdout and "handbook.md" in uploaded.stdout
    assert "uploading" in uploaded.stderr  # the progress bar
    family = first.terminate()
    assert first.proc.returncode == 0
    assert alive(family) == [], "processes outlived footnote dev"

    second = DevProcess(dev_state)
    try:
        assert second.key == first.key
        with grpc.insecure_channel(second.target) as channel:
            stub = pb_grpc.AssistantsServiceStub(channel)
            again = stub.GetAssistant(
                pb.GetAssistantRequest(id=created.id), metadata=bearer(second.key)
            )
        assert again == created
    finally:
        family = second.terminate()
    assert alive(family) == []


def test_dev_uses_configured_key_and_services(dev_state, settings):
    dev = DevProcess(
        dev_state,
        env={
            "FOOTNOTE_DEV_API_KEY": "fn_configured-dev-key-123",
            "FOOTNOTE_BROKER_URL": settings.broker_url,
        },
    )
    try:
        assert dev.key == "fn_configured-dev-key-123"
        names = names_of(dev.descendants())
        assert "redis-server" not in names and "postgres" in names
        with grpc.insecure_channel(dev.target) as channel:
            stub = pb_grpc.AssistantsServiceStub(channel)
            page = stub.ListAssistants(pb.ListAssistantsRequest(), metadata=bearer(dev.key))
        assert list(page.assistants) == []
    finally:
        dev.terminate()
