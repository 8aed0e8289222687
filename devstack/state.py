"""The state directory: where each component keeps its files, and the stack's private state."""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devstack.errors import StackError
from services.config import Settings

# Written by a running `footnote dev`, so other commands can find its services.
ENDPOINTS_FILE = "endpoints.json"


@dataclass(frozen=True)
class Layout:
    """Where each component keeps its files under the state dir (short names: socket limits)."""

    root: Path

    @property
    def pgdata(self) -> Path:
        return self.root / "pg"

    @property
    def redis(self) -> Path:
        return self.root / "redis"

    @property
    def s3(self) -> Path:
        return self.root / "s3"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def state_file(self) -> Path:
        return self.root / "stack.json"

    @property
    def lock_file(self) -> Path:
        return self.root / "stack.lock"

    def data_dirs(self) -> tuple[Path, ...]:
        return (self.pgdata, self.redis, self.s3)


def read_state(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        raise StackError(f"cannot read {path}: {err}") from err
    if not isinstance(data, dict):
        raise StackError(f"{path} does not hold a JSON object")
    return data


def write_private_json(path: Path, data: dict[str, Any]) -> None:
    """Writes JSON readable by the owner only, atomically, since it holds the S3 secret."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    os.chmod(tmp, 0o600)  # in case the file existed with a wider mode
    os.replace(tmp, path)


def new_access_key() -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return "FN" + "".join(secrets.choice(alphabet) for _ in range(18))


@dataclass(frozen=True)
class Endpoints:
    """Where each backing service listens, embedded or configured."""

    database_url: str
    broker_url: str
    s3_endpoint: str
    s3_access_key: str
    s3_secret_key: str
    s3_bucket: str

    def as_env(self) -> dict[str, str]:
        """The FOOTNOTE_* variables that point a server or worker process at these services."""
        return {
            "FOOTNOTE_DATABASE_URL": self.database_url,
            "FOOTNOTE_BROKER_URL": self.broker_url,
            "FOOTNOTE_S3_ENDPOINT": self.s3_endpoint,
            "FOOTNOTE_S3_ACCESS_KEY": self.s3_access_key,
            "FOOTNOTE_S3_SECRET_KEY": self.s3_secret_key,
            "FOOTNOTE_S3_BUCKET": self.s3_bucket,
        }


def settings_with_endpoints(settings: Settings, endpoints: Endpoints) -> Settings:
    return settings.model_copy(
        update={
            "database_url": endpoints.database_url,
            "broker_url": endpoints.broker_url,
            "s3_endpoint": endpoints.s3_endpoint,
            "s3_access_key": endpoints.s3_access_key,
            "s3_secret_key": endpoints.s3_secret_key,
            "s3_bucket": endpoints.s3_bucket,
        }
    )


def load_endpoints(state_dir: Path) -> Endpoints | None:
    """The endpoints of a dev stack running on state_dir, if one is running."""
    path = state_dir / ENDPOINTS_FILE
    if not path.exists():
        return None
    return Endpoints(**json.loads(path.read_text()))
