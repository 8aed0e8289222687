"""Tracing setup and the span helpers, without a stack."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import subprocess
import sys

import grpc
import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from services.observability import tracing

PROBE = """
import json, os, threading
from services.observability.tracing import setup_tracing
provider = setup_tracing("probe")
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
with trace.get_tracer("p").start_as_current_span("s") as span:
    valid = span.get_span_context().is_valid
    recording = span.is_recording()
# A call whose caller sampled its trace, and what it passes on to the services it calls.
sampled = extract({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
with trace.get_tracer("p").start_as_current_span("call", context=sampled):
    carrier = {}
    inject(carrier)
print(json.dumps({
    "installed": provider is not None,
    "processors": 0 if provider is None else len(provider._active_span_processor._span_processors),
    "threads": sorted(t.name for t in threading.enumerate()),
    "valid_span": valid,
    "recording": recording,
    "passed_on": carrier.get("traceparent", ""),
}))
"""


def probe(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        check=True,
        env={**clean, "PYTHONPATH": os.getcwd(), **env},
    ).stdout
    return json.loads(out.splitlines()[-1])


def test_without_an_endpoint_spans_exist_but_nothing_exports():
    got = probe()
    assert got["installed"] and got["valid_span"]
    assert got["processors"] == 0
    assert got["threads"] == ["MainThread"]
    assert not got["recording"]  # with nowhere to go, a span keeps nothing
    # ... but a trace the caller sampled stays sampled for the services this one calls.
    trace_id, sampled = got["passed_on"].split("-")[1::2]
    assert trace_id == "0af7651916cd43dd8448eb211c80319c" and sampled == "01"


def test_an_endpoint_starts_the_otlp_batch_exporter():
    # Port 9 (discard) on loopback: nothing is sent before the probe exits.
    got = probe(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_BSP_SCHEDULE_DELAY="60000")
    assert got["processors"] == 1
    assert any("OtelBatch" in name for name in got["threads"]), got["threads"]
    assert got["recording"]


def test_the_sdk_can_be_switched_off():
    got = probe(OTEL_SDK_DISABLED="true")
    assert not got["installed"] and not got["valid_span"]


@pytest.fixture
def exporter(monkeypatch) -> InMemorySpanExporter:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("footnote"))
    return memory


async def source(fail: bool = False):
    for i in range(3):
        # Only the source's own work runs inside the span.
        yield i, trace.get_current_span().get_span_context().span_id
        await asyncio.sleep(0)
    if fail:
        raise RuntimeError("upstream broke")


async def test_a_traced_stream_is_current_only_while_the_source_runs(exporter):
    outside = []
    async for _, inner_span_id in tracing.traced_stream("gen", source()):
        outside.append(trace.get_current_span().get_span_context().span_id)
        assert inner_span_id != outside[-1]
    [span] = exporter.get_finished_spans()
    assert span.name == "gen" and span.status.status_code is StatusCode.UNSET


async def test_a_failing_source_marks_the_span(exporter):
    with pytest.raises(RuntimeError):
        async for _ in tracing.traced_stream("gen", source(fail=True)):
            pass
    [span] = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.events[0].name == "exception"


async def test_closing_early_ends_the_span_and_the_source(exporter):
    closed = asyncio.Event()

    async def endless():
        try:
            while True:
                yield 1
                await asyncio.sleep(0)
        finally:
            closed.set()

    stream = tracing.traced_stream("gen", endless())
    await anext(stream)
    await stream.aclose()
    assert closed.is_set()
    [span] = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.UNSET


async def test_traced_work_is_the_parent_of_threads_it_starts(exporter):
    def in_thread() -> int:
        return trace.get_current_span().get_span_context().span_id

    span_id = await tracing.traced("work", asyncio.to_thread(in_thread))
    [span] = exporter.get_finished_spans()
    assert span.context.span_id == span_id


class StreamContext:
    """What the interceptor reads of a grpc.aio.ServicerContext."""

    def invocation_metadata(self):
        return (("x-request-id", "closed-early"),)

    def cancelled(self) -> bool:
        return False

    def code(self):
        return None


async def test_a_stream_closed_early_from_another_context_ends_its_span_quietly(exporter, caplog):
    # grpcio can leave a streaming handler's generator unfinished (the client went away after
    # the last message it wanted); asyncio's finalizer then closes it from another context.
    from services.observability.interceptor import Method, observed_handler

    async def answer(request, context):
        for i in range(3):
            yield f"event {i}"

    handler = observed_handler(
        grpc.unary_stream_rpc_method_handler(answer), Method.parse("/footnote.v1.Chat/Stream")
    )
    stream = handler.unary_stream(None, StreamContext())

    async def read_first() -> str:
        return await anext(stream)

    assert await asyncio.create_task(read_first()) == "event 0"  # attached in that task
    with caplog.at_level(logging.ERROR):
        await asyncio.create_task(stream.aclose(), context=contextvars.Context())
    assert "Failed to detach context" not in caplog.text
    [span] = exporter.get_finished_spans()
    assert span.name == "footnote.v1.Chat/Stream"
    assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.CANCELLED.value[0]
    assert span.attributes["footnote.request_id"] == "closed-early"


@pytest.fixture
def unexported(monkeypatch) -> TracerProvider:
    """A provider set up as the server's is with no endpoint: nothing exported."""
    provider = TracerProvider()
    provider.sampler = tracing.WhileExported(provider.sampler)
    monkeypatch.setattr(tracing, "_provider", provider)
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("footnote"))
    return provider


async def current_span_id() -> int:
    return trace.get_current_span().get_span_context().span_id


async def test_unsampled_work_runs_in_its_calls_span(unexported):
    # A span nothing would record is not started: the work's log lines keep the call's ids.
    with unexported.get_tracer("t").start_as_current_span("call") as call:
        assert call.get_span_context().is_valid and not call.is_recording()
        assert await tracing.traced("work", current_span_id()) == call.get_span_context().span_id
        streamed = [span_id async for _, span_id in tracing.traced_stream("gen", source())]
        assert streamed == [call.get_span_context().span_id] * 3


async def test_a_sampled_call_still_gets_its_child_spans(unexported):
    sampled = propagate.extract(
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    )
    with unexported.get_tracer("t").start_as_current_span("call", context=sampled) as call:
        assert call.is_recording()
        assert await tracing.traced("work", current_span_id()) != call.get_span_context().span_id
        streamed = {span_id async for _, span_id in tracing.traced_stream("gen", source())}
        assert len(streamed) == 1 and call.get_span_context().span_id not in streamed


async def test_work_outside_any_call_gets_a_span_of_its_own(unexported):
    # Its log lines then carry a trace id, which running in no span would lose.
    assert await tracing.traced("work", current_span_id()) != 0
