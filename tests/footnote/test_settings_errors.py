"""A bad FOOTNOTE_* value stops a command with one line per variable, not a traceback."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from footnote.cli.main import app
from services.config import Settings


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


# Values that used to be accepted and then failed late, spun, or gave every request the same
# error: a reconciler or health loop with no pause, a lease that is always expired, an overlap
# that the chunker refuses for every document, a log level logging cannot set.
@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("FOOTNOTE_RECONCILE_INTERVAL_SECONDS", "0", "Input should be greater than 0"),
        ("FOOTNOTE_HEALTH_CHECK_INTERVAL_SECONDS", "0", "Input should be greater than 0"),
        ("FOOTNOTE_INGEST_LEASE_SECONDS", "-1", "Input should be greater than 0"),
        ("FOOTNOTE_LLM_TIMEOUT_SECONDS", "0", "Input should be greater than 0"),
        ("FOOTNOTE_LINK_TIMEOUT_SECONDS", "0", "Input should be greater than 0"),
        ("FOOTNOTE_MAX_UPLOAD_BYTES", "0", "Input should be greater than or equal to 1"),
        ("FOOTNOTE_MAX_CHUNKS_PER_DOCUMENT", "0", "Input should be greater than or equal to 1"),
        ("FOOTNOTE_SHUTDOWN_GRACE_SECONDS", "-5", "Input should be greater than or equal to 0"),
        ("FOOTNOTE_HTTP_PORT", "70000", "Input should be less than or equal to 65535"),
        ("FOOTNOTE_CHUNK_OVERLAP_CHARS", "1200", "must be less than FOOTNOTE_CHUNK_CHARS (1200)"),
        ("FOOTNOTE_LOG_LEVEL", "loud", "Input should be 'DEBUG', 'INFO', 'WARNING'"),
    ],
)
def test_a_value_the_service_cannot_run_with_is_refused_at_start(variable, value, message) -> None:
    result = CliRunner().invoke(app, ["serve"], env={variable: value})
    assert result.exit_code == 2, result.output
    [line] = result.output.strip().splitlines()
    assert line.startswith(f"{variable}: ") and message in line, line


def test_the_overlap_is_checked_against_the_chunk_size_given() -> None:
    assert Settings(_env_file=None, chunk_chars=500, chunk_overlap_chars=499).chunk_chars == 500
    env = {"FOOTNOTE_CHUNK_CHARS": "500", "FOOTNOTE_CHUNK_OVERLAP_CHARS": "500"}
    result = CliRunner().invoke(app, ["serve"], env=env)
    assert result.exit_code == 2
    message = "must be less than FOOTNOTE_CHUNK_CHARS (500)"
    assert f"FOOTNOTE_CHUNK_OVERLAP_CHARS: Value error, {message}" in result.output


def test_a_log_level_in_any_case_is_accepted() -> None:
    assert Settings(_env_file=None, log_level=" warning ").log_level == "WARNING"
