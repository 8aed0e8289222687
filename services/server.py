"""The gRPC server: create_server builds it, main runs it until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import gc
import logging
import resource
import signal
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from footnote.v1 import (
    assistants_service_pb2,
    assistants_service_pb2_grpc,
    chat_service_pb2,
    chat_service_pb2_grpc,
    conversations_service_pb2,
    conversations_service_pb2_grpc,
    documents_service_pb2,
    documents_service_pb2_grpc,
)
from services.assistants.service import AssistantService
from services.assistants.servicer import AssistantsServicer
from services.auth import Authenticator
from services.chat.pipeline import ChatEngine
from services.chat.servicer import ChatServicer
from services.completions import drain_wakeups
from services.config import Settings
from services.conversations.presenter import CitationPresenter
from services.conversations.service import ConversationService
from services.conversations.servicer import ConversationsServicer
from services.db.session import Database, make_engine
from services.documents.links import LinkSigner
from services.documents.service import DocumentService
from services.documents.servicer import DocumentsServicer
from services.evidence.builder import evidence_builder
from services.health import DependencyHealth
from services.http import create_http_app, start_http
from services.llm.base import Generator
from services.llm.factory import create_generator
from services.observability.interceptor import ObservabilityInterceptor
from services.observability.metrics import (
    VECTOR_MEMORY_ASSISTANTS,
    VECTOR_MEMORY_BYTES,
    VECTOR_SEARCHES,
)
from services.observability.tracing import flush_tracing, setup_tracing
from services.ports import free_port
from services.retrieval import search as searching
from services.retrieval.embeddings import create_embedder
from services.rpc import FootnoteInterceptor
from services.storage import Storage
from services.tasks import TaskClient, create_celery

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    assistants_service_pb2.DESCRIPTOR.services_by_name["AssistantsService"].full_name,
    documents_service_pb2.DESCRIPTOR.services_by_name["DocumentsService"].full_name,
    chat_service_pb2.DESCRIPTOR.services_by_name["ChatService"].full_name,
    conversations_service_pb2.DESCRIPTOR.services_by_name["ConversationsService"].full_name,
)
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


@dataclass
class Deps:
    """The domain services and what they share, built once per process."""

    db: Database
    authenticator: Authenticator
    health: HealthServicer
    storage: Storage
    tasks: TaskClient
    generator: Generator
    assistants: AssistantService
    documents: DocumentService
    conversations: ConversationService
    chat: ChatEngine

    @classmethod
    def from_settings(cls, settings: Settings) -> Deps:
        missing = [
            f"FOOTNOTE_{name.upper()}"
            for name in ("database_url", "broker_url", "s3_endpoint")
            if not getattr(settings, name)
        ]
        if missing:
            raise RuntimeError(f"{', '.join(missing)} not set (footnote dev sets them for you)")
        db = Database(make_engine(settings.database_url or ""))
        storage = Storage(
            settings.s3_endpoint or "",
            settings.s3_access_key or "",
            settings.s3_secret_key or "",
            settings.s3_bucket,
            region=settings.s3_region,
        )
        tasks = TaskClient(create_celery(settings))
        public_base_url = (
            settings.public_base_url or f"http://{settings.grpc_host}:{settings.http_port}"
        )
        signer = LinkSigner(tasks, settings.link_timeout_seconds, public_base_url)
        presenter = CitationPresenter(db, signer)
        # The local model loads once the server is serving (ChatEngine.prepare, from serve).
        embedder = create_embedder(
            base_url=settings.embeddings_base_url,
            model=settings.embeddings_model,
            api_key=settings.embeddings_api_key,
            dim=settings.embeddings_dim,
            threads=settings.embedding_threads,
            questions=settings.question_embedding,
        )
        generator = create_generator(settings, embedder=embedder)
        return cls(
            db=db,
            authenticator=Authenticator(db),
            health=HealthServicer(),
            storage=storage,
            tasks=tasks,
            generator=generator,
            assistants=AssistantService(db),
            documents=DocumentService(db, storage, tasks, signer, settings.max_upload_bytes),
            conversations=ConversationService(db, presenter),
            chat=ChatEngine(
                db, embedder, generator, presenter, evidence_builder(settings.evidence_embedder)
            ),
        )

    async def aclose(self) -> None:
        closer = getattr(self.generator, "aclose", None)
        if closer is not None:  # the OpenAI-compatible client keeps a connection pool
            await closer()
        self.close()

    def close(self) -> None:
        self.db.dispose()
        self.tasks.close()


def server_options(settings: Settings) -> list[tuple[str, int]]:
    """The gRPC channel arguments of the server."""
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # gRPC cancels a call left unaccepted this long (default 30 s) with CANCELLED; the
        # client's own deadline still holds.
        ("grpc.server_max_unrequested_time_in_server", settings.grpc_accept_timeout_seconds),
    ]


def create_server(settings: Settings, deps: Deps) -> tuple[grpc.aio.Server, int]:
    """Builds the server and binds its port without starting it; port 0 picks a free port."""
    server = grpc.aio.server(
        # Outermost first: observability sees the final status of every call, refused ones too.
        interceptors=[ObservabilityInterceptor(), FootnoteInterceptor(deps.authenticator)],
        options=server_options(settings),
    )
    assistants_service_pb2_grpc.add_AssistantsServiceServicer_to_server(
        AssistantsServicer(deps.assistants), server
    )
    documents_service_pb2_grpc.add_DocumentsServiceServicer_to_server(
        DocumentsServicer(deps.documents), server
    )
    chat_service_pb2_grpc.add_ChatServiceServicer_to_server(ChatServicer(deps.chat), server)
    conversations_service_pb2_grpc.add_ConversationsServiceServicer_to_server(
        ConversationsServicer(deps.conversations), server
    )
    health_pb2_grpc.add_HealthServicer_to_server(deps.health, server)
    searching.report_vector_searches(lambda path: VECTOR_SEARCHES.labels(path).inc())
    VECTOR_MEMORY_BYTES.set_function(lambda: searching.memory_held()[0])
    VECTOR_MEMORY_ASSISTANTS.set_function(lambda: searching.memory_held()[1])
    reflection.enable_server_reflection(
        (
            *SERVICE_NAMES,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    port = server.add_insecure_port(f"{settings.grpc_host}:{settings.grpc_port}")
    if port == 0:
        raise RuntimeError(f"could not bind {settings.grpc_host}:{settings.grpc_port}")
    return server, port


# A health service name that says only "this process serves": liveness probes ask it, so an
# outage of Postgres, the broker or S3 (which turns "" NOT_SERVING) takes a frontend out of
# rotation without getting it restarted.
LIVENESS_SERVICE = "footnote.liveness"


async def mark_serving(health: HealthServicer) -> None:
    for name in ("", LIVENESS_SERVICE, *SERVICE_NAMES):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)


async def serve(
    settings: Settings, stop: asyncio.Event, ready: asyncio.Future[int] | None = None
) -> None:
    """Serves until stop is set, then drains in-flight calls; ready receives the bound port."""
    raise_open_file_limit()  # before the upstream pool is sized from it
    if settings.http_port == 0:
        # Links name the HTTP port, so it must be known before anything is served.
        settings = settings.model_copy(update={"http_port": free_port(settings.grpc_host)})
    setup_tracing("footnote-server")
    searching.configure(
        ef_search=settings.hnsw_ef_search, vector_memory_mb=settings.vector_memory_mb
    )
    deps = Deps.from_settings(settings)
    await asyncio.to_thread(deps.storage.ensure_bucket)
    server, port = create_server(settings, deps)
    drain_wakeups(asyncio.get_running_loop())
    freeze_startup_objects()
    await server.start()
    http_runner, http_port = await start_http(
        create_http_app(deps),
        settings.grpc_host,
        settings.http_port,
        shutdown_timeout=settings.shutdown_grace_seconds,
    )
    await mark_serving(deps.health)
    # From now on health follows Postgres, the broker and S3.
    checker = DependencyHealth.from_settings(settings, deps.health, SERVICE_NAMES)
    checker.start()
    log.info(
        "serving gRPC on %s:%d, HTTP on %d, on %s's event loop",
        settings.grpc_host,
        port,
        http_port,
        type(asyncio.get_running_loop()).__module__.partition(".")[0],
    )
    # While the server already answers; a question asked meanwhile waits for the model as it
    # would have without this.
    preparing = asyncio.create_task(deps.chat.prepare())
    if ready is not None:
        ready.set_result(port)
    try:
        await stop.wait()
    finally:
        preparing.cancel()  # the load itself runs on in its thread; nothing waits for it
        # Health flips to NOT_SERVING first so balancers stop sending new calls.
        await checker.stop()
        await deps.health.enter_graceful_shutdown()
        await server.stop(settings.shutdown_grace_seconds)
        await http_runner.cleanup()
        await deps.aclose()
        flush_tracing()  # the provider itself shuts down at exit


def raise_open_file_limit() -> None:
    """Lets the process open as many files as its hard limit allows.

    Each streaming answer holds two sockets, the client's and the upstream's, and the upstream
    pool is sized from the soft limit (openai_compat.default_max_connections). At the soft
    limit Linux and systemd give a process by default, 1,024, that was 384 answers at once
    (systemd's default hard limit is 524,288). A process may raise its soft limit up to its
    hard one without privileges, which is what systemd advises programs that need many files.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError):
        log.warning("could not raise the open-file limit from %d to %d", soft, hard)
        return
    log.info("raised the open-file limit from %d to %d", soft, hard)


