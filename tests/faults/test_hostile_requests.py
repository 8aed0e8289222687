"""Hostile requests to every RPC: none may end INTERNAL or UNKNOWN, or leak internals.

Messages are generated from the request descriptors, so every field of every RPC is covered,
including ones added later: strings with NUL, control characters, DEL, huge values and
malformed ids; negative and extreme numbers; unknown enum values; garbage page tokens; bad
Durations. Raw bytes go on the wire too: random bytes, broken wire formats, and invalid UTF-8
in each string field, which a client library would refuse to send.
"""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import descriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from footnote.v1 import (
    assistants_service_pb2,
    chat_service_pb2,
    conversations_service_pb2,
    documents_service_pb2,
)
from tests.support import bearer, error_info

FILES = (assistants_service_pb2, documents_service_pb2, chat_service_pb2, conversations_service_pb2)
METHODS: list[descriptor.MethodDescriptor] = [
    method
    for module in FILES
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]
FORBIDDEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE}
LEAKS = ("Traceback", "Exception", "Error(", 'File "', "sqlalchemy", "psycopg")
CALL_TIMEOUT = 60.0
FD = descriptor.FieldDescriptor

hostile_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "",
            " ",
            "\x00",
            "a\x00b",
            "\x7f",
            "text/\x7fplain",
            "\x1b[31m",
            "\u0085",
            "é/ü",
            "text/plain\r\nX-Injected: 1",
            "../../etc/passwd",
            "00000000-0000-0000-0000-000000000000",
            "not-a-uuid",
            "%00",
            "'; DROP TABLE documents; --",
            "\ufeff",
            "\u202e",
            "🙂" * 50,
            "x" * 300,
            "x" * 70_000,
            "eyJrIjoiYXNzaXN0YW50cyJ9",
            "!!!garbage!!!",
        ]
    ),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=8).map(lambda s: s * 40),
)
INT32 = st.one_of(
    st.sampled_from([0, -1, 1, -(2**31), 2**31 - 1, 7, 1000]), st.integers(-(2**31), 2**31 - 1)
)
INT64 = st.one_of(
    st.sampled_from([0, -1, 1, -(2**63), 2**63 - 1, 315_576_000_001]),
    st.integers(-(2**63), 2**63 - 1),
)
FLOATS = st.one_of(
    st.sampled_from([0.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e308, 2.5]),
    st.floats(width=32, allow_nan=True, allow_infinity=True),
)


def scalar(field: descriptor.FieldDescriptor) -> st.SearchStrategy[object]:
    t = field.type
    if t == FD.TYPE_STRING:
        return hostile_text
    if t == FD.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == FD.TYPE_BOOL:
        return st.booleans()
    if t in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
        return FLOATS
    if t == FD.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), INT32)  # proto3 enums keep unknown values
    if t in (FD.TYPE_INT64, FD.TYPE_SINT64, FD.TYPE_SFIXED64):
        return INT64
    if t in (FD.TYPE_UINT64, FD.TYPE_FIXED64):
        return st.integers(0, 2**64 - 1)
    if t in (FD.TYPE_UINT32, FD.TYPE_FIXED32):
        return st.integers(0, 2**32 - 1)
    return INT32


