"""The generator for OpenAI-compatible chat-completions servers, streamed over SSE.

The upstream is spoken to with aiohttp: its HTTP parser is compiled (llhttp), and a streamed
body is read from a buffer its protocol fills. httpx, which this module used before, reads
each chunk through httpcore's pure-Python connection, h11 and anyio's stream: a client reading
200 streamed answers spent 36-48 us of CPU per event with httpx against 16-30 us with aiohttp,
and that CPU is the event loop's, which relays every answer (docs/performance.md, "Upstream
client"). The SSE reading and the answer's checks are this module's own: the `openai` SDK
builds a pydantic object per chunk, which is what a relay of every token of every answer
cannot afford.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import resource
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import orjson
from aiohttp.http_exceptions import (
    ContentLengthError,
    HttpProcessingError,
    TransferEncodingError,
)

from services.errors import ResourceExhausted, Unavailable
from services.llm.base import (
    Finished,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    TextPiece,
    estimate_tokens,
)
from services.observability.metrics import LLM_ERRORS, LLM_TIME_TO_FIRST_TOKEN

log = logging.getLogger(__name__)

# ErrorInfo reasons; every one of them arrives as UNAVAILABLE, the reason says why.
LLM_UNAVAILABLE = "LLM_UNAVAILABLE"
LLM_TIMEOUT = "LLM_TIMEOUT"
LLM_REFUSED = "LLM_REFUSED"
LLM_BAD_RESPONSE = "LLM_BAD_RESPONSE"
LLM_AUTH_FAILED = "LLM_AUTH_FAILED"
LLM_RATE_LIMITED = "LLM_RATE_LIMITED"
LLM_REJECTED = "LLM_REJECTED"
LLM_UPSTREAM_ERROR = "LLM_UPSTREAM_ERROR"
# Not the model's fault: every pooled connection is busy with other answers (RESOURCE_EXHAUSTED).
LLM_POOL_EXHAUSTED = "LLM_POOL_EXHAUSTED"

_MESSAGES = {
    LLM_UNAVAILABLE: "the language model is unavailable; try again later",
    LLM_TIMEOUT: "the language model did not answer in time; try again later",
    LLM_REFUSED: "the language model declined to answer",
    LLM_BAD_RESPONSE: "the language model sent a response that could not be read",
    LLM_AUTH_FAILED: "the language model rejected the server's credentials",
    LLM_RATE_LIMITED: "the language model is over its rate limit; try again later",
    LLM_REJECTED: "the language model rejected the request",
    LLM_UPSTREAM_ERROR: "the language model failed while answering",
}

_FINISH_REASONS = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    # We send no tools, but some servers report these for a plain end of turn.
    "eos": FinishReason.STOP,
    "tool_calls": FinishReason.STOP,
    "function_call": FinishReason.STOP,
}

# A line or event this large is not a chat-completion chunk; stop before memory grows further.
_MAX_EVENT_BYTES = 1 << 20
_MAX_JSON_BODY_BYTES = 8 << 20
_MAX_ERROR_BODY_BYTES = 4096
# Upstream bodies may echo keys or prompts: they go to the log, cut short, never to the client.
_LOGGED_BODY_CHARS = 500
_DRAIN_SECONDS = 1.0
_LINE_END = re.compile(rb"\r\n|\r|\n")
SEED = 0
# File descriptors kept for everything but upstream connections (database, clients, logs).
_RESERVED_FILES = 256
# An idle connection is kept this long for the next answer (aiohttp's default is 15 s,
# httpx's 5 s), so an answer that comes after a pause needs no new TCP and TLS handshake.
# Servers close idle connections on their own schedule: uvicorn (vLLM) after 5 s, nginx after
# 75 s; one closed meanwhile fails the request at once, which is then sent again (_send).
KEEPALIVE_SECONDS = 60.0
_MAX_DEFAULT_CONNECTIONS = 4096


def environment_proxy(url: str) -> str | None:
    """The proxy HTTP(S)_PROXY and NO_PROXY name for `url` (with any credentials in its URL).

    Read once, when the generator is made, as httpx read them when it made its client
    (ALL_PROXY, which httpx also read, is not). aiohttp's trust_env reads them, and ~/.netrc,
    again for every request, each time in a job on the event loop's default executor, where
    the server's database reads and questions' embeddings wait their turn: a request to a
    local server took 0.91 ms p50 that way against 0.27 ms, and 10.7 ms against 0.5 ms behind
    twelve jobs of 4 ms. And a ~/.netrc entry for the upstream's host made aiohttp refuse any
    request that carries an API key (ValueError: it will not send both an Authorization
    header and credentials). A value that is not a proxy URL is a ValueError here.
    """
    target = urllib.parse.urlsplit(url)
    if not target.hostname or urllib.request.proxy_bypass(target.hostname):
        return None
    proxy = urllib.request.getproxies().get(target.scheme)
    if not proxy:
        return None
    if "://" not in proxy:
        proxy = f"http://{proxy}"  # "host:port", as curl takes it
    try:
        parts = urllib.parse.urlsplit(proxy)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port out of range, a bracket unclosed
        valid = False
    if not valid:
        # At start, and without the value: it may carry the proxy's password. Left to the
        # first request, every answer failed with the URL in the log.
        name = f"{target.scheme.upper()}_PROXY"
        raise ValueError(f"{name} (or {name.lower()}) is not a proxy URL such as http://host:port")
    return proxy


def default_max_connections() -> int:
    """As many upstream connections as the open-file limit leaves room for, next to clients."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return _MAX_DEFAULT_CONNECTIONS
    # Each relayed answer holds one upstream socket; half the files stay for everything else.
    return max(16, min(_MAX_DEFAULT_CONNECTIONS, (soft - _RESERVED_FILES) // 2))


@dataclass
class _Pool:
    """The generator's connections on one event loop: an aiohttp session whose connections are
    kept alive, one that opens a new connection for each request (for a request sent again,
    see _send), and one slot per connection that an answer holds from its request to the end
    of its body."""

    session: aiohttp.ClientSession
    fresh: aiohttp.ClientSession
    slots: asyncio.Semaphore
    loop: asyncio.AbstractEventLoop

    def detach(self) -> None:
        self.session.detach()
        self.fresh.detach()

    async def close(self) -> None:
        await self.session.close()
        await self.fresh.close()


class _Attempt:
    """What one request attempt learnt from aiohttp's trace: whether it began making a new
    connection (and so did not reuse a kept one)."""

    __slots__ = ("fresh",)

    def __init__(self) -> None:
        self.fresh = False


async def _connection_begun(
    session: aiohttp.ClientSession,
    context: Any,
    params: aiohttp.TraceConnectionCreateStartParams,
) -> None:
    attempt = context.trace_request_ctx
    if isinstance(attempt, _Attempt):
        attempt.fresh = True


class OpenAIGenerator:
    """Streams an answer from a `/v1/chat/completions` server (vLLM, Ollama, llama.cpp, OpenAI).

    Timeouts: `connect_timeout` for making a connection (the name's lookup, every address
    tried, a proxy's CONNECT, TCP and TLS); `read_timeout` for each gap between
    chunks once the first token has arrived (before it only the deadline applies, as a long
    prompt can take a while to process); `timeout_seconds` for the whole answer.

    At most `max_connections` answers stream at once (default: what the open-file limit
    allows); a further one waits up to `pool_timeout` for a connection, then fails with
    RESOURCE_EXHAUSTED (LLM_POOL_EXHAUSTED), which says the server is busy, not the model.
    An idle connection is kept `keepalive_seconds` for the next answer, which then needs no
    new TCP and TLS handshake before its request; one the server has closed meanwhile is
    replaced (or the request retried on a new one, see _send).
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_seconds: float = 60.0,
        connect_timeout: float = 5.0,
        *,
        read_timeout: float = 30.0,
        max_connections: int | None = None,
        pool_timeout: float = 10.0,
        keepalive_seconds: float = KEEPALIVE_SECONDS,
    ) -> None:
        if min(timeout_seconds, connect_timeout, read_timeout, pool_timeout) <= 0:
            raise ValueError("timeouts must be positive")
        if keepalive_seconds <= 0:
            raise ValueError("keepalive_seconds must be positive")
        self.keepalive_seconds = keepalive_seconds
        if max_connections is not None and max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.max_connections = max_connections or default_max_connections()
        self.pool_timeout = pool_timeout
        self.url = chat_completions_url(base_url)
        self.model = model
        self.timeout_seconds = timeout_seconds
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        # Each request's own headers, not the session's: aiohttp copies a session's headers
        # into its request to a proxy named per request, and would send the API key there as
        # Proxy-Authorization.
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        # certifi's CA bundle, as httpx verifies with, rather than the system's.
        self._tls = httpx.create_ssl_context()
        self._proxy = environment_proxy(self.url)
        self._trace = aiohttp.TraceConfig()
        # From the start of the connection's making: one that failed while being made (a
        # proxy that dropped the CONNECT) is as new as one that was made.
        self._trace.on_connection_create_start.append(_connection_begun)
        self._pool: _Pool | None = None

    async def aclose(self) -> None:
        """Closes the pooled connections; a later generate() opens new ones."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        model = request.model or self.model
        loop = asyncio.get_running_loop()
        pool = self._pool_of(loop)
        deadline = loop.time() + self.timeout_seconds
        answer = _Answer(model)
        body = orjson.dumps(_payload(request, model))
        try:
            # The exit stack gives back the connection's slot, and closes the response (and cuts
            # the connection, unless its body was read to the end) however this generator ends:
            # exhausted, failed, aclose()d or cancelled.
            async with contextlib.AsyncExitStack() as exits:
                await self._take_slot(pool, exits)
                response = await self._send(pool, body, deadline, exits)
                if response.status // 100 != 2:
                    await self._raise_for_status(response, answer, deadline)
                content_type = response.headers.get("content-type", "").lower()
                if content_type.startswith("application/json"):
                    # A server (or proxy) that ignored stream=true: one piece, same checks.
                    raw = await _read_capped(response, _MAX_JSON_BODY_BYTES, deadline)
                    text = answer.accept_completion(raw)
                    if text:
                        yield TextPiece(text)
                else:
                    chunks = response.content.iter_any()
                    decoder = _EventStreamDecoder()
                    reads = _ReadLimit()
                    exits.callback(reads.close)
                    # The events of one read go out as one piece: a read takes all that has
                    # arrived, under load many events, and one message each would cost the
                    # relay more than the text is worth. Nothing waits for a later read, so no
                    # text is held back.
                    # At the end of the body, the decoder gives up what it still holds.
                    done = False
                    while not done:
                        chunk = await self._next_chunk(chunks, answer, deadline, reads)
                        done = chunk is None
                        events = decoder.close() if chunk is None else decoder.feed(chunk)
                        text, failed = _joined_text(answer, events)
                        if text:
                            yield TextPiece(text)
                        if failed is not None:
                            raise failed
            yield answer.finished(request)
        except (Unavailable, aiohttp.ClientError, TimeoutError) as err:
            failure = err if isinstance(err, Unavailable) else self._translate(err, answer)
            LLM_ERRORS.labels(failure.reason).inc()
            if answer.chars:
                # The caller has already streamed these pieces; it must not keep them.
                failure.metadata["partial"] = "true"
            if failure is err:
                raise
            raise failure from err

    def _translate(self, err: aiohttp.ClientError | TimeoutError, answer: _Answer) -> Unavailable:
        log.warning("LLM %s failed: %s: %s", self.url, type(err).__name__, err)
        # aiohttp's own timeouts are TimeoutErrors too; the only one set is the connect's.
        if isinstance(err, aiohttp.ServerTimeoutError):
            return answer.error(LLM_TIMEOUT, timeout="connect")
        if isinstance(err, TimeoutError):
            return answer.error(LLM_TIMEOUT, timeout="deadline")
        if _unreadable(err):
            return answer.error(LLM_BAD_RESPONSE)
        return answer.error(LLM_UNAVAILABLE)

    def _pool_of(self, loop: asyncio.AbstractEventLoop) -> _Pool:
        """The pool of connections of this event loop, made on its first answer."""
        pool = self._pool
        if pool is not None and pool.loop is loop and not pool.session.closed:
            return pool
        if pool is not None:
            # The connections of another event loop (an earlier asyncio.run) can be neither
            # used nor closed from this one; they are dropped, as that loop's other sockets are.
            pool.detach()
        kept = aiohttp.TCPConnector(
            # No limit of aiohttp's: the slots (_take_slot) are the pool's size, so that an answer
            # that waits too long for one is told the server is busy, not that the model is.
            limit=0,
            ssl=self._tls,
            keepalive_timeout=self.keepalive_seconds,
        )
        fresh = aiohttp.TCPConnector(limit=0, ssl=self._tls, force_close=True)
        self._pool = _Pool(
            self._session(kept), self._session(fresh), asyncio.Semaphore(self.max_connections), loop
        )
        return self._pool

    def _session(self, connector: aiohttp.TCPConnector) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=connector,
            # The connect timeout alone: the response's head is bounded by the deadline (_send),
            # its body by the read timeout and the deadline (_ReadLimit, _read_capped).
            # `connect` bounds the name's lookup and every address tried; `sock_connect` alone
            # was given afresh to each address.
            timeout=aiohttp.ClientTimeout(
                total=None, connect=self.connect_timeout, sock_connect=self.connect_timeout
            ),
            # Nothing an upstream sets is sent back: not one tenant's cookie on another's
            # request, nor a balancer's affinity cookie that would pin every answer to one
            # replica.
            cookie_jar=aiohttp.DummyCookieJar(),
            trace_configs=[self._trace],
            # Not trust_env: the proxy is read once (environment_proxy).
            trust_env=False,
        )

    async def _take_slot(self, pool: _Pool, exits: contextlib.AsyncExitStack) -> None:
        """One of the pool's connections for this answer, waiting at most the pool timeout."""
        slots = pool.slots
        if slots.locked():
            try:
                async with asyncio.timeout(self.pool_timeout):
                    await slots.acquire()
            except TimeoutError as err:
                log.warning("LLM %s: all %d connections busy", self.url, self.max_connections)
                raise ResourceExhausted(
                    "the server is answering as many questions as it can; try again shortly",
                    reason=LLM_POOL_EXHAUSTED,
                    metadata={"max_connections": str(self.max_connections)},
                ) from err
        else:
            await slots.acquire()  # at once: no timer for the common case
        exits.callback(slots.release)

    async def _send(
        self, pool: _Pool, body: bytes, deadline: float, exits: contextlib.AsyncExitStack
    ) -> aiohttp.ClientResponse:
        session = pool.session
        while True:
            trace = _Attempt()
            try:
                async with asyncio.timeout_at(deadline):
                    response = await session.post(
                        self.url,
                        data=body,
                        headers=self._headers,
                        allow_redirects=False,
                        proxy=self._proxy,
                        trace_request_ctx=trace,
                    )
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as err:
                # A kept-alive connection that the server closed just as we reused it (llama-server
                # closes each one after a stream, and its FIN can come after the next request):
                # nothing was answered, so ask again, once, on a new connection. Not on another
                # pooled one, which may be as stale; and not a third time, since a server that
                # read the request before it dropped the connection (a prompt that crashed it)
                # may have acted on it. A new connection (opened, or failing to open) fails for
                # good.
                opened = trace.fresh or isinstance(err, aiohttp.ClientConnectorError)
                if opened or session is pool.fresh or pool.session.closed:
                    raise  # (closed: aclose() ended the pool under this request)
                log.info("LLM %s: reused connection was closed (%s); retrying", self.url, err)
                session = pool.fresh
                continue
            exits.callback(_finish, response)
            return response

    async def _next_chunk(
        self, chunks: AsyncIterator[bytes], answer: _Answer, deadline: float, reads: _ReadLimit
    ) -> bytes | None:
        """The next body chunk, or None at the end of the body."""
        loop = asyncio.get_running_loop()
        limit = deadline
        if answer.done:
            # Only the end of the body is left; reading it lets the connection be reused.
            limit = min(deadline, loop.time() + _DRAIN_SECONDS)
        elif answer.started:
            limit = min(deadline, loop.time() + self.read_timeout)
        try:
            return await reads.next(chunks, limit)
        except (TimeoutError, aiohttp.ClientError) as err:
            if answer.finish is not None:
                # Only the usage record was still to come; the answer itself is complete.
                log.info("LLM %s: stream ended badly after finishing (%r)", self.url, err)
                return None
            if isinstance(err, TimeoutError):
                which = "deadline" if limit >= deadline else "read"
                log.warning("LLM %s: %s timeout while streaming", self.url, which)
                raise answer.error(LLM_TIMEOUT, timeout=which) from err
            raise

    async def _raise_for_status(
        self, response: aiohttp.ClientResponse, answer: _Answer, deadline: float
    ) -> None:
        status = response.status
        # The body only goes to the log: not worth waiting long for.
        limit = min(deadline, asyncio.get_running_loop().time() + self.read_timeout)
        try:
            body = await _read_capped(response, _MAX_ERROR_BODY_BYTES, limit)
        except (TimeoutError, aiohttp.ClientError):
            body = b""
        log.warning(
            "LLM %s answered HTTP %d: %s",
            self.url,
            status,
            body[:_LOGGED_BODY_CHARS].decode("utf-8", "replace"),
        )
        metadata = {"upstream_status": str(status)}
        if status in (401, 403):
            reason = LLM_AUTH_FAILED
        elif status == 429:
            reason = LLM_RATE_LIMITED
            retry_after = response.headers.get("retry-after", "")
            if retry_after.isdigit():
                metadata["retry_after_seconds"] = retry_after
        elif status in (408, 504):
            reason = LLM_TIMEOUT
        elif 400 <= status < 500:
            reason = LLM_REJECTED
        elif status >= 500:
            reason = LLM_UNAVAILABLE
        else:  # 1xx or a redirect we do not follow
            reason = LLM_BAD_RESPONSE
        raise answer.error(reason, **metadata)


class _ReadLimit:
    """Ends a read of the answer's body that outlasts its limit, with one timer per answer.

    `asyncio.timeout_at` around each read scheduled a timer and cancelled it a chunk later.
    Cancelled timers stay in the event loop's heap until they come up, and every push and pop
    compares timers in Python: at 100 streams the relay spent about a quarter of its CPU there
    (bench/relay.py: 51k upstream deltas/s with it, 68k with no limit at all). Here each read
    notes its own limit, and the one timer, set for the limit of the read that set it, looks
    when it goes off: if the read under way has a later limit, the timer is set again for that
    limit; if not, the read has lasted too long and its task is cancelled, which the read turns
    into TimeoutError as `asyncio.timeout` does (a cancellation from elsewhere stays one). Set
    for a limit earlier than the timer's (the last chunks' drain), the timer is moved forward.
    So a stream's timer goes off about once per read timeout, however many chunks it reads.
    """

    __slots__ = ("_expired", "_handle", "_limit", "_task", "_when")

    def __init__(self) -> None:
        self._handle: asyncio.TimerHandle | None = None
        self._when = 0.0  # when the timer goes off
        self._task: asyncio.Task[Any] | None = None  # the task of the read under way
        self._limit = 0.0  # when the read under way must end by
        self._expired = False

    async def next(self, chunks: AsyncIterator[bytes], limit: float) -> bytes | None:
        """anext(chunks, None), raising TimeoutError if it has not returned by limit."""
        task = asyncio.current_task()
        assert task is not None, "reads run in a task"
        cancelling = task.cancelling()
        self._task, self._limit, self._expired = task, limit, False
        if self._handle is None or limit < self._when:
            self._set(task.get_loop(), limit)
        try:
            return await anext(chunks, None)
        except asyncio.CancelledError as err:
            if self._expired and task.uncancel() <= cancelling:
                raise TimeoutError from err
            raise
        finally:
            self._task = None

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _set(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        self.close()
        self._when = when
        self._handle = loop.call_at(when, self._go_off)

    def _go_off(self) -> None:
        self._handle = None
        task = self._task
        if task is None:
            return  # between reads: the next read sets the timer again
        if self._limit > self._when:
            self._set(task.get_loop(), self._limit)
            return
        self._expired = True
        task.cancel()


def _joined_text(answer: _Answer, events: list[tuple[str, str]]) -> tuple[str, Unavailable | None]:
    """The text a read's events add, and the failure of an event that ends the answer: the
    text of the events before it is still streamed, as it would be had they come in an
    earlier read."""
    parts: list[str] = []
    try:
        for kind, data in events:
            parts.append(answer.accept_event(kind, data))
    except Unavailable as err:
        return "".join(parts), err
    return "".join(parts), None


def chat_completions_url(base_url: str) -> str:
    """The endpoint for a base URL given with or without its `/v1` (or the full path)."""
    url = httpx.URL(base_url.strip())
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"not an http(s) URL: {base_url!r}")
    path = url.path.rstrip("/")
    if not path.endswith("/chat/completions"):
        path += "/chat/completions" if re.search(r"/v\d+$", path) else "/v1/chat/completions"
    return str(url.copy_with(path=path))


def _payload(request: GenerationRequest, model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": m.role, "content": m.content} for m in request.messages],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": request.temperature,
        "max_tokens": request.max_output_tokens,
        # A fixed seed: servers that honour it (OpenAI, vLLM, llama.cpp, Ollama) then sample
        # the same answer for the same prompt, even above temperature 0.
        "seed": SEED,
    }


def _error(reason: str, model: str, **metadata: str) -> Unavailable:
    if model:
        metadata["model"] = model
    return Unavailable(_MESSAGES[reason], reason=reason, metadata=metadata)


async def _read_capped(response: aiohttp.ClientResponse, cap: int, deadline: float) -> bytes:
    body = bytearray()
    async with asyncio.timeout_at(deadline):
        async for chunk in response.content.iter_any():
            body += chunk
            if len(body) > cap:
                break
    return bytes(body[:cap])


def _unreadable(err: BaseException) -> bool:
    """Whether aiohttp failed to parse what the upstream sent: a malformed status line or
    header, one too long, a content-encoding it cannot decode. aiohttp wraps the parser's
    error (a response head's twice), so the chain of causes is searched. A body cut short
    (less than its length or its last chunk) is not among them: that is the connection's
    failure."""
    cause = err.__cause__
    while cause is not None:
        if isinstance(cause, (ContentLengthError, TransferEncodingError)):
            return False
        if isinstance(cause, HttpProcessingError):
            return True
        cause = cause.__cause__
    return False


def _finish(response: aiohttp.ClientResponse) -> None:
    """Released if the body was read to its end (back to the kept pool; the retry's session
    closes it); otherwise cut, which is also how the upstream learns to stop generating an
    answer nobody reads.

    Cut (aborted), not closed: over TLS a close says goodbye (close_notify) and waits for the
    upstream's, up to 30 s on uvloop; one that streams without reading never answers, and went
    on generating into the open socket all that while. An answer given up before the response's
    head arrived is closed by aiohttp itself, politely: this does not reach it."""
    if response.content.at_eof():
        response.release()
        return
    connection = response.connection
    if connection is not None and connection.transport is not None:
        connection.transport.abort()
    response.close()


class _Answer:
    """What one streamed answer has delivered so far, and the checks on each chunk."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.began = time.perf_counter()
        self.chars = 0
        self.text_parts: list[str] = []
        self.finish: FinishReason | None = None
        self.done = False
        self.usage: Mapping[str, Any] = {}

    @property
    def started(self) -> bool:
        return self.chars > 0 or self.finish is not None

    def error(self, reason: str, **metadata: str) -> Unavailable:
        return _error(reason, self.model, **metadata)

    def accept_event(self, kind: str, data: str) -> str:
        """The text an SSE event adds; raises Unavailable for errors, refusals and garbage."""
        if self.done:
            return ""  # nothing after [DONE] counts
        if data.strip() == "[DONE]":
            self.done = True
            self.finish = self.finish or FinishReason.STOP
            return ""
        try:
            # orjson: a chunk is parsed in about a fifth of json's time, and a relay parses
            # one per token of every answer it streams.
            chunk = orjson.loads(data)
        except ValueError as err:
            log.warning("LLM sent a malformed event: %r", data[:_LOGGED_BODY_CHARS])
            raise self.error(LLM_BAD_RESPONSE) from err
        if not isinstance(chunk, dict):
            raise self._bad("an event that is not an object", data)
        if kind == "error" or chunk.get("error"):
            self._raise_upstream_error(chunk.get("error", chunk))
        self._take_usage(chunk)
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise self._bad("choices that are not a list", data)
        text = ""
        for choice in choices:
            if not isinstance(choice, dict):
                raise self._bad("a choice that is not an object", data)
            if choice.get("index", 0) != 0:
                continue  # we ask for one choice; ignore extras rather than mix them in
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise self._bad("a delta that is not an object", data)
            text += self._take_message(delta, data)
            self._take_finish(choice.get("finish_reason"))
        return text

    def accept_completion(self, raw: bytes) -> str:
        """The text of a whole (non-streamed) chat.completion object."""
        try:
            body = json.loads(raw)
        except ValueError as err:
            log.warning("LLM sent a malformed completion: %r", raw[:_LOGGED_BODY_CHARS])
            raise self.error(LLM_BAD_RESPONSE) from err
        if not isinstance(body, dict):
            raise self._bad("a completion that is not an object", repr(body))
        if body.get("error"):
            self._raise_upstream_error(body["error"])
        self._take_usage(body)
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise self._bad("a completion without choices", repr(body))
        message = choices[0].get("message") or {}
        if not isinstance(message, dict):
            raise self._bad("a message that is not an object", repr(body))
        text = self._take_message(message, repr(body))
        self._take_finish(choices[0].get("finish_reason") or "stop")
        self.done = True
        return text

    def finished(self, request: GenerationRequest) -> Finished:
        if self.finish is None:
            # The body ended cleanly but never said the answer was complete: it may be cut.
            raise self.error(LLM_BAD_RESPONSE)
        prompt_tokens = self.usage.get("prompt_tokens")
        if not isinstance(prompt_tokens, int) or prompt_tokens <= 0:
            prompt_tokens = estimate_tokens("".join(m.content for m in request.messages))
        completion_tokens = self.usage.get("completion_tokens")
        if not isinstance(completion_tokens, int) or completion_tokens < 0:
            completion_tokens = estimate_tokens("".join(self.text_parts))
        return Finished(self.finish, prompt_tokens, completion_tokens)

    def _take_message(self, message: Mapping[str, Any], data: str) -> str:
        if message.get("refusal"):
            log.info("LLM refused: %r", str(message["refusal"])[:_LOGGED_BODY_CHARS])
            raise self.error(LLM_REFUSED)
        content = message.get("content")
        if content is None:
            return ""
        if not isinstance(content, str):
            raise self._bad("content that is not a string", data)
        if content and not self.chars:
            LLM_TIME_TO_FIRST_TOKEN.observe(time.perf_counter() - self.began)
        self.chars += len(content)
        self.text_parts.append(content)
        return content

    def _take_finish(self, reason: Any) -> None:
        if reason is None:
            return
        if reason == "content_filter":
            raise self.error(LLM_REFUSED)
        if reason not in _FINISH_REASONS:
            log.info("LLM sent an unknown finish_reason %r; taken as stop", reason)
        self.finish = _FINISH_REASONS.get(reason, FinishReason.STOP)

    def _take_usage(self, chunk: Mapping[str, Any]) -> None:
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage

    def _raise_upstream_error(self, error: Any) -> None:
        log.warning("LLM sent an error: %r", str(error)[:_LOGGED_BODY_CHARS])
        metadata: dict[str, str] = {}
        if isinstance(error, dict):
            # Only short identifiers such as "server_error": messages may echo secrets.
            for key in ("type", "code"):
                value = error.get(key)
                if isinstance(value, str | int) and re.fullmatch(r"[\w.-]{1,64}", str(value)):
                    metadata[f"upstream_error_{key}"] = str(value)
        raise self.error(LLM_UPSTREAM_ERROR, **metadata)

    def _bad(self, what: str, data: str) -> Unavailable:
        log.warning("LLM sent %s: %r", what, data[:_LOGGED_BODY_CHARS])
        return self.error(LLM_BAD_RESPONSE)


class _EventStreamDecoder:
    """Splits a text/event-stream body into (event type, data) pairs, as the SSE spec reads it."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._kind = ""
        self._data: list[str] = []
        self._size = 0
        self._first_line = True

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        self._buffer += chunk
        events: list[tuple[str, str]] = []
        if b"\r" not in self._buffer:
            # The common case, LF line ends only: one split instead of a search per line.
            *lines, rest = bytes(self._buffer).split(b"\n")
            for line in lines:
                self._line(line, events)
            self._buffer = bytearray(rest)
            if len(rest) > _MAX_EVENT_BYTES:
                raise _error(LLM_BAD_RESPONSE, "", problem="line too long")
            return events
        start = 0
        while match := _LINE_END.search(self._buffer, start):
            if match.group() == b"\r" and match.end() == len(self._buffer):
                break  # maybe the first half of a CRLF split across chunks
            self._line(bytes(self._buffer[start : match.start()]), events)
            start = match.end()
        del self._buffer[:start]
        if len(self._buffer) > _MAX_EVENT_BYTES:
            raise _error(LLM_BAD_RESPONSE, "", problem="line too long")
        return events

    def close(self) -> list[tuple[str, str]]:
        """Events left at the end of the body; a last event without its blank line counts."""
        events = self.feed(b"\n") if self._buffer else []
        self._line(b"", events)
        return events

    def _line(self, raw: bytes, events: list[tuple[str, str]]) -> None:
        if self._first_line:
            raw = raw.removeprefix(b"\xef\xbb\xbf")
            self._first_line = False
        if not raw:
            if self._data:
                events.append((self._kind, "\n".join(self._data)))
            self._kind, self._data, self._size = "", [], 0
            return
        if raw.startswith(b"data:"):
            # Nearly every line: the fields are compared as bytes, only the value is decoded.
            field, value = "data", raw[6:] if raw.startswith(b"data: ") else raw[5:]
        elif raw.startswith(b":"):
            return  # a comment: servers send these to keep the connection alive
        else:
            name, _, value = raw.partition(b":")
            field = name.decode("utf-8", "replace")
            value = value.removeprefix(b" ")
        if field == "data":
            self._data.append(value.decode("utf-8", "replace"))
            self._size += len(raw)
            if self._size > _MAX_EVENT_BYTES:
                raise _error(LLM_BAD_RESPONSE, "", problem="event too large")
        elif field == "event":
            self._kind = value.decode("utf-8", "replace")
