"""The HTTP side port: authenticated document downloads streamed from S3, Prometheus metrics,
and a liveness probe."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING
from urllib.parse import quote

from aiohttp import hdrs, web

from services.documents.domain import DocumentRecord
from services.errors import InvalidArgument, NotFound, Unavailable
from services.observability.collectors import (
    DocumentStateCollector,
    QueueDepthCollector,
    ScrapeRegistry,
    exposition,
)
from services.rpc import DEPENDENCY_ERRORS, bearer_key
from services.storage import ObjectMissing

if TYPE_CHECKING:
    # Only for typing: services.server imports this module to serve it next to gRPC.
    from services.server import Deps

log = logging.getLogger(__name__)

DEPS: web.AppKey[Deps] = web.AppKey("deps")
METRICS: web.AppKey[ScrapeRegistry] = web.AppKey("metrics")
DOWNLOAD_PATH = "/v1/documents/{id}/download"

# One body for unknown, malformed, deleted and other tenants' ids, so none of them leaks.
NOT_FOUND_MESSAGE = "document not found"
UNAVAILABLE_MESSAGE = "a service this download depends on is unavailable; retry"
# Declared types come from the uploader; anything that is not a plain media type is not echoed.
MEDIA_TYPE = re.compile(r"[\w!#$&^.+-]+/[\w!#$&^.+-]+(?:\s*;[ -~]*)?", re.ASCII)
UNSAFE_FALLBACK_CHARS = re.compile(r"[^\w .,()+=@~-]", re.ASCII)
CANONICAL_CODES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    413: "RESOURCE_EXHAUSTED",
    429: "RESOURCE_EXHAUSTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def describe(exc: BaseException) -> str:
    # Our own messages are written to be shown; a driver's may carry connection details.
    return exc.message if isinstance(exc, Unavailable) else type(exc).__name__


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response(
        {"error": {"code": code, "message": message}},
        status=status,
        headers={hdrs.CACHE_CONTROL: "no-store", **(headers or {})},
    )


def not_found() -> web.Response:
    return error_response(404, "NOT_FOUND", NOT_FOUND_MESSAGE)


def unauthenticated(message: str, challenge: str) -> web.Response:
    return error_response(401, "UNAUTHENTICATED", message, {hdrs.WWW_AUTHENTICATE: challenge})


def media_type(declared: str) -> str:
    return declared if MEDIA_TYPE.fullmatch(declared) else "application/octet-stream"


def content_disposition(display_name: str) -> str:
    """An attachment header that carries any name exactly (RFC 6266, RFC 8187) and nothing else."""
    name = display_name or "download"
    # Percent-encoding every byte outside the unreserved set leaves no quote, ';' or CR/LF.
    encoded = quote(name, safe="")
    # Clients that ignore filename* get a plain-ASCII approximation.
    fallback = UNSAFE_FALLBACK_CHARS.sub("_", name)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{encoded}"


def download_headers(record: DocumentRecord) -> dict[str, str]:
    return {
        hdrs.CONTENT_TYPE: media_type(record.content_type),
        hdrs.CONTENT_DISPOSITION: content_disposition(record.display_name),
        hdrs.ETAG: f'"{record.sha256}"',
        hdrs.CACHE_CONTROL: "private, no-store",
        # Uploaded bytes are served as declared, never reinterpreted (say, as HTML) by a browser.
        hdrs.X_CONTENT_TYPE_OPTIONS: "nosniff",
    }


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """The one error boundary: every failure becomes a JSON body with no internal text."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        default = "INTERNAL" if exc.status >= 500 else "INVALID_ARGUMENT"
        allow = {hdrs.ALLOW: exc.headers[hdrs.ALLOW]} if hdrs.ALLOW in exc.headers else None
        return error_response(
            exc.status, CANONICAL_CODES.get(exc.status, default), exc.reason.lower(), allow
        )
    except (Unavailable, *DEPENDENCY_ERRORS) as exc:
        log.warning("a dependency failed in %s %s: %s", request.method, request.path, describe(exc))
        return error_response(503, "UNAVAILABLE", UNAVAILABLE_MESSAGE)
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(500, "INTERNAL", "internal error; see the server log")


