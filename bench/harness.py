"""What the serving benchmarks share: the stack, a scripted upstream, servers in processes.

Each server runs in a process of its own, as in production, so the client that measures
does not share its event loop. The scripted upstream (`python bench/harness.py upstream`)
streams `deltas` chat-completion chunks per request, each written on its own, with an
optional delay before the first; `python bench/harness.py echo` is the bare grpc.aio
baseline: a server stream of the same number of StreamCompleteResponse deltas, no Footnote.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent

WORD = "word "
# Every call a bench makes has this deadline: a server that stops answering (a bug under
# measurement, say) fails the call with DEADLINE_EXCEEDED instead of holding `make bench` for
# ever. The longest calls, 1,000 streams on two busy cores, end within a minute.
CALL_SECONDS = 300.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, limit: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Returns once something listens on port; raises if nothing does within limit seconds,
    or as soon as proc, the process that should listen, has exited."""
    until = time.monotonic() + limit
    while time.monotonic() < until:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:3]} exited with code {proc.returncode}")
        time.sleep(0.1)
    raise TimeoutError(f"nothing listening on {port}")


def wait_settled(pid: int, limit: float = 120.0) -> None:
    """Returns once the process has been nearly idle for a second.

    A Footnote server that has just started loads its embedding model on a thread (a few
    seconds of CPU on two cores) while it already answers. Measured meanwhile, the server that
    started second was the slow one: a single stream's first delta 136-216 ms against 9-21 for
    the other, whichever event loop each ran on."""
    import psutil

    server = psutil.Process(pid)

    def cpu_seconds() -> float:
        times = server.cpu_times()
        return times.user + times.system

    until = time.monotonic() + limit
    last = cpu_seconds()
    while time.monotonic() < until:
        time.sleep(1.0)
        now = cpu_seconds()
        if now - last < 0.05:
            return
        last = now
    raise TimeoutError(f"process {pid} still busy after {limit:.0f} s")


@contextlib.contextmanager
def process(
    args: list[str], port: int, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Iterator[int]:
    """A child process serving on port; stopped (SIGTERM, then SIGKILL) on exit. Its output
    goes to a file in the temporary directory, removed once the child was stopped unless the
    run failed or the child had exited by itself, when its path is printed instead."""
    from devstack.processes import terminate

    name = args[2] if args[1] == "-m" else Path(args[1]).stem  # python -m footnote.cli
    log_path = Path(tempfile.gettempdir()) / f"fnbench-{name}-{port}.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        args, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT, cwd=cwd
    )
    kept = True
    try:
        wait_port(port, proc=proc)
        yield proc.pid
        kept = proc.poll() is not None
    finally:
        terminate(proc, grace=10)
        log.close()
        if kept:
            print(f"{name} (port {port}): its output is in {log_path}", file=sys.stderr)
        else:
            log_path.unlink(missing_ok=True)


@contextlib.contextmanager
def upstream(deltas: int, first_delay_ms: float = 0.0, pace_ms: float = 0.0) -> Iterator[str]:
    """A scripted OpenAI-compatible server: `deltas` tokens an answer, the first after
    `first_delay_ms`, then one every `pace_ms` (0: as fast as it can write them)."""
    port = free_port()
    args = [sys.executable, __file__, "upstream", "--port", str(port), "--deltas", str(deltas)]
    args += ["--first-delay-ms", str(first_delay_ms), "--pace-ms", str(pace_ms)]
    with process(args, port):
        yield f"http://127.0.0.1:{port}/v1"


@contextlib.contextmanager
def echo(deltas: int, pace_ms: float = 0.0) -> Iterator[str]:
    """A bare grpc.aio StreamComplete: `deltas` messages a call, one every `pace_ms`."""
    port = free_port()
    args = [sys.executable, __file__, "echo", "--port", str(port), "--deltas", str(deltas)]
    with process([*args, "--pace-ms", str(pace_ms)], port):
        yield f"127.0.0.1:{port}"


@contextlib.contextmanager
def footnote_server(
    endpoints,
    llm_base_url: str | None,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    **extra: str,
) -> Iterator[str]:
    """`footnote serve` on the stack's endpoints; extra settings as FOOTNOTE_* values. Yields
    once the server has loaded its model and gone quiet (wait_settled).

    With cwd, the server is the tree found there (python -m footnote.cli, cwd first on the path).
    """
    port = free_port()
    settings = {
        "FOOTNOTE_DATABASE_URL": endpoints.database_url,
        "FOOTNOTE_BROKER_URL": endpoints.broker_url,
        "FOOTNOTE_S3_ENDPOINT": endpoints.s3_endpoint,
        "FOOTNOTE_S3_ACCESS_KEY": endpoints.s3_access_key,
        "FOOTNOTE_S3_SECRET_KEY": endpoints.s3_secret_key,
        "FOOTNOTE_GRPC_PORT": str(port),
        "FOOTNOTE_HTTP_PORT": str(free_port()),
        "FOOTNOTE_LOG_LEVEL": "WARNING",
        **({"FOOTNOTE_LLM_BASE_URL": llm_base_url} if llm_base_url else {}),
        **{f"FOOTNOTE_{k.upper()}": v for k, v in extra.items()},
    }
    args = (
        [sys.executable, "-m", "footnote.cli", "serve"] if cwd else [str(BIN / "footnote"), "serve"]
    )
    with process(args, port, {**settings, **(env or {})}, cwd) as pid:
        wait_settled(pid)
        yield f"127.0.0.1:{port}"


