"""The assistants domain service: each call is one short transaction of its own."""

from __future__ import annotations

from typing import Any

from services.assistants import domain
from services.assistants.domain import AssistantRecord
from services.db.session import Database


class AssistantService:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def create(
        self,
        tenant_id: str,
        display_name: str,
        settings_changes: dict[str, Any],
        request_id: str = "",
    ) -> AssistantRecord:
        return await self.db.run(
            lambda s: domain.create_assistant(
                s, tenant_id, display_name, settings_changes, request_id
            )
        )

    async def get(self, tenant_id: str, assistant_id: str) -> AssistantRecord:
        return await self.db.run(lambda s: domain.get_assistant(s, tenant_id, assistant_id))

    async def list(
        self, tenant_id: str, page_size: int, page_token: str
    ) -> tuple[list[AssistantRecord], str]:
        return await self.db.run(
            lambda s: domain.list_assistants(s, tenant_id, page_size, page_token)
        )

    async def update(
        self,
        tenant_id: str,
        assistant_id: str,
        display_name: str | None,
        settings_changes: dict[str, Any],
    ) -> AssistantRecord:
        return await self.db.run(
            lambda s: domain.update_assistant(
                s, tenant_id, assistant_id, display_name, settings_changes
            )
        )

    async def delete(self, tenant_id: str, assistant_id: str) -> None:
        await self.db.run(lambda s: domain.delete_assistant(s, tenant_id, assistant_id))
