"""Server plumbing shared by every servicer: authentication, the error boundary, timestamps."""

from __future__ import annotations

import contextvars
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import grpc
import kombu.exceptions
import sqlalchemy.exc
from google.protobuf import any_pb2, duration_pb2, timestamp_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from services.auth import Authenticator, Principal
from services.errors import (
    ERROR_DOMAIN,
    FootnoteError,
    InvalidArgument,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)

log = logging.getLogger(__name__)

# Failures of a dependency rather than of the call: the client may retry (UNAVAILABLE).
DEPENDENCY_ERRORS: tuple[type[BaseException], ...] = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
    kombu.exceptions.OperationalError,
)


def is_dependency_error(exc: BaseException) -> bool:
    """A dependency that went away, including a database connection cut in mid-statement."""
    if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, DEPENDENCY_ERRORS)


# Health and reflection stay open so probes and tools work without a key.
PUBLIC_SERVICE_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")

_principal: contextvars.ContextVar[Principal] = contextvars.ContextVar("footnote_principal")


def principal() -> Principal:
    """The caller of the current RPC, as set by AuthInterceptor."""
    return _principal.get()


def to_timestamp(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


# google.protobuf.Duration's documented range: about 10,000 years either way.
MAX_DURATION_SECONDS = 315_576_000_000


def to_timedelta(value: duration_pb2.Duration, field: str) -> timedelta:
    """A valid Duration as a timedelta; INVALID_ARGUMENT naming the field otherwise."""
    seconds, nanos = value.seconds, value.nanos
    if (
        abs(seconds) > MAX_DURATION_SECONDS
        or abs(nanos) > 999_999_999
        or (seconds > 0 and nanos < 0)
        or (seconds < 0 and nanos > 0)
    ):
        raise InvalidArgument(
            field,
            f"{field} is not a valid Duration: seconds within ±{MAX_DURATION_SECONDS}, nanos "
            "within ±999,999,999 and of the same sign as seconds",
        )
    try:
        return timedelta(seconds=seconds, microseconds=nanos // 1000)
    except OverflowError:
        raise InvalidArgument(field, f"{field} is out of range") from None


def error_status(err: FootnoteError) -> grpc.Status:
    info = error_details_pb2.ErrorInfo(
        reason=err.reason, domain=ERROR_DOMAIN, metadata=err.metadata
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=err.code.value[0], message=err.message, details=[detail])
    return rpc_status.to_status(status)


def internal_status() -> grpc.Status:
    info = error_details_pb2.ErrorInfo(reason="INTERNAL", domain=ERROR_DOMAIN)
    detail = any_pb2.Any()
    detail.Pack(info)
    return rpc_status.to_status(
        status_pb2.Status(
            code=code_pb2.INTERNAL, message="internal error; see the server log", details=[detail]
        )
    )


async def abort_for(context: grpc.aio.ServicerContext, exc: BaseException, method: str) -> None:
    """Ends the RPC with the status for exc; unknown errors are logged and never described."""
    if isinstance(exc, FootnoteError):
        await context.abort_with_status(error_status(exc))
    if is_dependency_error(exc):
        log.warning("a dependency failed in %s: %s", method, type(exc).__name__)
        await context.abort_with_status(
            error_status(Unavailable("a service this call depends on is unavailable; retry"))
        )
    if isinstance(exc, NotImplementedError):
        # Generated servicer bases raise this for RPCs that a later release implements.
        await context.abort_with_status(
            error_status(Unimplemented("this method is not implemented yet"))
        )
    log.exception("unhandled error in %s", method, exc_info=exc)
    await context.abort_with_status(internal_status())


class Undecodable:
    """Stands for a request message that could not be parsed (bad wire format, bad UTF-8)."""


UNDECODABLE = Undecodable()


def undecodable_request() -> InvalidArgument:
    return InvalidArgument(
        "request",
        "the request message could not be decoded: it is not a valid protobuf message of this "
        "method's request type (strings must be valid UTF-8)",
        reason="REQUEST_UNDECODABLE",
    )


def tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """A deserializer that returns UNDECODABLE instead of raising.

    grpc.aio answers a deserializer's exception with UNKNOWN and the exception's name; the
    handler turns UNDECODABLE into INVALID_ARGUMENT instead.
    """
    if deserialize is None:
        return None

    def run(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception:
            return UNDECODABLE

    return run


async def decoded(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        if request is UNDECODABLE:
            raise undecodable_request()
        yield request


def handler_parts(handler: grpc.RpcMethodHandler) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The behaviour a handler wraps, and the factory that builds a handler of the same kind."""
    if handler.request_streaming and handler.response_streaming:
        inner, factory = handler.stream_stream, grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        inner, factory = handler.stream_unary, grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        inner, factory = handler.unary_stream, grpc.unary_stream_rpc_method_handler
    else:
        inner, factory = handler.unary_unary, grpc.unary_unary_rpc_method_handler
    return inner, factory


def wrap_handler(
    handler: grpc.RpcMethodHandler,
    method: str,
    before: Callable[[grpc.aio.ServicerContext], Awaitable[None]] | None = None,
) -> grpc.RpcMethodHandler:
    """Runs `before` and turns exceptions into statuses, for all four kinds of handler."""
    inner, factory = handler_parts(handler)

    if handler.response_streaming:

        async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                if before is not None:
                    await before(context)
                if request is UNDECODABLE:
                    raise undecodable_request()
                if handler.request_streaming:
                    request = decoded(request)
                result = inner(request, context)
                if inspect.isasyncgen(result):
                    async for item in result:
                        yield item
                else:
                    await result
            except (grpc.aio.AbortError, GeneratorExit):
                raise
            except Exception as exc:
                await abort_for(context, exc, method)

        behavior: Callable[..., Any] = streaming
    else:

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                if before is not None:
                    await before(context)
                if request is UNDECODABLE:
                    raise undecodable_request()
                if handler.request_streaming:
                    request = decoded(request)
                return await inner(request, context)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await abort_for(context, exc, method)

        behavior = unary

    return factory(
        behavior,
        request_deserializer=tolerant(handler.request_deserializer),
        response_serializer=handler.response_serializer,
    )


def bearer_key(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            scheme, _, token = str(value).partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


class FootnoteInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates every footnote.v1 call and maps errors to google.rpc.Status, in one place."""

    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = details.method
        if handler is None:
            return handler
        if method.startswith(PUBLIC_SERVICE_PREFIXES):
            return wrap_handler(handler, method)

        async def authenticate(context: grpc.aio.ServicerContext) -> None:
            key = bearer_key(context.invocation_metadata())
            if key is None:
                raise Unauthenticated(
                    "missing API key: send the metadata 'authorization: Bearer <key>'",
                    reason="API_KEY_MISSING",
                )
            found = await self.authenticator.authenticate(key)
            if found is None:
                raise Unauthenticated("the API key is not valid", reason="API_KEY_INVALID")
            _principal.set(found)

        return wrap_handler(handler, method, before=authenticate)
