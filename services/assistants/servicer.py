"""AssistantsService: converts proto messages to domain calls and back."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc

from footnote.v1 import assistants_service_pb2 as pb
from footnote.v1 import assistants_service_pb2_grpc as pb_grpc
from services.assistants import domain
from services.assistants.domain import AssistantRecord, AssistantSettings, LinkMode
from services.assistants.service import AssistantService
from services.errors import InvalidArgument
from services.rpc import principal, to_timestamp

LINK_MODE_TO_PROTO = {
    LinkMode.NONE: pb.CITATION_LINK_MODE_NONE,
    LinkMode.AUTHENTICATED: pb.CITATION_LINK_MODE_AUTHENTICATED,
    LinkMode.PUBLIC: pb.CITATION_LINK_MODE_PUBLIC,
}
LINK_MODE_FROM_PROTO = {v: k for k, v in LINK_MODE_TO_PROTO.items()}
# Settings whose proto fields have no presence: "set" means "differs from the zero value".
PLAIN_SETTINGS = frozenset({"system_prompt", "model", "citation_link_mode"})
MASK_PATHS = frozenset(
    {"display_name", "settings"} | {f"settings.{n}" for n in domain.SETTING_NAMES}
)


def settings_to_proto(settings: AssistantSettings) -> pb.AssistantSettings:
    return pb.AssistantSettings(
        system_prompt=settings.system_prompt,
        model=settings.model,
        temperature=settings.temperature,
        max_output_tokens=settings.max_output_tokens,
        enable_rag=settings.enable_rag,
        enable_citations=settings.enable_citations,
        citation_link_mode=LINK_MODE_TO_PROTO[settings.citation_link_mode],
        top_k=settings.top_k,
        score_threshold=settings.score_threshold,
        max_sources=settings.max_sources,
        excerpt_chars=settings.excerpt_chars,
        enable_retrieval_gate=settings.enable_retrieval_gate,
    )


def assistant_to_proto(record: AssistantRecord) -> pb.Assistant:
    return pb.Assistant(
        id=record.id,
        display_name=record.display_name,
        settings=settings_to_proto(record.settings),
        create_time=to_timestamp(record.create_time),
        update_time=to_timestamp(record.update_time),
    )


def is_set(msg: pb.AssistantSettings, name: str) -> bool:
    if name in PLAIN_SETTINGS:
        return bool(getattr(msg, name))
    return msg.HasField(name)


def setting_value(msg: pb.AssistantSettings, name: str) -> Any:
    """The domain value of one setting, or None when the message leaves it unset."""
    if not is_set(msg, name):
        return None
    if name == "citation_link_mode":
        mode = LINK_MODE_FROM_PROTO.get(msg.citation_link_mode)
        if mode is None:
            raise InvalidArgument(
                "assistant.settings.citation_link_mode",
                f"unknown citation_link_mode {msg.citation_link_mode}",
            )
        return mode
    return getattr(msg, name)


def settings_changes(msg: pb.AssistantSettings, names: Iterable[str]) -> dict[str, Any]:
    return {name: setting_value(msg, name) for name in names}


def present_settings(msg: pb.AssistantSettings) -> list[str]:
    return sorted(name for name in domain.SETTING_NAMES if is_set(msg, name))


class AssistantsServicer(pb_grpc.AssistantsServiceServicer):
    def __init__(self, assistants: AssistantService) -> None:
        self.assistants = assistants

    async def CreateAssistant(
        self, request: pb.CreateAssistantRequest, context: grpc.aio.ServicerContext
    ) -> pb.Assistant:
        a = request.assistant
        changes = settings_changes(a.settings, present_settings(a.settings))
        record = await self.assistants.create(
            principal().tenant_id, a.display_name, changes, request.request_id
        )
        return assistant_to_proto(record)

    async def GetAssistant(
        self, request: pb.GetAssistantRequest, context: grpc.aio.ServicerContext
    ) -> pb.Assistant:
        record = await self.assistants.get(principal().tenant_id, request.id)
        return assistant_to_proto(record)

    async def ListAssistants(
        self, request: pb.ListAssistantsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListAssistantsResponse:
        records, token = await self.assistants.list(
            principal().tenant_id, request.page_size, request.page_token
        )
        return pb.ListAssistantsResponse(
            assistants=[assistant_to_proto(r) for r in records], next_page_token=token
        )

    async def UpdateAssistant(
        self, request: pb.UpdateAssistantRequest, context: grpc.aio.ServicerContext
    ) -> pb.Assistant:
        a = request.assistant
        paths = list(request.update_mask.paths)
        unknown = sorted(set(paths) - MASK_PATHS)
        if unknown:
            raise InvalidArgument(
                "update_mask",
                f"unknown update_mask path {unknown[0]!r}; allowed: display_name, settings, "
                "settings.<field>",
            )
        if not paths:  # AIP-134: no mask means every field the request sets.
            paths = (["display_name"] if a.display_name else []) + [
                f"settings.{n}" for n in present_settings(a.settings)
            ]
        names: set[str] = set()
        for path in paths:
            if path == "settings":
                names |= domain.SETTING_NAMES
            elif path.startswith("settings."):
                names.add(path.removeprefix("settings."))
        record = await self.assistants.update(
            principal().tenant_id,
            a.id,
            a.display_name if "display_name" in paths else None,
            settings_changes(a.settings, sorted(names)),
        )
        return assistant_to_proto(record)

    async def DeleteAssistant(
        self, request: pb.DeleteAssistantRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteAssistantResponse:
        await self.assistants.delete(principal().tenant_id, request.id)
        return pb.DeleteAssistantResponse()
