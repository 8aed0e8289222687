"""The log formats: one parseable JSON object per line, trace ids, and no secrets."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider
from pydantic import ValidationError

from services.config import Settings
from services.observability.logs import (
    JSON,
    TEXT,
    JsonLines,
    PlainText,
    Redactor,
    configure_logging,
    resolve_format,
)

KEY = "fn_" + "k" * 43


def record(msg: str, *args, level=logging.INFO, name="footnote.test", **extra) -> logging.LogRecord:
    rec = logging.LogRecord(name, level, __file__, 1, msg, args or None, None)
    rec.__dict__.update(extra)
    return rec


def test_a_json_line_has_the_fields_and_extra_keys():
    line = JsonLines(Redactor()).format(
        record("rpc %s %s", "footnote.v1.X/Y", "OK", event="rpc", tenant="acme", code="OK")
    )
    assert "\n" not in line
    data = json.loads(line)
    assert data["message"] == "rpc footnote.v1.X/Y OK"
    assert data["level"] == "INFO" and data["logger"] == "footnote.test"
    assert data["time"].endswith("+00:00")
    assert (data["event"], data["tenant"], data["code"]) == ("rpc", "acme", "OK")
    assert "trace_id" not in data  # no span is current


def test_a_json_line_carries_the_current_trace_id():
    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("work") as span:
        data = json.loads(JsonLines(Redactor()).format(record("inside")))
    ctx = span.get_span_context()
    assert data["trace_id"] == f"{ctx.trace_id:032x}"
    assert data["span_id"] == f"{ctx.span_id:016x}"


def test_an_exception_stays_on_one_json_line():
    try:
        raise ValueError("broken\nacross lines")
    except ValueError:
        rec = record("failed")
        rec.exc_info = sys.exc_info()
    line = JsonLines(Redactor()).format(rec)
    assert "\n" not in line
    assert "ValueError: broken" in json.loads(line)["exception"]


@pytest.mark.parametrize("formatter", [JsonLines, PlainText])
@pytest.mark.parametrize(
    ("message", "secret"),
    [
        (f"key {KEY} was used", KEY),
        ("header authorization: Bearer abc.def-ghi", "abc.def-ghi"),
        ("http://s3/b/o?X-Amz-Credential=AKIA%2F1&X-Amz-Signature=deadbeef99", "deadbeef99"),
        ("postgresql://app:hunter2secret@db:5432/footnote", "hunter2secret"),
        ("the upstream said s3cr3t-configured-value", "s3cr3t-configured-value"),
    ],
)
def test_secrets_never_reach_the_line(formatter, message, secret):
    line = formatter(Redactor(["s3cr3t-configured-value", "short"])).format(record(message))
    assert secret not in line
    assert "[REDACTED]" in line


def test_short_configured_values_are_not_treated_as_secrets():
    assert Redactor(["abc"])("abc def") == "abc def"


def test_celery_success_lines_leave_out_the_return_value():
    from celery.app.trace import LOG_SUCCESS

    url = "http://s3/doc?X-Amz-Signature=abc"
    context = {"id": "t1", "name": "links.presign", "return_value": repr(url), "runtime": 0.1}
    rec = record(LOG_SUCCESS, name="celery.app.trace")
    rec.args = context
    rec.data = context
    data = json.loads(JsonLines(Redactor()).format(rec))
    assert "X-Amz" not in json.dumps(data)
    assert "data" not in data
    assert data["message"].startswith("Task links.presign[t1] succeeded in 0.1s")


def test_the_format_follows_the_terminal_unless_set():
    leader, follower = os.openpty()
    try:
        with open(follower, "w", closefd=False) as tty:
            assert resolve_format(None, tty) == TEXT
            assert resolve_format(JSON, tty) == JSON
    finally:
        os.close(leader)
        os.close(follower)
    assert resolve_format(None, io.StringIO()) == JSON
    assert resolve_format(TEXT, io.StringIO()) == TEXT


def test_the_setting_takes_any_case_and_empty_means_unset():
    assert Settings(_env_file=None, log_format="JSON").log_format == JSON
    assert Settings(_env_file=None, log_format=" Text ").log_format == TEXT
    assert Settings(_env_file=None, log_format="").log_format is None


def test_an_unknown_format_is_refused():
    with pytest.raises(ValidationError, match="log_format"):
        Settings(_env_file=None, log_format="xml")
    with pytest.raises(ValueError, match="json, text"):
        configure_logging("xml", stream=io.StringIO())


def test_every_line_of_a_process_is_json_including_warnings():
    """A fresh interpreter: third-party loggers and Python warnings go through the formatter."""
    script = (
        "import logging, warnings\n"
        "from services.observability.logs import configure_logging\n"
        "configure_logging('json', 'INFO', stream=__import__('sys').stdout)\n"
        "logging.getLogger('celery.worker').info('ready')\n"
        "logging.getLogger('kombu').warning('reconnecting')\n"
        "warnings.warn('old api', DeprecationWarning)\n"
        "logging.getLogger('x').info('multi\\nline')\n"
    )
    out = subprocess.run(
        [sys.executable, "-W", "always", "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    ).stdout
    lines = out.splitlines()
    assert len(lines) == 4
    parsed = [json.loads(line) for line in lines]
    assert [p["logger"] for p in parsed] == ["celery.worker", "kombu", "py.warnings", "x"]
