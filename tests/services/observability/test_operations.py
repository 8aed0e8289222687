"""Metrics, traces and logs of a real stack: a server in this process, a worker of its own.

The worker has its own broker (so the session's worker cannot take its tasks), sends its spans
over OTLP to a receiver that this module runs, serves its pool's metrics on a port, and logs
JSON to a file. The server in this process records its spans in the SDK's in-memory exporter.
One upload and one streamed chat feed every test.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import json
import logging
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from devstack.stack import EmbeddedStack
from footnote.v1 import assistants_service_pb2 as apb
from footnote.v1 import assistants_service_pb2_grpc as apb_grpc
from footnote.v1 import chat_service_pb2 as cpb
from footnote.v1 import chat_service_pb2_grpc as cpb_grpc
from footnote.v1 import documents_service_pb2 as dpb
from footnote.v1 import documents_service_pb2_grpc as dpb_grpc
from services.config import Settings
from services.http import create_http_app, start_http
from services.observability.logs import JsonLines, Redactor
from services.observability.tracing import setup_tracing
from services.ports import free_port
from services.retrieval import search as searching
from services.server import Deps, create_server, mark_serving
from tests.conftest import kill_group, start_worker, wait_worker_ready, worker_env
from tests.support import bearer, upload, watch

# Text that appears in the document and nowhere else: it must never reach a log line.
SECRET_SENTENCE = "The vault code for the Zanzibar office is amber-falcon-4471."
OPENING_HOURS = "The Zanzibar office opens at nine and closes at five."
DOCUMENT = f"# Offices\n\n{OPENING_HOURS}\n\n{SECRET_SENTENCE}\n".encode()
ANSWER = ["The Zanzibar office opens ", "at nine [1]."]
STAGES = ("claim", "download", "parse", "chunk", "embed", "index")


@dataclass
class Receiver:
    """An OTLP/HTTP trace receiver: what the worker's exporter sends, decoded."""

    spans: list[dict] = field(default_factory=list)

    async def traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        export = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        for resource_spans in export.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}.get(
                "service.name"
            )
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.spans.append(
                        {
                            "service": service,
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_id": span.parent_span_id.hex(),
                        }
                    )
        return web.Response(
            body=trace_service_pb2.ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    def named(self, name: str, trace_id: str) -> list[dict]:
        return [s for s in self.spans if s["name"] == name and s["trace_id"] == trace_id]


@contextlib.asynccontextmanager
async def serve_app(app: web.Application) -> AsyncIterator[str]:
    runner, port = await start_http(app, "127.0.0.1", 0, shutdown_timeout=1.0)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def completions(request: web.Request) -> web.StreamResponse:
    """A scripted OpenAI-compatible upstream; a question of 'fail' gets an HTTP 500."""
    body = await request.json()
    if body["messages"][-1]["content"].startswith("fail"):
        return web.json_response({"error": {"message": "boom"}}, status=500)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for piece in ANSWER:
        chunk = {"choices": [{"index": 0, "delta": {"content": piece}}]}
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    await response.write(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode())
    return response


@pytest.fixture(scope="module")
def memory() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    setup_tracing("footnote-server", exporter=exporter)
    return exporter


@pytest.fixture(scope="module")
def server_log() -> Iterator[io.StringIO]:
    """Every record of this process during the module, as the server writes it in JSON mode."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLines(Redactor()))
    root = logging.getLogger()
    previous = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield stream
    root.removeHandler(handler)
    root.setLevel(previous)


@pytest.fixture(scope="module")
def broker(settings: Settings) -> Iterator[str]:
    state = Path(tempfile.mkdtemp(prefix="fno", dir="/tmp"))
    stack = EmbeddedStack(
        state,
        database_url=settings.database_url,
        s3_endpoint=settings.s3_endpoint,
        s3_access_key=settings.s3_access_key,
        s3_secret_key=settings.s3_secret_key,
        s3_bucket=settings.s3_bucket,
    )
    with stack:
        yield stack.endpoints.broker_url
    shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    found = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", found.traces)
    async with serve_app(app) as url:
        yield found, url


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    log: Path
    metrics_url: str


@pytest.fixture(scope="module")
def worker_process(settings, broker, receiver, tmp_path_factory) -> Iterator[Worker]:
    _, otlp_url = receiver
    port = free_port()
    log = tmp_path_factory.mktemp("ops") / "worker.log"
    env = worker_env(
        settings,
        FOOTNOTE_BROKER_URL=broker,
        FOOTNOTE_LOG_FORMAT="json",
        FOOTNOTE_WORKER_METRICS_PORT=str(port),
        OTEL_EXPORTER_OTLP_ENDPOINT=otlp_url,
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = start_worker(env, log)
    try:
        wait_worker_ready(broker)
        yield Worker(proc, log, f"http://127.0.0.1:{port}/metrics")
    finally:
        kill_group(proc)


@dataclass
class Stack:
    target: str
    http: str


@pytest.fixture(scope="module")
async def stack(settings, broker, memory, server_log, worker_process) -> AsyncIterator[Stack]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    async with serve_app(app) as upstream:
        configured = settings.model_copy(
            update={"broker_url": broker, "llm_base_url": f"{upstream}/v1", "llm_model": "s"}
        )
        deps = Deps.from_settings(configured)
        server, port = create_server(configured, deps)
        # As `serve` does: assistants' vectors may be held in memory.
        ef_search = searching.EF_SEARCH
        searching.configure(ef_search=ef_search, vector_memory_mb=configured.vector_memory_mb)
        await server.start()
        await mark_serving(deps.health)
        try:
            async with serve_app(create_http_app(deps)) as http:
                yield Stack(f"127.0.0.1:{port}", http)
        finally:
            await server.stop(1.0)
            await deps.aclose()
            searching.configure(ef_search=ef_search)


@dataclass
class Exchange:
    key: str
    document: dpb.Document
    complete: cpb.CompleteResponse


@pytest.fixture(scope="module")
async def exchange(stack: Stack, make_key, memory) -> Exchange:
    """One upload to READY and one streamed answer with PUBLIC (worker-signed) links."""
    key = make_key(f"t-{uuid.uuid4().hex[:12]}")
    memory.clear()
    async with grpc.aio.insecure_channel(stack.target) as channel:
        assistant = await apb_grpc.AssistantsServiceStub(channel).CreateAssistant(
            apb.CreateAssistantRequest(
                assistant=apb.Assistant(
                    display_name="ops",
                    settings=apb.AssistantSettings(
                        enable_retrieval_gate=False,
                        citation_link_mode=apb.CITATION_LINK_MODE_PUBLIC,
                    ),
                )
            ),
            metadata=bearer(key),
        )
        docs = dpb_grpc.DocumentsServiceStub(channel)
        doc = await upload(docs, key, assistant.id, "offices.md", DOCUMENT)
        final = (await watch(docs, key, doc.id))[-1]
        assert final.state == dpb.DOCUMENT_STATE_READY, final.error
        chat = cpb_grpc.ChatServiceStub(channel)
        events = [
            e
            async for e in chat.StreamComplete(
                cpb.CompleteRequest(
                    assistant_id=assistant.id,
                    messages=[cpb.ChatMessage(role=cpb.ROLE_USER, content="When does it open?")],
                ),
                metadata=(*bearer(key), ("x-request-id", "req-ops-1")),
            )
        ]
        with pytest.raises(grpc.aio.AioRpcError):
            await chat.Complete(
                cpb.CompleteRequest(
                    assistant_id=assistant.id,
                    messages=[cpb.ChatMessage(role=cpb.ROLE_USER, content="fail please")],
                ),
                metadata=bearer(key),
            )
    complete = events[-1].complete
    assert complete.citations.sources[0].download_url.startswith("http")
    return Exchange(key, final, complete)


def server_spans(memory: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in memory.get_finished_spans() if s.name == name]


def one_server_span(memory: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = server_spans(memory, name)
    assert len(found) == 1, [s.name for s in memory.get_finished_spans()]
    return found[0]


def children(memory: InMemorySpanExporter, parent: ReadableSpan, name: str) -> list[ReadableSpan]:
    return [
        s
        for s in server_spans(memory, name)
        if s.parent is not None and s.parent.span_id == parent.context.span_id
    ]


async def wait_for_spans(receiver: Receiver, predicate, what: str, timeout: float = 30.0):
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if found := predicate():
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"the worker never exported {what}: {receiver.spans}")


async def test_one_trace_runs_from_upload_through_the_ingest_task_to_ready(
    exchange, memory, receiver
):
    found, _ = receiver
    rpc = one_server_span(memory, "footnote.v1.DocumentsService/UploadDocument")
    trace_id = f"{rpc.context.trace_id:032x}"
    assert rpc.attributes["rpc.grpc.status_code"] == 0
    # The task is published inside the call, and its headers carry the trace.
    [publish] = [
        s
        for s in server_spans(memory, "apply_async/documents.ingest")
        if s.context.trace_id == rpc.context.trace_id
    ]
    assert publish.parent.span_id == rpc.context.span_id
    run = await wait_for_spans(
        found, lambda: found.named("run/documents.ingest", trace_id), "the ingest task's span"
    )
    assert run[0]["parent_id"] == f"{publish.context.span_id:016x}"
    assert run[0]["service"] == "footnote-worker"

    def stages():
        spans = [found.named(f"ingest.{stage}", trace_id) for stage in STAGES]
        return spans if all(spans) else None

    for [stage] in await wait_for_spans(found, stages, "every ingest stage"):
        assert stage["parent_id"] == run[0]["span_id"]


async def test_one_trace_runs_from_stream_complete_through_retrieval_llm_and_link_signing(
    exchange, memory, receiver
):
    found, _ = receiver
    rpc = one_server_span(memory, "footnote.v1.ChatService/StreamComplete")
    assert rpc.attributes["footnote.request_id"] == "req-ops-1"
    [retrieve] = children(memory, rpc, "chat.retrieve")
    [load] = children(memory, rpc, "chat.load")
    [embed] = children(memory, rpc, "retrieval.embed_questions")
    assert embed.attributes["footnote.batch_size"] == 1
    assert embed.end_time <= retrieve.end_time and load.end_time <= retrieve.end_time
    # The search's two queries: inside the retrieval, or beside it when started early.
    [vector] = children(memory, retrieve, "retrieval.vector") or children(
        memory, rpc, "retrieval.vector"
    )
    [text] = children(memory, retrieve, "retrieval.text") or children(memory, rpc, "retrieval.text")
    assert embed.end_time <= vector.start_time
    assert vector.end_time <= retrieve.end_time and text.end_time <= retrieve.end_time
    [generate] = children(memory, rpc, "chat.generate")
    # The answer's start, step by step: the model's first text, then the first delta sent.
    [first_token] = [e for e in generate.events if e.name == "footnote.first_token"]
    [first_delta] = [e for e in rpc.events if e.name == "footnote.first_delta"]
    assert retrieve.end_time <= generate.start_time <= first_token.timestamp
    assert first_token.timestamp <= first_delta.timestamp
    # The upstream LLM request itself, with the trace passed on in its headers.
    [post] = [s for s in memory.get_finished_spans() if s.parent == generate.context]
    assert post.attributes.get("http.method", post.attributes.get("http.request.method")) == "POST"
    [present] = children(memory, rpc, "chat.present_citations")
    [sign] = children(memory, present, "apply_async/links.presign")
    trace_id = f"{rpc.context.trace_id:032x}"
    signed = await wait_for_spans(
        found, lambda: found.named("run/links.presign", trace_id), "the presign task's span"
    )
    assert signed[0]["parent_id"] == f"{sign.context.span_id:016x}"


async def test_a_failed_call_is_traced_with_its_status(exchange, memory):
    [failed] = server_spans(memory, "footnote.v1.ChatService/Complete")
    assert failed.attributes["rpc.grpc.status_code"] == grpc.StatusCode.UNAVAILABLE.value[0]
    assert failed.status.status_code.name == "ERROR"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(scraped: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in scraped, f"{name}{labels} is not exposed"
    return scraped[key]


async def test_the_server_exposes_every_series_after_an_upload_and_a_chat(stack, exchange):
    async with httpx.AsyncClient() as client:
        response = await client.get(f"{stack.http}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    scraped = samples(response.text)
    docs = {"service": "footnote.v1.DocumentsService", "method": "UploadDocument", "code": "OK"}
    assert value(scraped, "footnote_rpc_requests_total", **docs) >= 1
    assert value(scraped, "footnote_rpc_duration_seconds_count", **docs) >= 1
    assert value(scraped, "footnote_rpc_duration_seconds_bucket", le="+Inf", **docs) >= 1
    chat = {"service": "footnote.v1.ChatService", "method": "Complete", "code": "UNAVAILABLE"}
    assert value(scraped, "footnote_rpc_requests_total", **chat) >= 1
    assert value(scraped, "footnote_chat_time_to_first_delta_seconds_count") >= 1
    assert value(scraped, "footnote_chat_deltas_per_stream_count") >= 1
    assert value(scraped, "footnote_chat_deltas_per_stream_sum") >= 1
    assert value(scraped, "footnote_retrieval_duration_seconds_count") >= 2
    # Both of the exchange's searches went to Postgres: the second started the load of the
    # assistant's vectors (a small assistant is held from its second question).
    assert value(scraped, "footnote_vector_searches_total", path="exact") >= 2
    async with httpx.AsyncClient() as client:
        for _ in range(100):
            held = samples((await client.get(f"{stack.http}/metrics")).text)
            if value(held, "footnote_vector_memory_assistants") >= 1:
                break
            await asyncio.sleep(0.1)
    assert value(held, "footnote_vector_memory_assistants") >= 1
    assert value(held, "footnote_vector_memory_bytes") > 0
    assert value(scraped, "footnote_llm_time_to_first_token_seconds_count") >= 1
    assert value(scraped, "footnote_llm_errors_total", reason="LLM_UNAVAILABLE") >= 1
    assert value(scraped, "footnote_documents", state="READY") >= 1
    for queue in ("ingest", "links"):
        assert value(scraped, "footnote_queue_messages", queue=queue) >= 0
    for collector in ("queue_depth", "documents"):
        assert value(scraped, "footnote_scrape_collector_success", collector=collector) == 1
    # No label value is an id: no document, assistant or tenant id appears anywhere.
    assert exchange.document.id not in response.text
    assert exchange.document.assistant_id not in response.text


async def test_openmetrics_is_served_to_a_scraper_that_asks_for_it(stack, exchange):
    async with httpx.AsyncClient() as client:
        response = await client.get(
            f"{stack.http}/metrics", headers={"Accept": "application/openmetrics-text"}
        )
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.rstrip().endswith("# EOF")


async def test_the_worker_exposes_its_pool_series(worker_process, exchange):
    async with httpx.AsyncClient() as client:
        response = await client.get(worker_process.metrics_url)
    assert response.status_code == 200
    scraped = samples(response.text)
    ingest = {"task": "documents.ingest", "outcome": "success"}
    assert value(scraped, "footnote_task_duration_seconds_count", **ingest) >= 1
    presign = {"task": "links.presign", "outcome": "success"}
    assert value(scraped, "footnote_task_duration_seconds_count", **presign) >= 1
    for stage in STAGES:
        labels = {"stage": stage, "outcome": "ok"}
        assert value(scraped, "footnote_ingest_stage_duration_seconds_count", **labels) >= 1
    assert value(scraped, "footnote_ingest_documents_total", outcome="ready") >= 1
    # The server's series are not the worker's to expose.
    assert "footnote_rpc_requests_total" not in response.text


def json_lines(text: str) -> list[dict]:
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines
    return [json.loads(line) for line in lines]  # fails the test on any non-JSON line


async def test_the_server_logs_one_json_line_per_rpc_without_secrets(exchange, server_log, memory):
    text = server_log.getvalue()
    records = json_lines(text)
    rpcs = [r for r in records if r.get("event") == "rpc"]
    upload_rpc = one_server_span(memory, "footnote.v1.DocumentsService/UploadDocument")
    [up] = [r for r in rpcs if r["method"] == "footnote.v1.DocumentsService/UploadDocument"]
    assert up["code"] == "OK" and up["duration_seconds"] > 0
    assert up["tenant"].startswith("t-") and up["request_id"]
    assert up["trace_id"] == f"{upload_rpc.context.trace_id:032x}"
    [stream] = [r for r in rpcs if r["method"] == "footnote.v1.ChatService/StreamComplete"]
    assert stream["request_id"] == "req-ops-1"
    [failed] = [r for r in rpcs if r["method"] == "footnote.v1.ChatService/Complete"]
    assert failed["code"] == "UNAVAILABLE" and failed["level"] == "WARNING"
    assert exchange.key not in text
    assert SECRET_SENTENCE not in text and "amber-falcon" not in text


async def test_refused_calls_are_counted_and_logged(stack, server_log):
    async with grpc.aio.insecure_channel(stack.target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await apb_grpc.AssistantsServiceStub(channel).ListAssistants(
                apb.ListAssistantsRequest()
            )
    assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
    refused = [
        r
        for r in json_lines(server_log.getvalue())
        if r.get("method") == "footnote.v1.AssistantsService/ListAssistants"
    ]
    assert refused[-1]["code"] == "UNAUTHENTICATED" and refused[-1]["tenant"] == ""


async def test_every_worker_line_is_json_with_task_lines_and_no_secrets(
    worker_process, exchange, memory
):
    # Stopping the worker adds its shutdown lines, which must be JSON as well.
    kill_group(worker_process.proc)
    text = worker_process.log.read_text()
    records = json_lines(text)
    upload_rpc = one_server_span(memory, "footnote.v1.DocumentsService/UploadDocument")
    tasks = [r for r in records if r.get("event") == "task" and r["task"] == "documents.ingest"]
    mine = [r for r in tasks if r.get("document_id") == exchange.document.id]
    assert mine and mine[-1]["outcome"] == "success" and mine[-1]["duration_seconds"] > 0
    assert mine[-1]["trace_id"] == f"{upload_rpc.context.trace_id:032x}"
    assert any(r["logger"].startswith("celery") for r in records)
    assert any("shutdown" in r["message"].lower() for r in records)
    assert exchange.key not in text
    assert SECRET_SENTENCE not in text and "amber-falcon" not in text
    assert "X-Amz-Signature" not in text


async def test_a_callers_trace_context_is_continued(stack, exchange, memory):
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    async with grpc.aio.insecure_channel(stack.target) as channel:
        await apb_grpc.AssistantsServiceStub(channel).ListAssistants(
            apb.ListAssistantsRequest(),
            metadata=(*bearer(exchange.key), ("traceparent", f"00-{trace_id}-{parent_id}-01")),
        )
    [span] = [
        s
        for s in server_spans(memory, "footnote.v1.AssistantsService/ListAssistants")
        if f"{s.context.trace_id:032x}" == trace_id
    ]
    assert f"{span.parent.span_id:016x}" == parent_id and span.parent.is_remote
    assert span.kind.name == "SERVER"
