"""Runs the real `footnote` commands against the session's real server.

The server runs on the test event loop, so each command runs in a worker thread (CliRunner)
or in a child process, never blocking the loop it needs.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from footnote.cli import app


@dataclass
class Ran:
    exit_code: int
    stdout: str
    stderr: str
    stdout_bytes: bytes
    exception: BaseException | None

    def json(self) -> Any:
        assert self.exit_code == 0, self.stderr
        return json.loads(self.stdout)

    def tsv(self) -> list[list[str]]:
        """The piped table: a header row, then one row per line."""
        assert self.exit_code == 0, self.stderr
        return [line.split("\t") for line in self.stdout.splitlines()]

    def record(self) -> dict[str, str]:
        rows = self.tsv()
        assert rows[0] == ["field", "value"], rows[0]
        return {field: value for field, value in rows[1:]}


def assert_clean_failure(ran: Ran, code: int = 1) -> None:
    """Failed the way a user should see it: the exit code, a footnote: line, no traceback."""
    assert ran.exit_code == code, (ran.exit_code, ran.stdout, ran.stderr)
    assert "Traceback" not in ran.stderr + ran.stdout
    assert ran.exception is None or isinstance(ran.exception, SystemExit), ran.exception


Cli = Callable[..., Awaitable[Ran]]


@pytest.fixture
def cli(grpc_target: str, api_key: str) -> Cli:
    """Runs `footnote ARGS... --target T --api-key K` in-process; key=None leaves both off."""

    def invoke(args: list[str], key: str | None, env: dict[str, str] | None) -> Ran:
        full = [*args]
        if key is not None:
            full += ["--target", grpc_target, "--api-key", key]
        result = CliRunner().invoke(app, full, env=env)
        return Ran(
            result.exit_code,
            result.stdout,
            result.stderr,
            result.stdout_bytes,
            None if isinstance(result.exception, SystemExit) else result.exception,
        )

    async def run(*args: str, key: str | None = api_key, env: dict[str, str] | None = None) -> Ran:
        return await asyncio.to_thread(invoke, list(args), key, env)

    return run


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOOTNOTE_")}
    return {**env, **extra}


async def run_process(args: list[str], cwd: Path, env: dict[str, str]) -> Ran:
    """`python -m footnote.cli ARGS...` as a user runs it, piped."""
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "footnote.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        timeout=120,
    )
    return Ran(
        done.returncode,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
        done.stdout,
        None,
    )


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_on_terminal(args: list[str], columns: int) -> str:
    """Runs the command with stdout and stderr on a pseudo-terminal of the given width."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = clean_env(TERM="xterm-256color")
    env.pop("COLUMNS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "footnote.cli", *args],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=env,
        close_fds=True,
    )
    os.close(follower)
    out = bytearray()
    while True:
        try:
            piece = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not piece:
            break
        out += piece
    os.close(leader)
    assert proc.wait(60) == 0, out.decode(errors="replace")
    return ANSI.sub("", out.decode(errors="replace"))