def make_assistant(database_url: str, tenant: str, **settings) -> tuple[str, str]:
    """A new API key and assistant for tenant: (key, assistant id)."""
    from services import auth
    from services.assistants.domain import create_assistant
    from services.db import migrate
    from services.db.session import Database, make_engine

    migrate.upgrade(database_url)
    db = Database(make_engine(database_url, pool_size=1))
    try:
        key = db.transact(lambda s: auth.create_key(s, tenant))
        made = db.transact(lambda s: create_assistant(s, tenant, "bench", settings))
        return key, made.id
    finally:
        db.dispose()


def loop_option(parser: argparse.ArgumentParser, help: str) -> None:
    """--loops: the event loops to run Footnote's server on, uvloop only where installed."""
    parser.add_argument(
        "--loops",
        nargs="*",
        choices=["asyncio", "uvloop"],
        default=["asyncio", "uvloop"] if importlib.util.find_spec("uvloop") else ["asyncio"],
        help=help,
    )


def percentile(values, p):
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


# --- the child processes --------------------------------------------------------------------


def event(payload: dict) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


async def run_upstream(port: int, deltas: int, first_delay_ms: float, pace_ms: float) -> None:
    from aiohttp import web

    piece = event({"choices": [{"index": 0, "delta": {"content": WORD}}]})
    finish = event(
        {
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": deltas},
        }
    )

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if first_delay_ms:
            await asyncio.sleep(first_delay_ms / 1000)
        for _ in range(deltas):
            await response.write(piece)  # one write per token, as a model server does
            # A model server produces the tokens of all its answers side by side; without this
            # an answer whose socket never fills would be streamed whole before the next began.
            await asyncio.sleep(pace_ms / 1000)
        await response.write(finish)
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
    await asyncio.Event().wait()


async def run_echo(port: int, deltas: int, pace_ms: float) -> None:
    import grpc

    from footnote.v1 import chat_service_pb2 as pb

    async def stream(request: bytes, context) -> object:
        for _ in range(deltas):
            yield pb.StreamCompleteResponse(delta=pb.CompletionDelta(content=WORD))
            if pace_ms:
                await asyncio.sleep(pace_ms / 1000)

    handler = grpc.method_handlers_generic_handler(
        "footnote.v1.ChatService",
        {
            "StreamComplete": grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=None,
                response_serializer=pb.StreamCompleteResponse.SerializeToString,
            )
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def machine() -> str:
    """The cores (those the server would use: its affinity and a container's CPU limit) and
    the vector instructions a run measured on. onnxruntime's 8-bit products (a question's
    embedding, the scores of vectors held in memory) took 2 to 4.5 times as long on AVX2
    cores as on AVX-512 cores with VNNI, and on cores with AMX its products of a dynamic
    operand repack it at every call (vector_memory.Scorer), so figures compare only between
    runs whose line says the same."""
    from services.config import available_cpus

    model, flags = "an unknown CPU", set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    if "amx_int8" in flags:
        vector = "AVX-512 with VNNI and AMX"
    elif "avx512_vnni" in flags:
        vector = "AVX-512 with VNNI"
    elif "avx_vnni" in flags:
        vector = "AVX2 with VNNI"
    elif "avx512f" in flags:
        vector = "AVX-512 without VNNI"
    elif "avx2" in flags:
        vector = "AVX2 without VNNI"
    else:
        vector = "no AVX2"
    return f"machine: {available_cpus()} of {os.cpu_count()} cores usable, {model}, {vector}"


@contextlib.contextmanager
def host_steal() -> Iterator[list[float]]:
    """Yields a list that gets, when the block ends, the share of the machine's CPU time the
    hypervisor gave to other guests meanwhile (`steal` in /proc/stat; 0 on bare metal or
    where it is not reported). On a shared 2-core guest, rounds of unary Complete at
    concurrency 16 that ran with 17-34% steal served 12-30% fewer requests than the rounds
    around them: a round's steal says whether its ratio measured the code or the host."""
    import psutil

    def times() -> tuple[float, float]:
        t = psutil.cpu_times()
        # guest time is already counted in user time
        total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
        return getattr(t, "steal", 0.0), total

    shares: list[float] = []
    steal, total = times()
    yield shares
    steal_after, total_after = times()
    elapsed = total_after - total
    shares.append((steal_after - steal) / elapsed if elapsed > 0 else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["upstream", "echo"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--deltas", type=int, default=2000)
    parser.add_argument("--first-delay-ms", type=float, default=0.0)
    parser.add_argument("--pace-ms", type=float, default=0.0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.role == "upstream":
        asyncio.run(run_upstream(args.port, args.deltas, args.first_delay_ms, args.pace_ms))
    else:
        asyncio.run(run_echo(args.port, args.deltas, args.pace_ms))


if __name__ == "__main__":
    main()
