"""The real llama-server for the llm tier, started once per session and stopped after."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devstack import local_llm as local
from devstack.local_llm import LocalLLM, LocalLLMError

STARTUP_SECONDS = 180.0


@pytest.fixture(scope="session")
def model_home(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The assembled model (491 MB) is kept in pytest's cache, so later runs reuse it.
    cache = getattr(request.config, "cache", None)
    if cache is not None:
        return Path(cache.mkdir("footnote-llm"))
    return tmp_path_factory.mktemp("footnote-llm")


@pytest.fixture(scope="session")
def llama_server(model_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalLLM]:
    llm = local.prepare_local_llm(model_home)
    log_path = tmp_path_factory.mktemp("llama") / "llama-server.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            llm.args,
            env=llm.env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group, so the finalizer can end all of it
        )
    try:
        try:
            local.wait_ready(llm.base_url, STARTUP_SECONDS, proc=proc)
        except LocalLLMError as err:
            tail = log_path.read_text(errors="replace")[-3000:]
            pytest.fail(f"{err}\n--- llama-server log ---\n{tail}")
        yield llm
    finally:
        stop_group(proc)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue


async def busy_slots(base_url: str) -> int:
    async with httpx.AsyncClient(timeout=5) as client:
        response = await client.get(f"{base_url}/slots")
        response.raise_for_status()
        return sum(1 for slot in response.json() if slot["is_processing"])
