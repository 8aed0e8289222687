"""API keys: creation, hashed storage and lookup of the tenant a key belongs to."""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.db.models import ApiKey
from services.db.session import Database
from services.errors import InvalidArgument

KEY_PREFIX = "fn_"
TENANT_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant that owns everything the call touches."""

    tenant_id: str
    key_id: str


def hash_key(key: str) -> str:
    # Keys are 256-bit random secrets, so a fast hash is enough; slow hashes defend weak passwords.
    return hashlib.sha256(key.encode()).hexdigest()


def validate_tenant(tenant_id: str) -> str:
    if not TENANT_PATTERN.fullmatch(tenant_id):
        raise InvalidArgument(
            "tenant",
            "a tenant is 1-128 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
        )
    return tenant_id


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def store_key(s: Session, tenant_id: str, key: str, name: str = "") -> ApiKey:
    """Stores a key's hash unless it is already stored; returns the row."""
    validate_tenant(tenant_id)
    digest = hash_key(key)
    row = s.scalar(select(ApiKey).where(ApiKey.key_hash == digest))
    if row is None:
        row = ApiKey(tenant_id=tenant_id, key_hash=digest, prefix=key[:11], name=name)
        s.add(row)
        s.flush()
    elif row.tenant_id != tenant_id:
        raise InvalidArgument("key", "this key is already registered to another tenant")
    return row


def create_key(s: Session, tenant_id: str, name: str = "") -> str:
    key = new_key()
    store_key(s, tenant_id, key, name)
    return key


def lookup_key(s: Session, key: str) -> Principal | None:
    row = s.scalar(
        select(ApiKey).where(ApiKey.key_hash == hash_key(key), ApiKey.revoke_time.is_(None))
    )
    return None if row is None else Principal(tenant_id=row.tenant_id, key_id=str(row.id))


class Authenticator:
    """Resolves bearer keys to principals, caching answers briefly to keep SQL off the hot path."""

    def __init__(self, db: Database, ttl_seconds: float = 30.0, max_entries: int = 10_000) -> None:
        self.db = db
        self.ttl = ttl_seconds
        self.max_entries = max_entries
        self._cache: dict[str, tuple[float, Principal | None]] = {}

    async def authenticate(self, key: str) -> Principal | None:
        digest = hash_key(key)
        now = time.monotonic()
        hit = self._cache.get(digest)
        if hit is not None and hit[0] > now:
            return hit[1]
        principal = await self.db.run(lambda s: lookup_key(s, key))
        if len(self._cache) >= self.max_entries:
            self._cache.clear()
        self._cache[digest] = (now + self.ttl, principal)
        return principal