def freeze_startup_objects() -> None:
    """Keeps what the process made to start (and keeps for life) out of full collections.

    Modules, message descriptors, compiled statements and the services are about 160,000
    objects that the cyclic garbage collector walked in every full collection, with the event
    loop and every thread stopped: 86-97 ms with other work on the cores; four times in 800 unary
    Completes on a busy one, 125-273 ms each. Frozen (`gc.freeze`), they are never walked
    again, and a full collection walks only what requests left behind (13-66 ms there).
    """
    gc.collect()
    gc.freeze()


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


def main(settings: Settings) -> None:
    async def run() -> None:
        stop = asyncio.Event()
        install_stop_signals(stop)
        await serve(settings, stop)

    run_on_configured_loop(settings, run())


def run_on_configured_loop(settings: Settings, work: Coroutine[Any, Any, None]) -> None:
    """Runs work to its end on the event loop the settings name (`footnote serve` and
    `footnote dev` alike), with their thread switch interval."""
    sys.setswitchinterval(settings.thread_switch_interval_ms / 1000)
    with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
        runner.run(work)


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop a server runs on; None is asyncio's default."""
    if name == "uvloop":
        try:
            import uvloop
        except ImportError as err:
            raise RuntimeError(
                "FOOTNOTE_EVENT_LOOP=uvloop (the default) needs the uvloop package;"
                " set FOOTNOTE_EVENT_LOOP=asyncio to run on asyncio's own loop"
            ) from err
        return uvloop.new_event_loop
    return None
