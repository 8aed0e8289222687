"""`footnote demo`, which `make run` runs: the whole path, then nothing left running."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys

import psutil
import pytest


def started_in(state: str, process: psutil.Process) -> bool:
    """Whether a server process, or the server it belongs to, runs on this state dir.

    Other stacks on the same machine start servers and backends too; only this one's count.
    """
    try:
        family = [process, *process.parents()]
        return any(state in " ".join(p.cmdline()) or state in p.cwd() for p in family)
    except psutil.Error:
        return False


# The demo's own limit, below the test's: a demo killed by the test's timeout would leave the
# stack it started (Postgres, Redis, SeaweedFS, a worker) running.
DEMO_SECONDS = 300


@pytest.mark.timeout(DEMO_SECONDS + 120)
def test_demo_streams_a_cited_answer_and_stops_everything(tmp_path):
    state = str(tmp_path / "s")
    before = {p.pid for p in psutil.process_iter()}
    demo = subprocess.Popen(
        [sys.executable, "-m", "footnote.cli", "demo", "--state-dir", state],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = demo.communicate(timeout=DEMO_SECONDS)
    except subprocess.TimeoutExpired:
        # Ctrl-C, as a terminal sends it to the demo and all it started: the stack stops.
        os.killpg(demo.pid, signal.SIGINT)
        try:
            out, err = demo.communicate(timeout=90)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(demo.pid, signal.SIGKILL)  # whatever did not stop
        pytest.fail(f"footnote demo took over {DEMO_SECONDS} s:\n{out}{err}")
    assert demo.returncode == 0, out + err
    assert out.count(": READY,") == 3, out
    answer = out.split("A: ", 1)[1].split("\n\nSources:", 1)[0]
    assert "25 EUR" in answer and "1,000 EUR" in answer
    cited = re.findall(r"^\[(\d+)\] (\S+) \((.*)\)$", out, re.MULTILINE)
    assert {name for _, name, _ in cited} == {"travel-policy.md", "expenses.html"}
    assert all("lines" in where for _, _, where in cited)
    assert all(f"[{n}]" in answer for n, _, _ in cited)
    assert out.count("X-Amz-Signature=") == len(cited)  # a PUBLIC link per cited source
    leftovers = [
        p
        for p in psutil.process_iter(["name"])
        if p.pid not in before
        and p.info["name"] in ("postgres", "redis-server", "weed")
        and started_in(state, p)
    ]
    assert leftovers == []