def close_quietly(chunks: Iterator[bytes]) -> None:
    # Closing the generator returns its S3 connection to the pool. If a cancelled read still
    # runs in a worker thread, the generator is busy; it is closed when that read lets go of it.
    with contextlib.suppress(ValueError):
        chunks.close()  # type: ignore[attr-defined]


async def download(request: web.Request) -> web.StreamResponse:
    """GET or HEAD one document's original bytes, for a caller holding one of its tenant's keys."""
    # Like the gRPC API: no bearer key at all is "missing", a key nobody holds is "invalid".
    key = bearer_key([("authorization", request.headers.get(hdrs.AUTHORIZATION, ""))])
    if key is None:
        return unauthenticated(
            "missing API key: send the header 'Authorization: Bearer <key>'",
            'Bearer realm="footnote"',
        )
    deps = request.app[DEPS]
    principal = await deps.authenticator.authenticate(key)
    if principal is None:
        return unauthenticated(
            "the API key is not valid", 'Bearer realm="footnote", error="invalid_token"'
        )
    try:
        record = await deps.documents.get(principal.tenant_id, request.match_info["id"])
    except (NotFound, InvalidArgument):
        return not_found()

    response = web.StreamResponse(headers=download_headers(record))
    response.content_length = record.size_bytes
    if request.method == hdrs.METH_HEAD:
        # A stat gives HEAD the status GET would get, without opening the body.
        if not await deps.documents.object_exists(record):
            return not_found()
        return response

    chunks = deps.documents.open_object(record)
    try:
        # The first read opens the object, so a missing object or an outage still gets a status.
        piece = await asyncio.to_thread(next, chunks, None)
    except ObjectMissing:
        log.warning("document %s has no object at %s", record.id, record.object_key)
        return not_found()

    try:
        await response.prepare(request)
        while piece is not None:
            # write() waits while the client is slow, so at most a few pieces sit in memory.
            await response.write(piece)
            piece = await asyncio.to_thread(next, chunks, None)
    except ConnectionError:
        log.info("client left during the download of %s", record.id)
    except Exception as exc:
        if isinstance(exc, (Unavailable, *DEPENDENCY_ERRORS)):
            log.warning("download of %s broke off: %s", record.id, describe(exc))
        else:
            log.exception("download of %s broke off", record.id)
        # The status line is already out: ending the connection short of Content-Length is
        # how HTTP/1.1 tells the client the body is incomplete.
        if request.transport is not None:
            request.transport.close()
    finally:
        close_quietly(chunks)
    return response


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def metrics(request: web.Request) -> web.Response:
    """Prometheus scrape: no key needed, and no series carries an id, a tenant or a secret."""
    # Collectors query Redis and Postgres (each with a time limit): off the event loop.
    body, content_type = await asyncio.to_thread(
        exposition, request.app[METRICS], request.headers.get(hdrs.ACCEPT)
    )
    return web.Response(body=body, headers={hdrs.CONTENT_TYPE: content_type})


def scrape_registry(deps: Deps) -> ScrapeRegistry:
    return ScrapeRegistry(
        QueueDepthCollector(str(deps.tasks.celery.conf.broker_url or "")),
        DocumentStateCollector(deps.db),
    )


def create_http_app(deps: Deps) -> web.Application:
    """The side-port application; add_get also answers HEAD."""
    app = web.Application(middlewares=[json_errors])
    app[DEPS] = deps
    app[METRICS] = scrape_registry(deps)
    app.router.add_get(DOWNLOAD_PATH, download)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)

    async def close_collectors(app: web.Application) -> None:
        app[METRICS].close()

    app.on_cleanup.append(close_collectors)
    return app


async def start_http(
    app: web.Application, host: str, port: int, *, shutdown_timeout: float = 5.0
) -> tuple[web.AppRunner, int]:
    """Serves app on host:port (0 picks a free port); stop it with `await runner.cleanup()`."""
    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, runner.addresses[0][1]
