"""The bad values found in trials, one by one: each is INVALID_ARGUMENT naming its field.

And AIP-155: a request_id reused with a different request is an error, never the resource
the first request made.
"""

from __future__ import annotations

import uuid

import grpc
import pytest
from google.protobuf import duration_pb2

from footnote.v1 import assistants_service_pb2 as apb
from footnote.v1 import assistants_service_pb2_grpc as apb_grpc
from footnote.v1 import chat_service_pb2 as cpb
from footnote.v1 import chat_service_pb2_grpc as cpb_grpc
from footnote.v1 import conversations_service_pb2 as vpb
from footnote.v1 import conversations_service_pb2_grpc as vpb_grpc
from footnote.v1 import documents_service_pb2 as dpb
from footnote.v1 import documents_service_pb2_grpc as dpb_grpc
from tests.support import bearer, error_info


def upload(channel, key, assistant_id, data=b"# Notes\n\nSome text.\n", **metadata):
    meta = dpb.UploadDocumentMetadata(
        assistant_id=assistant_id, display_name="notes.md", **metadata
    )
    messages = [dpb.UploadDocumentRequest(metadata=meta), dpb.UploadDocumentRequest(chunk=data)]
    return dpb_grpc.DocumentsServiceStub(channel).UploadDocument(
        iter(messages), metadata=bearer(key), timeout=60
    )


def invalid(err: pytest.ExceptionInfo[grpc.RpcError], field: str) -> None:
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert error_info(err.value).metadata["field"] == field


@pytest.mark.parametrize(
    "content_type",
    ["é/ü", "text/\x7fplain", "\x7f", "text/plain\r\nX-Injected: 1", "text/" + "x" * 300, "x"],
    ids=["non-ascii", "del-inside", "del", "header-injection", "over-long", "not-a-type"],
)
def test_bad_content_type(sync_channel, module_key, module_assistant, content_type):
    with pytest.raises(grpc.RpcError) as err:
        upload(sync_channel, module_key, module_assistant, content_type=content_type)
    invalid(err, "metadata.content_type")


@pytest.mark.parametrize("name", ["a\x7fb", "a\u0085b", "\x1b[31mred", " ", "x" * 300])
def test_bad_display_name(sync_channel, module_key, module_assistant, name):
    meta = dpb.UploadDocumentMetadata(assistant_id=module_assistant, display_name=name)
    with pytest.raises(grpc.RpcError) as err:
        dpb_grpc.DocumentsServiceStub(sync_channel).UploadDocument(
            iter([dpb.UploadDocumentRequest(metadata=meta), dpb.UploadDocumentRequest(chunk=b"x")]),
            metadata=bearer(module_key),
        )
    invalid(err, "metadata.display_name")
    with pytest.raises(grpc.RpcError) as err:
        apb_grpc.AssistantsServiceStub(sync_channel).CreateAssistant(
            apb.CreateAssistantRequest(assistant=apb.Assistant(display_name=name)),
            metadata=bearer(module_key),
        )
    invalid(err, "assistant.display_name")


def test_a_well_formed_content_type_is_accepted(sync_channel, module_key, module_assistant):
    doc = upload(
        sync_channel, module_key, module_assistant, content_type="text/markdown; charset=utf-8"
    )
    assert doc.state == dpb.DOCUMENT_STATE_PENDING


@pytest.mark.parametrize(
    ("seconds", "nanos"),
    [(3600, -1), (-3600, 5), (0, 1_000_000_000), (0, -1), (-1, 0), (10**12, 0), (0, 0)],
)
def test_bad_ttl(sync_channel, module_key, module_assistant, seconds, nanos):
    doc = upload(sync_channel, module_key, module_assistant)
    with pytest.raises(grpc.RpcError) as err:
        dpb_grpc.DocumentsServiceStub(sync_channel).GetDownloadUrl(
            dpb.GetDownloadUrlRequest(
                document_id=doc.id, ttl=duration_pb2.Duration(seconds=seconds, nanos=nanos)
            ),
            metadata=bearer(module_key),
        )
    invalid(err, "ttl")


