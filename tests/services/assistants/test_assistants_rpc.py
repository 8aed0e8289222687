"""AssistantsService over a real channel, against the real Postgres."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest
from google.protobuf import field_mask_pb2

from footnote.v1 import assistants_service_pb2 as pb
from footnote.v1 import assistants_service_pb2_grpc as pb_grpc
from tests.support import bearer, error_info


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> pb_grpc.AssistantsServiceStub:
    return pb_grpc.AssistantsServiceStub(channel)


async def create(stub, key: str, name: str = "Docs helper", **settings) -> pb.Assistant:
    return await stub.CreateAssistant(
        pb.CreateAssistantRequest(
            assistant=pb.Assistant(display_name=name, settings=pb.AssistantSettings(**settings))
        ),
        metadata=bearer(key),
    )


async def expect_error(call, code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == code, err.value.details()
    return err.value


async def test_create_fills_documented_defaults(stub, api_key):
    created = await create(stub, api_key)
    s = created.settings
    assert created.id and created.display_name == "Docs helper"
    assert (s.enable_rag, s.enable_citations, s.enable_retrieval_gate) == (True, True, True)
    assert s.citation_link_mode == pb.CITATION_LINK_MODE_NONE
    assert (s.top_k, s.max_sources, s.excerpt_chars) == (8, 10, 200)
    assert s.score_threshold == 0.0 and s.max_output_tokens == 512
    assert s.HasField("temperature") and s.temperature == 0.0
    assert created.create_time.seconds > 0 and created.update_time == created.create_time

    fetched = await stub.GetAssistant(
        pb.GetAssistantRequest(id=created.id), metadata=bearer(api_key)
    )
    assert fetched == created


async def test_create_keeps_explicit_false_and_zero(stub, api_key):
    created = await create(
        stub,
        api_key,
        enable_rag=False,
        enable_citations=False,
        top_k=3,
        citation_link_mode=pb.CITATION_LINK_MODE_PUBLIC,
        system_prompt="Answer briefly.",
    )
    s = created.settings
    assert (s.enable_rag, s.enable_citations, s.top_k) == (False, False, 3)
    assert s.citation_link_mode == pb.CITATION_LINK_MODE_PUBLIC
    assert s.system_prompt == "Answer briefly."


async def test_update_with_field_mask_changes_only_named_fields(stub, api_key):
    created = await create(stub, api_key, top_k=5, max_sources=7)
    updated = await stub.UpdateAssistant(
        pb.UpdateAssistantRequest(
            assistant=pb.Assistant(
                id=created.id,
                display_name="ignored: not in the mask",
                settings=pb.AssistantSettings(top_k=12, max_sources=50),
            ),
            update_mask=field_mask_pb2.FieldMask(paths=["settings.top_k"]),
        ),
        metadata=bearer(api_key),
    )
    assert updated.settings.top_k == 12
    assert updated.settings.max_sources == 7
    assert updated.display_name == created.display_name
    assert updated.update_time.ToDatetime() > created.update_time.ToDatetime()

    # A masked field left unset goes back to its default (AIP-134).
    reset = await stub.UpdateAssistant(
        pb.UpdateAssistantRequest(
            assistant=pb.Assistant(id=created.id),
            update_mask=field_mask_pb2.FieldMask(paths=["settings.max_sources"]),
        ),
        metadata=bearer(api_key),
    )
    assert reset.settings.max_sources == 10 and reset.settings.top_k == 12

    again = await stub.GetAssistant(pb.GetAssistantRequest(id=created.id), metadata=bearer(api_key))
    assert again == reset


async def test_update_without_mask_changes_set_fields(stub, api_key):
    created = await create(stub, api_key, top_k=4)
    updated = await stub.UpdateAssistant(
        pb.UpdateAssistantRequest(
            assistant=pb.Assistant(
                id=created.id,
                display_name="Renamed",
                settings=pb.AssistantSettings(enable_rag=False),
            )
        ),
        metadata=bearer(api_key),
    )
    assert updated.display_name == "Renamed"
    assert updated.settings.enable_rag is False and updated.settings.top_k == 4


async def test_list_pages_through_every_assistant_once(stub, make_key):
    key = make_key(f"t-{uuid.uuid4().hex[:8]}")
    made = [(await create(stub, key, name=f"a{i}")).id for i in range(7)]
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = await stub.ListAssistants(
            pb.ListAssistantsRequest(page_size=3, page_token=token), metadata=bearer(key)
        )
        seen += [a.id for a in page.assistants]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert seen == made
    assert pages == 3


async def test_delete_then_get_is_not_found(stub, api_key):
    created = await create(stub, api_key)
    await stub.DeleteAssistant(pb.DeleteAssistantRequest(id=created.id), metadata=bearer(api_key))
    err = await expect_error(
        stub.GetAssistant(pb.GetAssistantRequest(id=created.id), metadata=bearer(api_key)),
        grpc.StatusCode.NOT_FOUND,
    )
    assert error_info(err).reason == "NOT_FOUND"
    await expect_error(
        stub.DeleteAssistant(pb.DeleteAssistantRequest(id=created.id), metadata=bearer(api_key)),
        grpc.StatusCode.NOT_FOUND,
    )


async def test_request_id_deduplicates_creates(stub, api_key):
    request = pb.CreateAssistantRequest(
        assistant=pb.Assistant(display_name="Once"), request_id=str(uuid.uuid4())
    )
    results = await asyncio.gather(
        *(stub.CreateAssistant(request, metadata=bearer(api_key)) for _ in range(5))
    )
    assert len({r.id for r in results}) == 1
    page = await stub.ListAssistants(
        pb.ListAssistantsRequest(page_size=100), metadata=bearer(api_key)
    )
    assert [a.display_name for a in page.assistants].count("Once") == 1


@pytest.mark.parametrize(
    ("assistant", "field"),
    [
        (pb.Assistant(display_name=""), "assistant.display_name"),
        (pb.Assistant(display_name="   "), "assistant.display_name"),
        (pb.Assistant(display_name="x" * 201), "assistant.display_name"),
        (pb.Assistant(display_name="bad\x00name"), "assistant.display_name"),
        (pb.Assistant(display_name="two\nlines"), "assistant.display_name"),
        (
            pb.Assistant(display_name="a", settings=pb.AssistantSettings(system_prompt="\x00")),
            "assistant.settings.system_prompt",
        ),
        (
            pb.Assistant(display_name="a", settings=pb.AssistantSettings(top_k=-1)),
            "assistant.settings.top_k",
        ),
        (
            pb.Assistant(display_name="a", settings=pb.AssistantSettings(top_k=0)),
            "assistant.settings.top_k",
        ),
        (
            pb.Assistant(display_name="a", settings=pb.AssistantSettings(temperature=float("nan"))),
            "assistant.settings.temperature",
        ),
        (
            pb.Assistant(display_name="a", settings=pb.AssistantSettings(score_threshold=1.5)),
            "assistant.settings.score_threshold",
        ),
        (
            pb.Assistant(display_name="a", settings=pb.AssistantSettings(excerpt_chars=10**6)),
            "assistant.settings.excerpt_chars",
        ),
        (
            pb.Assistant(display_name="a", settings=pb.AssistantSettings(citation_link_mode=99)),
            "assistant.settings.citation_link_mode",
        ),
    ],
)
async def test_bad_create_input_names_the_field(stub, api_key, assistant, field):
    err = await expect_error(
        stub.CreateAssistant(
            pb.CreateAssistantRequest(assistant=assistant), metadata=bearer(api_key)
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    info = error_info(err)
    assert info.domain == "footnote"
    assert info.metadata["field"] == field


async def test_unknown_mask_path_is_invalid(stub, api_key):
    created = await create(stub, api_key)
    err = await expect_error(
        stub.UpdateAssistant(
            pb.UpdateAssistantRequest(
                assistant=pb.Assistant(id=created.id),
                update_mask=field_mask_pb2.FieldMask(paths=["settings.no_such_field"]),
            ),
            metadata=bearer(api_key),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert error_info(err).metadata["field"] == "update_mask"


async def test_bad_update_keeps_the_stored_assistant(stub, api_key):
    created = await create(stub, api_key, top_k=6)
    await expect_error(
        stub.UpdateAssistant(
            pb.UpdateAssistantRequest(
                assistant=pb.Assistant(id=created.id, settings=pb.AssistantSettings(top_k=-3)),
                update_mask=field_mask_pb2.FieldMask(paths=["settings.top_k"]),
            ),
            metadata=bearer(api_key),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    after = await stub.GetAssistant(pb.GetAssistantRequest(id=created.id), metadata=bearer(api_key))
    assert after == created


@pytest.mark.parametrize(
    "token", ["garbage", "eyJrIjoiZG9jdW1lbnRzIn0", "!!!", "eyJrIjoiYXNzaXN0YW50cyJ9"]
)
async def test_bad_page_token_is_invalid(stub, api_key, token):
    err = await expect_error(
        stub.ListAssistants(pb.ListAssistantsRequest(page_token=token), metadata=bearer(api_key)),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert error_info(err).metadata["field"] == "page_token"


async def test_negative_page_size_is_invalid(stub, api_key):
    err = await expect_error(
        stub.ListAssistants(pb.ListAssistantsRequest(page_size=-1), metadata=bearer(api_key)),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert error_info(err).metadata["field"] == "page_size"


@pytest.mark.parametrize("bad_id", ["", "not-a-uuid", "'; DROP TABLE assistants; --"])
async def test_malformed_id_is_invalid(stub, api_key, bad_id):
    err = await expect_error(
        stub.GetAssistant(pb.GetAssistantRequest(id=bad_id), metadata=bearer(api_key)),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert error_info(err).metadata["field"] == "id"


async def test_missing_id_is_not_found(stub, api_key):
    await expect_error(
        stub.GetAssistant(pb.GetAssistantRequest(id=str(uuid.uuid4())), metadata=bearer(api_key)),
        grpc.StatusCode.NOT_FOUND,
    )
