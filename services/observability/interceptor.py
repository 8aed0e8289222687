"""The gRPC server interceptor for operations: a span, metrics and one log line per call.

It sits outside the authentication and error interceptor (services.rpc), so it sees every
call's final status, including calls refused for a missing key.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from services.observability.metrics import RPC_DURATION, RPC_IN_FLIGHT, RPC_REQUESTS
from services.observability.tracing import steps_in, tracer
from services.rpc import handler_parts, principal

log = logging.getLogger("footnote.rpc")

REQUEST_ID_HEADER = "x-request-id"
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Probes call these every few seconds: they are counted but not logged at INFO.
QUIET_SERVICES = ("grpc.health.v1.Health",)
# The codes that mean the server failed (OpenTelemetry's RPC conventions for server spans).
SERVER_ERRORS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


@dataclass(frozen=True)
class Method:
    service: str
    name: str

    @classmethod
    def parse(cls, full: str) -> Method:
        service, _, name = full.lstrip("/").partition("/")
        return cls(service, name)

    @property
    def full(self) -> str:
        return f"{self.service}/{self.name}"


def request_id(metadata: Any) -> str:
    """The caller's x-request-id when it is a sane token, else a new one."""
    for key, value in metadata or ():
        if key == REQUEST_ID_HEADER and isinstance(value, str) and REQUEST_ID.fullmatch(value):
            return value
    return uuid.uuid4().hex


def final_code(context: grpc.aio.ServicerContext, exc: BaseException | None) -> grpc.StatusCode:
    # A client that cancels or goes away ends the handler with CancelledError, or closes a
    # streaming handler's generator early.
    if isinstance(exc, asyncio.CancelledError | GeneratorExit) or context.cancelled():
        return grpc.StatusCode.CANCELLED
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    # An exception that escaped every error boundary becomes UNKNOWN in grpcio.
    return grpc.StatusCode.UNKNOWN if isinstance(exc, Exception) else grpc.StatusCode.OK


def caller_tenant() -> str:
    # Set by the authentication interceptor inside this call's context.
    try:
        return principal().tenant_id
    except LookupError:
        return ""


class ObservabilityInterceptor(grpc.aio.ServerInterceptor):
    """Traces, counts, times and logs every call; changes nothing about how it is answered."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler  # an unknown method: grpcio answers UNIMPLEMENTED itself
        return observed_handler(handler, Method.parse(details.method))


@contextmanager
def observed_call(method: Method, context: grpc.aio.ServicerContext) -> Iterator[trace.Span]:
    """The call's span, metrics and log line, around the whole call.

    The span is not made current here but by the caller, around the handler's own steps
    (`current`, `steps_in`): a streaming handler's generator can be closed early from another
    context (grpcio leaves it, asyncio's finalizer closes it), where detaching a context
    attached in the call's task fails, and OpenTelemetry logs that at ERROR for every such
    call.
    """
    metadata = context.invocation_metadata()
    rid = request_id(metadata)
    parent = propagate.extract(
        {key: value for key, value in metadata or () if isinstance(value, str)}
    )
    began = time.perf_counter()
    in_flight = RPC_IN_FLIGHT.labels(method.service, method.name)
    in_flight.inc()
    span = tracer().start_span(
        method.full,
        context=parent,
        kind=SpanKind.SERVER,
        attributes={
            "rpc.system": "grpc",
            "rpc.service": method.service,
            "rpc.method": method.name,
            "footnote.request_id": rid,
        },
    )
    failure: BaseException | None = None
    try:
        yield span
    except BaseException as exc:
        failure = exc
        raise
    finally:
        in_flight.dec()
        with current(span):  # the log line carries the call's trace
            finish(method, context, span, rid, time.perf_counter() - began, failure)
        span.end()


def current(span: trace.Span) -> AbstractContextManager[trace.Span]:
    """The span made current for a stretch of the handler's work that never yields."""
    return trace.use_span(
        span, end_on_exit=False, record_exception=False, set_status_on_exception=False
    )


def finish(
    method: Method,
    context: grpc.aio.ServicerContext,
    span: trace.Span,
    rid: str,
    seconds: float,
    failure: BaseException | None,
) -> None:
    code = final_code(context, failure)
    tenant = caller_tenant()
    RPC_REQUESTS.labels(method.service, method.name, code.name).inc()
    RPC_DURATION.labels(method.service, method.name, code.name).observe(seconds)
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if tenant:
        span.set_attribute("footnote.tenant", tenant)
    if code in SERVER_ERRORS:
        span.set_status(Status(StatusCode.ERROR, code.name))
    if code in SERVER_ERRORS:
        level = logging.WARNING
    elif method.service in QUIET_SERVICES:
        level = logging.DEBUG
    else:
        level = logging.INFO
    log.log(
        level,
        "rpc %s %s %.1fms",
        method.full,
        code.name,
        seconds * 1000,
        extra={
            "event": "rpc",
            "method": method.full,
            "code": code.name,
            "duration_seconds": round(seconds, 6),
            "tenant": tenant,
            "request_id": rid,
        },
    )


def observed_handler(handler: grpc.RpcMethodHandler, method: Method) -> grpc.RpcMethodHandler:
    """The same handler, run inside observed_call, for all four kinds of RPC."""
    inner, factory = handler_parts(handler)

    if handler.response_streaming:

        async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            with observed_call(method, context) as span:
                with current(span):
                    result = inner(request, context)
                if inspect.isasyncgen(result):
                    async for item in steps_in(trace.set_span_in_context(span), result):
                        yield item
                elif inspect.isawaitable(result):
                    with current(span):
                        await result  # a handler that writes with context.write()

        behavior: Callable[..., Any] = streaming
    else:

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            with observed_call(method, context) as span, current(span):
                return await inner(request, context)

        behavior = unary

    return factory(
        behavior,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