def test_malformed_ids_name_their_field(sync_channel, module_key):
    docs = dpb_grpc.DocumentsServiceStub(sync_channel)
    with pytest.raises(grpc.RpcError) as err:
        docs.GetDownloadUrl(
            dpb.GetDownloadUrlRequest(document_id="nope"), metadata=bearer(module_key)
        )
    invalid(err, "document_id")
    with pytest.raises(grpc.RpcError) as err:
        docs.ListDocuments(
            dpb.ListDocumentsRequest(assistant_id="nope"), metadata=bearer(module_key)
        )
    invalid(err, "assistant_id")
    with pytest.raises(grpc.RpcError) as err:
        vpb_grpc.ConversationsServiceStub(sync_channel).ListMessages(
            vpb.ListMessagesRequest(conversation_id="x"), metadata=bearer(module_key)
        )
    invalid(err, "conversation_id")


@pytest.mark.parametrize("token", ["garbage", "!!!", "eyJrIjoib3RoZXIifQ", "\u00e9" * 10])
def test_bad_page_sizes_and_tokens(sync_channel, module_key, token):
    lists = [
        lambda **kw: apb_grpc.AssistantsServiceStub(sync_channel).ListAssistants(
            apb.ListAssistantsRequest(**kw), metadata=bearer(module_key)
        ),
        lambda **kw: dpb_grpc.DocumentsServiceStub(sync_channel).ListDocuments(
            dpb.ListDocumentsRequest(**kw), metadata=bearer(module_key)
        ),
        lambda **kw: vpb_grpc.ConversationsServiceStub(sync_channel).ListConversations(
            vpb.ListConversationsRequest(**kw), metadata=bearer(module_key)
        ),
    ]
    for call in lists:
        with pytest.raises(grpc.RpcError) as err:
            call(page_token=token)
        invalid(err, "page_token")
        with pytest.raises(grpc.RpcError) as err:
            call(page_size=-1)
        invalid(err, "page_size")


def reused(err: pytest.ExceptionInfo[grpc.RpcError]) -> None:
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS, err.value.details()
    assert error_info(err.value).reason == "REQUEST_ID_REUSED"


def new_assistant(channel, key, name="other", request_id=""):
    return apb_grpc.AssistantsServiceStub(channel).CreateAssistant(
        apb.CreateAssistantRequest(
            assistant=apb.Assistant(display_name=name), request_id=request_id
        ),
        metadata=bearer(key),
    )


def test_upload_request_id_reused_under_another_assistant(
    sync_channel, module_key, module_assistant
):
    request_id = uuid.uuid4().hex
    first = upload(sync_channel, module_key, module_assistant, request_id=request_id)
    again = upload(sync_channel, module_key, module_assistant, request_id=request_id)
    assert again.id == first.id
    other = new_assistant(sync_channel, module_key)
    with pytest.raises(grpc.RpcError) as err:
        upload(sync_channel, module_key, other.id, request_id=request_id)
    reused(err)


def test_create_assistant_request_id_reused_with_another_body(sync_channel, module_key):
    request_id = uuid.uuid4().hex
    first = new_assistant(sync_channel, module_key, "first", request_id)
    assert new_assistant(sync_channel, module_key, "first", request_id).id == first.id
    with pytest.raises(grpc.RpcError) as err:
        new_assistant(sync_channel, module_key, "second", request_id)
    reused(err)


def test_complete_request_id_reused_with_another_question(
    sync_channel, module_key, module_assistant
):
    chat = cpb_grpc.ChatServiceStub(sync_channel)
    request_id = uuid.uuid4().hex

    def ask(question: str, assistant_id: str = module_assistant) -> cpb.CompleteResponse:
        return chat.Complete(
            cpb.CompleteRequest(
                assistant_id=assistant_id,
                messages=[cpb.ChatMessage(role=cpb.ROLE_USER, content=question)],
                request_id=request_id,
            ),
            metadata=bearer(module_key),
            timeout=60,
        )

    first = ask("What is in the notes?")
    assert ask("What is in the notes?").message_id == first.message_id
    with pytest.raises(grpc.RpcError) as err:
        ask("Something else entirely?")
    reused(err)
    other = new_assistant(sync_channel, module_key)
    with pytest.raises(grpc.RpcError) as err:
        ask("What is in the notes?", other.id)
    reused(err)
