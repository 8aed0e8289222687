"""The server raises its open-file limit, so the upstream pool can hold a thousand answers."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# In a fresh interpreter: the limit is the process's, and the test's own must not change.
PROBE = """
import json, resource, sys
NOFILE = resource.RLIMIT_NOFILE
resource.setrlimit(NOFILE, (int(sys.argv[1]), resource.getrlimit(NOFILE)[1]))
from services.llm.openai_compat import default_max_connections
before = default_max_connections()
from services.server import raise_open_file_limit
raise_open_file_limit()
print(json.dumps([before, resource.getrlimit(NOFILE)[0], default_max_connections()]))
"""


def probe(soft: int) -> list[int]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(soft)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def test_a_low_soft_limit_is_raised_to_the_hard_one() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or hard < 2400:
        pytest.skip(f"a hard open-file limit of {hard} leaves nothing to show")
    before, soft_after, after = probe(1024)
    assert before == (1024 - 256) // 2  # 384 answers at once: too few for 1,000 streams
    assert soft_after == hard
    assert after == min(4096, (hard - 256) // 2) >= 1000


def test_a_limit_already_at_its_hard_value_is_left_alone() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard open-file limit")
    assert probe(hard)[1] == hard