def messages(desc: descriptor.Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of this type with any subset of fields set to hostile values."""
    cls = message_class(desc)

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        msg = cls()
        for field in desc.fields:
            if not draw(st.booleans()):
                continue
            if field.type == FD.TYPE_MESSAGE:
                if depth >= 3:
                    continue
                sub = messages(field.message_type, depth + 1)
                if field.is_repeated:
                    for item in draw(st.lists(sub, max_size=3)):
                        getattr(msg, field.name).add().CopyFrom(item)
                else:
                    getattr(msg, field.name).CopyFrom(draw(sub))
            elif field.is_repeated:
                getattr(msg, field.name).extend(draw(st.lists(scalar(field), max_size=3)))
            else:
                setattr(msg, field.name, draw(scalar(field)))
        return msg

    return build()


def message_class(desc: descriptor.Descriptor) -> type[Message]:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(desc)


def path(method: descriptor.MethodDescriptor) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


def call_raw(
    channel: grpc.Channel, method: descriptor.MethodDescriptor, payloads: list[bytes], key: str
) -> grpc.RpcError | None:
    """Sends serialized requests as they are; returns the error, or None if the call succeeded."""
    identity = lambda b: b  # noqa: E731
    kwargs = {"request_serializer": identity, "response_deserializer": identity}
    try:
        if method.client_streaming:
            channel.stream_unary(path(method), **kwargs)(
                iter(payloads), metadata=bearer(key), timeout=CALL_TIMEOUT
            )
        elif method.server_streaming:
            for _ in channel.unary_stream(path(method), **kwargs)(
                payloads[0], metadata=bearer(key), timeout=CALL_TIMEOUT
            ):
                pass
        else:
            channel.unary_unary(path(method), **kwargs)(
                payloads[0], metadata=bearer(key), timeout=CALL_TIMEOUT
            )
    except grpc.RpcError as err:
        return err
    return None


def assert_clean(err: grpc.RpcError | None, what: str) -> None:
    if err is None:
        return
    code = err.code()
    assert code not in FORBIDDEN, f"{what}: {code} {err.details()!r}"
    details = err.details() or ""
    assert not any(leak in details for leak in LEAKS), f"{what}: leaks {details!r}"
    if code is not grpc.StatusCode.DEADLINE_EXCEEDED:
        info = error_info(err)
        assert info.domain == "footnote" and info.reason, what


def with_assistant(msg: Message, assistant_id: str, draw_real: bool) -> Message:
    """Points some requests at a real assistant, so calls get past the lookup."""
    if not draw_real:
        return msg
    for name in ("assistant_id",):
        if name in msg.DESCRIPTOR.fields_by_name:
            setattr(msg, name, assistant_id)
    if msg.DESCRIPTOR.name == "UploadDocumentRequest" and msg.WhichOneof("payload") == "metadata":
        msg.metadata.assistant_id = assistant_id
    return msg


EXAMPLES_PER_METHOD = 15
SETTINGS = settings(
    max_examples=EXAMPLES_PER_METHOD,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_hostile_field_values_never_give_internal(
    method, sync_channel, module_key, module_assistant
):
    @SETTINGS
    @given(msg=messages(method.input_type), real=st.booleans(), data=st.data())
    def run(msg: Message, real: bool, data: st.DataObject) -> None:
        msg = with_assistant(msg, module_assistant, real)
        payloads = [msg.SerializeToString()]
        if method.client_streaming:
            # Then a few more messages: chunks, or metadata again where it is not allowed.
            more = data.draw(st.lists(messages(method.input_type), max_size=3))
            payloads += [m.SerializeToString() for m in more]
        assert_clean(call_raw(sync_channel, method, payloads, module_key), f"{method.name} {msg}")

    run()


def string_fields(
    desc: descriptor.Descriptor, prefix: tuple[int, ...] = ()
) -> list[tuple[int, ...]]:
    """Field-number paths to every string field, through nested messages (one level deep)."""
    found = []
    for field in desc.fields:
        if field.type == FD.TYPE_STRING:
            found.append((*prefix, field.number))
        elif field.type == FD.TYPE_MESSAGE and not prefix:
            found += string_fields(field.message_type, (field.number,))
    return found


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def length_delimited(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def with_bad_utf8(field_path: tuple[int, ...], bad: bytes) -> bytes:
    payload = length_delimited(field_path[-1], bad)
    for number in reversed(field_path[:-1]):
        payload = length_delimited(number, payload)
    return payload


BAD_UTF8 = [b"\xff", b"\xc3\x28", b"ok\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]
UTF8_CASES = [
    (method, field_path, bad)
    for method in METHODS
    for field_path in string_fields(method.input_type)
    for bad in BAD_UTF8[:2]
]


@pytest.mark.parametrize(
    ("method", "field_path", "bad"),
    UTF8_CASES,
    ids=[f"{m.name}-{'.'.join(map(str, p))}-{b.hex()}" for m, p, b in UTF8_CASES],
)
def test_invalid_utf8_is_invalid_argument(method, field_path, bad, sync_channel, module_key):
    err = call_raw(sync_channel, method, [with_bad_utf8(field_path, bad)], module_key)
    assert err is not None, "invalid UTF-8 was accepted"
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
    assert error_info(err).reason == "REQUEST_UNDECODABLE"
    assert "UnicodeDecodeError" not in (err.details() or "")


BROKEN_WIRE = [
    b"\x0a\xff\xff\xff\xff\x0f",  # a length far past the end
    b"\x0a\x05ab",  # a truncated string
    b"\x08",  # a tag without its value
    b"\x0b",  # start group, never ended
    b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",  # an over-long varint
    b"\x07",  # wire type 7 does not exist
    b"\x00\x00",  # field number 0
]


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_broken_wire_format_is_invalid_argument(method, sync_channel, module_key):
    for payload in BROKEN_WIRE:
        err = call_raw(sync_channel, method, [payload], module_key)
        assert err is not None, f"{payload!r} was accepted"
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (payload, err.code(), err.details())


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_random_bytes_never_give_internal(method, sync_channel, module_key):
    @SETTINGS
    @given(payload=st.binary(max_size=256))
    def run(payload: bytes) -> None:
        assert_clean(call_raw(sync_channel, method, [payload], module_key), f"{payload!r}")

    run()


def test_every_method_is_covered():
    assert {m.name for m in METHODS} >= {
        "CreateAssistant",
        "UploadDocument",
        "GetDownloadUrl",
        "Complete",
        "StreamComplete",
        "ListMessages",
    }
    assert len(UTF8_CASES) >= 20
