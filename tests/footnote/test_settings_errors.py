"""A bad FOOTNOTE_* value stops a command with one line per variable, not a traceback."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from footnote.cli.main import app


@pytest.mark.parametrize("command", [["serve"], ["worker"], ["dev", "--state-dir", "unused"]])
def test_a_bad_setting_names_its_variable_and_exits_2(command) -> None:
    env = {"FOOTNOTE_HNSW_EF_SEARCH": "5000", "FOOTNOTE_GRPC_PORT": "not-a-port-s3cret"}
    # Given here so that the runner restores it: `worker` would set it for the whole process.
    env["FOOTNOTE_EMBEDDING_THREADS"] = "0"
    result = CliRunner().invoke(app, command, env=env)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert "FOOTNOTE_HNSW_EF_SEARCH: Input should be less than or equal to 1000" in lines
    assert any(line.startswith("FOOTNOTE_GRPC_PORT: ") for line in lines)
    assert "s3cret" not in result.output  # values may be secrets: never echoed
    assert "Traceback" not in result.output and len(lines) == 2
