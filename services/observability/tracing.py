"""OpenTelemetry: the process's tracer provider, Celery and httpx instrumentation, span helpers.

A call's or task's span is always made, so every log line carries the trace id of the call or
task it belongs to. Spans leave the process only when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set: then a batch processor sends them over OTLP
http/protobuf. Without one, no exporter and no export thread exist, spans record nothing
unless their caller sampled the trace (`WhileExported`), and the helpers below make no spans
inside one that records nothing (`unrecorded_here`). `OTEL_SDK_DISABLED=true` turns tracing
off altogether.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, Sampler, SamplingResult
from opentelemetry.trace import Status, StatusCode

log = logging.getLogger(__name__)
T = TypeVar("T")

TRACER_NAME = "footnote"
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")

_lock = threading.Lock()
_provider: TracerProvider | None = None
_tracer = trace.get_tracer(TRACER_NAME)


def tracer() -> trace.Tracer:
    """Footnote's tracer; a no-op until setup_tracing installs a provider."""
    return _tracer


# While nothing is exported: a call whose caller sampled its trace keeps it sampled, so the
# services it calls (an upstream model server that exports) still record their part; any
# other span is not recorded.
UNEXPORTED = ParentBased(root=ALWAYS_OFF)


class WhileExported(Sampler):
    """The configured sampler while spans go somewhere, and UNEXPORTED while none do.

    A span that is not recorded still has its ids, so log lines keep their trace id, but it
    keeps no attributes or events and no processor sees it: a recorded span cost about three
    times as much to start and end, eight of them a unary Complete, on the event loop.
    """

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler
        self.exported = False

    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        chosen = self.sampler if self.exported else UNEXPORTED
        return chosen.should_sample(*args, **kwargs)

    def get_description(self) -> str:
        return f"WhileExported{{{self.sampler.get_description()}}}"


def otlp_endpoint() -> str | None:
    for name in ENDPOINT_VARIABLES:
        if value := os.environ.get(name, "").strip():
            return value
    return None


def tracing_disabled() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def setup_tracing(
    service_name: str, *, exporter: SpanExporter | None = None
) -> TracerProvider | None:
    """Installs this process's tracer provider and instrumentation, once.

    exporter: spans also go there, synchronously (tests pass an in-memory exporter).
    """
    global _provider
    with _lock:
        if _provider is not None:
            if exporter is not None:
                export(_provider, SimpleSpanProcessor(exporter))
            return _provider
        if tracing_disabled():
            return None
        attributes: dict[str, Any] = {}
        if not os.environ.get("OTEL_SERVICE_NAME"):
            attributes[SERVICE_NAME] = service_name
        provider = TracerProvider(resource=Resource.create(attributes))
        # Before any tracer is made: each takes the provider's sampler when it is made.
        provider.sampler = WhileExported(provider.sampler)
        if exporter is not None:
            export(provider, SimpleSpanProcessor(exporter))
        if (endpoint := otlp_endpoint()) is not None:
            export(provider, BatchSpanProcessor(otlp_exporter()))
            log.info("exporting traces over OTLP to %s", endpoint)
        trace.set_tracer_provider(provider)
        instrument_libraries(provider)
        _provider = provider
        return provider


def export(provider: TracerProvider, processor: SpanProcessor) -> None:
    """Sends the provider's spans to processor too, recording them from now on."""
    provider.add_span_processor(processor)
    if isinstance(provider.sampler, WhileExported):
        provider.sampler.exported = True


def otlp_exporter() -> SpanExporter:
    # Only http/protobuf is installed; the exporter reads the other OTEL_EXPORTER_OTLP_* itself.
    for name in PROTOCOL_VARIABLES:
        protocol = os.environ.get(name, "").strip()
        if protocol and protocol != "http/protobuf":
            log.warning("%s=%s is not supported; sending http/protobuf", name, protocol)
            break
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def instrument_libraries(provider: TracerProvider) -> None:
    """Celery: context in task headers and a span per publish and run; aiohttp (the LLM) and
    httpx (an embedding server): a span per upstream call, its context in the headers."""
    from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    CeleryInstrumentor().instrument(tracer_provider=provider)
    AioHttpClientInstrumentor().instrument(tracer_provider=provider)
    HTTPXClientInstrumentor().instrument(tracer_provider=provider)


def flush_tracing(timeout_millis: int = 5000) -> None:
    """Sends what the batch processor still holds (a pool process exits without atexit)."""
    if _provider is not None:
        _provider.force_flush(timeout_millis)


def shutdown_tracing() -> None:
    if _provider is not None:
        _provider.shutdown()


def mark_failed(span: trace.Span, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))


def unrecorded_here() -> bool:
    """Whether a span started here would be one that nothing records: this process's provider
    exports nothing, and the current span, whose trace id log lines carry, is not recorded
    (its caller did not sample the trace). Such a span's only trace is a new span id in the
    log lines written inside it, which no exported span has; starting and ending it cost 15-20
    us on the event loop, six of them in an answer (and a context switch per streamed
    delta), so the helpers below leave it out and work runs in the current span."""
    sampler = _provider.sampler if _provider is not None else None
    if not isinstance(sampler, WhileExported) or sampler.exported:
        return False
    current = trace.get_current_span()
    return current.get_span_context().is_valid and not current.is_recording()


async def traced(name: str, work: Awaitable[T], attributes: Mapping[str, Any] | None = None) -> T:
    """Awaits work inside a span (unless unrecorded_here); threads it starts with
    asyncio.to_thread inherit the span."""
    if unrecorded_here():
        return await work
    with tracer().start_as_current_span(name, attributes=attributes):
        return await work


async def steps_in(context: otel_context.Context, source: AsyncIterator[T]) -> AsyncIterator[T]:
    """source's items, each step of source run with context attached, never across a yield.

    A generator that held a context attached across its yields could be closed early from
    another context (a consumer that stops, asyncio's finalizer), where detaching fails and
    OpenTelemetry logs an ERROR; this one has nothing attached while it waits.
    """
    while True:
        token = otel_context.attach(context)
        try:
            item = await anext(source)
        except StopAsyncIteration:
            return
        finally:
            otel_context.detach(token)
        yield item


def traced_stream(
    name: str,
    events: AsyncIterator[T],
    attributes: Mapping[str, Any] | None = None,
    *,
    first_event: str | None = None,
) -> AsyncIterator[T]:
    """Passes events through, each step of the source running inside one span; the source
    itself where unrecorded_here.

    The span is current only while the source runs, never across a yield, so the consumer's
    own work between events is not attributed to it. With first_event, the span gets an event
    of that name when the source's first event arrives.
    """
    if unrecorded_here():
        return events
    return _traced_stream(name, events, attributes, first_event)


async def _traced_stream(
    name: str,
    events: AsyncIterator[T],
    attributes: Mapping[str, Any] | None,
    first_event: str | None,
) -> AsyncIterator[T]:
    span = tracer().start_span(name, attributes=attributes)
    current = trace.set_span_in_context(span)
    try:
        async for event in steps_in(current, events):
            if first_event is not None:
                span.add_event(first_event)
                first_event = None
            yield event
    except (GeneratorExit, asyncio.CancelledError):
        raise  # closed early by the consumer: not a failure of this step
    except BaseException as exc:
        mark_failed(span, exc)
        raise
    finally:
        close = getattr(events, "aclose", None)
        try:
            if close is not None:
                token = otel_context.attach(current)
                try:
                    await close()
                finally:
                    otel_context.detach(token)
        finally:
            span.end()
