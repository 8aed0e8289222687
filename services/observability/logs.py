"""Log setup: one JSON object per line (or plain text on a terminal), with the trace id.

Every line passes through `redact`, so an API key, a bearer token, a presigned URL's signature
or a configured secret never reaches the log, whichever logger wrote it.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from opentelemetry import trace
from pythonjsonlogger.json import JsonFormatter

if TYPE_CHECKING:
    from services.config import Settings

JSON = "json"
TEXT = "text"
FORMATS = (JSON, TEXT)
REDACTED = "[REDACTED]"

# API keys (services.auth.KEY_PREFIX), bearer tokens, S3 signatures and URL passwords.
SECRET_PATTERNS = (
    (re.compile(r"\bfn_[A-Za-z0-9_-]{16,}"), "fn_" + REDACTED),
    (re.compile(r"(?i)\b(bearer\s+)[^\s\"',;]+"), r"\1" + REDACTED),
    (
        re.compile(r"(?i)(X-Amz-(?:Signature|Credential|Security-Token)=)[^&\s\"']+"),
        r"\1" + REDACTED,
    ),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^:/@\s\"']*:)[^@/\s\"']+@"), r"\1" + REDACTED + "@"),
)
# Celery passes a task's arguments and return value along with its own log records.
CELERY_EXTRA_FIELDS = ("data",)


class Redactor:
    """Removes secrets from finished log lines: known values first, then known shapes."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        # Short values would redact ordinary words; real secrets are long.
        self.secrets = sorted({s for s in secrets if s and len(s) >= 8}, key=len, reverse=True)

    def __call__(self, line: str) -> str:
        for secret in self.secrets:
            line = line.replace(secret, REDACTED)
        for pattern, replacement in SECRET_PATTERNS:
            line = pattern.sub(replacement, line)
        return line


def trace_ids() -> dict[str, str]:
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


def drop_task_results(record: logging.LogRecord) -> None:
    """Celery's success line carries the task's return value: presigned URLs, for one."""
    for name in CELERY_EXTRA_FIELDS:
        record.__dict__.pop(name, None)
    if isinstance(record.args, dict) and "return_value" in record.args:
        record.args = {**record.args, "return_value": "(not logged)"}


class JsonLines(JsonFormatter):
    """One JSON object per record: time, level, logger, message, trace ids and extra fields."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__(
            "{levelname}{name}{message}",
            style="{",
            rename_fields={"levelname": "level", "name": "logger", "exc_info": "exception"},
        )
        self.redactor = redactor

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        log_data["time"] = datetime.fromtimestamp(record.created, tz=UTC).isoformat(
            timespec="milliseconds"
        )
        super().add_fields(log_data, record, message_dict)
        for key, value in trace_ids().items():
            log_data.setdefault(key, value)

    def format(self, record: logging.LogRecord) -> str:
        drop_task_results(record)
        return self.redactor(super().format(record))


class PlainText(logging.Formatter):
    """`time level logger: message`, for a person at a terminal."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        drop_task_results(record)
        return self.redactor(super().format(record))


def resolve_format(configured: str | None, stream: TextIO) -> str:
    """The configured format, or text on a terminal and JSON anywhere else."""
    if configured:
        return configured
    isatty = getattr(stream, "isatty", None)
    return TEXT if isatty is not None and isatty() else JSON


def configure_logging(
    log_format: str | None,
    level: str | int = "INFO",
    *,
    stream: TextIO | None = None,
    secrets: Iterable[str | None] = (),
) -> str:
    """Routes every logger through one handler on stream; returns the format it chose.

    Safe to call again (a Celery pool process does): the root's handlers are replaced.
    """
    stream = stream or sys.stderr
    chosen = resolve_format(log_format, stream)
    if chosen not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {chosen!r}")
    redactor = Redactor(secrets)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLines(redactor) if chosen == JSON else PlainText(redactor))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    # Libraries that log through their own handlers would write other formats.
    for name in ("celery", "celery.task", "celery.redirected", "kombu", "amqp"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    logging.captureWarnings(True)
    return chosen


def settings_secrets(settings: Settings) -> list[str | None]:
    return [
        settings.s3_secret_key,
        settings.llm_api_key,
        settings.embeddings_api_key,
        settings.dev_api_key,
    ]


def configure_from_settings(settings: Settings, stream: TextIO | None = None) -> str:
    """configure_logging with FOOTNOTE_LOG_FORMAT, FOOTNOTE_LOG_LEVEL and the configured secrets."""
    return configure_logging(
        settings.log_format, settings.log_level, stream=stream, secrets=settings_secrets(settings)
    )
