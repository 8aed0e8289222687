"""API keys, tenant isolation, health and reflection over a real channel."""

from __future__ import annotations

import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from footnote.v1 import assistants_service_pb2 as apb
from footnote.v1 import assistants_service_pb2_grpc as apb_grpc
from footnote.v1 import chat_service_pb2 as cpb
from footnote.v1 import chat_service_pb2_grpc as cpb_grpc
from footnote.v1 import documents_service_pb2 as dpb
from footnote.v1 import documents_service_pb2_grpc as dpb_grpc
from tests.support import bearer, error_info

FOOTNOTE_SERVICES = {
    "footnote.v1.AssistantsService",
    "footnote.v1.DocumentsService",
    "footnote.v1.ChatService",
    "footnote.v1.ConversationsService",
}


async def test_health_serves_without_a_key(channel):
    stub = health_pb2_grpc.HealthStub(channel)
    for service in ("", *FOOTNOTE_SERVICES):
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, service


async def test_reflection_lists_the_four_services(channel):
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = stub.ServerReflectionInfo()
    await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    reply = await call.read()
    await call.done_writing()
    names = {s.name for s in reply.list_services_response.service}
    assert names >= FOOTNOTE_SERVICES
    assert "grpc.health.v1.Health" in names


@pytest.mark.parametrize(
    ("metadata", "reason"),
    [
        ((), "API_KEY_MISSING"),
        ((("authorization", "Bearer "),), "API_KEY_MISSING"),
        ((("authorization", "Basic dXNlcjpwYXNz"),), "API_KEY_MISSING"),
        ((("authorization", "Bearer fn_not-a-real-key"),), "API_KEY_INVALID"),
        ((("authorization", "Bearer " + "x" * 4000),), "API_KEY_INVALID"),
    ],
)
async def test_calls_without_a_valid_key_are_unauthenticated(channel, metadata, reason):
    calls = [
        apb_grpc.AssistantsServiceStub(channel).ListAssistants(
            apb.ListAssistantsRequest(), metadata=metadata
        ),
        dpb_grpc.DocumentsServiceStub(channel).GetDocument(
            dpb.GetDocumentRequest(id=str(uuid.uuid4())), metadata=metadata
        ),
    ]
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert error_info(err.value).reason == reason


async def test_streaming_calls_need_a_key_too(channel):
    call = cpb_grpc.ChatServiceStub(channel).StreamComplete(cpb.CompleteRequest())
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in call:
            pass
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_key_belongs_to_one_tenant(db):
    from services import auth
    from services.errors import InvalidArgument

    key = db.transact(lambda s: auth.create_key(s, "alpha"))
    with pytest.raises(InvalidArgument):
        db.transact(lambda s: auth.store_key(s, "beta", key))


async def test_another_tenants_assistant_is_not_found(channel, make_key):
    stub = apb_grpc.AssistantsServiceStub(channel)
    owner, intruder = (
        make_key("owner-" + uuid.uuid4().hex[:6]),
        make_key("other-" + uuid.uuid4().hex[:6]),
    )
    theirs = await stub.CreateAssistant(
        apb.CreateAssistantRequest(assistant=apb.Assistant(display_name="private")),
        metadata=bearer(owner),
    )
    missing_id = str(uuid.uuid4())

    async def failure(assistant_id: str, rpc: str) -> tuple[grpc.StatusCode, str, list[str]]:
        if rpc == "get":
            call = stub.GetAssistant(
                apb.GetAssistantRequest(id=assistant_id), metadata=bearer(intruder)
            )
        elif rpc == "delete":
            call = stub.DeleteAssistant(
                apb.DeleteAssistantRequest(id=assistant_id), metadata=bearer(intruder)
            )
        else:
            call = stub.UpdateAssistant(
                apb.UpdateAssistantRequest(
                    assistant=apb.Assistant(id=assistant_id, display_name="hijacked")
                ),
                metadata=bearer(intruder),
            )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        info = error_info(err.value)
        return err.value.code(), info.reason, sorted(info.metadata)

    for rpc in ("get", "update", "delete"):
        foreign = await failure(theirs.id, rpc)
        absent = await failure(missing_id, rpc)
        assert foreign == absent == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND", ["id", "resource"])

    listed = await stub.ListAssistants(apb.ListAssistantsRequest(), metadata=bearer(intruder))
    assert theirs.id not in {a.id for a in listed.assistants}
    still = await stub.GetAssistant(apb.GetAssistantRequest(id=theirs.id), metadata=bearer(owner))
    assert still == theirs
