"""Unary Complete with the extractive generator: requests/s at concurrency 1 and 16.

    .venv/bin/python bench/complete.py

Three servers on the same database, in the same run: this tree, the code this branch started
from (its merge base with `main`, exported with `git archive`: the baseline of the ratio,
without the work merged into main since), and a bare grpc.aio server
that returns a CompleteResponse of the same size (the ceiling). The assistant holds the
1,000-chunk corpus of bench/corpus.py; RAG and citations are on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import corpus
import grpc
from harness import ROOT, footnote_server, free_port, process

from footnote.v1 import chat_service_pb2 as pb
from footnote.v1 import chat_service_pb2_grpc as pb_grpc
from services import auth
from services.db.session import Database, make_engine

MAIN_TREE = Path("/tmp/fnbench-main")


@contextlib.contextmanager
def main_tree() -> Iterator[Path]:
    """The code this branch started from (its merge base with main), with its own stubs."""
    shutil.rmtree(MAIN_TREE, ignore_errors=True)
    MAIN_TREE.mkdir(parents=True)
    git = ["git", "-C", str(ROOT)]
    base = subprocess.run(
        [*git, "merge-base", "HEAD", "main"], check=True, capture_output=True, text=True
    ).stdout.strip()
    archive = subprocess.run([*git, "archive", base], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(MAIN_TREE)], input=archive, check=True)
    import grpc_tools

    protos = sorted(
        str(p.relative_to(MAIN_TREE / "proto")) for p in MAIN_TREE.glob("proto/**/*.proto")
    )
    include = Path(grpc_tools.__file__).parent / "_proto"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-Iproto",
            f"-I{include}",
            "--python_out=.",
            "--grpc_python_out=.",
            *protos,
        ],
        cwd=MAIN_TREE,
        check=True,
    )
    yield MAIN_TREE


@contextlib.contextmanager
def bare_unary(response: bytes) -> Iterator[str]:
    port = free_port()
    code = f"""
import asyncio, grpc
RESPONSE = {response!r}
async def complete(request, context):
    return RESPONSE
async def main():
    handler = grpc.method_handlers_generic_handler("footnote.v1.ChatService", {{
        "Complete": grpc.unary_unary_rpc_method_handler(complete)}})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port("127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()
asyncio.run(main())
"""
    path = Path(f"/tmp/fnbench-bare-{port}.py")
    path.write_text(code)
    with process([sys.executable, str(path)], port):
        yield f"127.0.0.1:{port}"


async def load(target: str, requests: list[pb.CompleteRequest], concurrency: int, metadata):
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.ChatServiceStub(channel)
        for r in requests[:4]:  # warm up
            await stub.Complete(r, metadata=metadata)
        queue = list(requests)
        errors = 0

        async def client() -> None:
            nonlocal errors
            while queue:
                try:
                    await stub.Complete(queue.pop(), metadata=metadata)
                except grpc.aio.AioRpcError:
                    errors += 1

        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return len(requests) / (time.perf_counter() - began), errors


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 16])
    args = parser.parse_args()

    stack = corpus.start_stack()
    try:
        c = corpus.open_corpus(stack, 1000)
        db = Database(make_engine(c.url, pool_size=1))
        key = db.transact(lambda s: auth.create_key(s, c.tenant_id))
        db.dispose()
        endpoints = dataclasses.replace(stack.endpoints, database_url=c.url)
        metadata = (("authorization", f"Bearer {key}"),)
        requests = [
            pb.CompleteRequest(
                assistant_id=c.assistant_id,
                messages=[pb.ChatMessage(role=pb.ROLE_USER, content=q)],
            )
            for q, _ in corpus.questions(args.requests)
        ]
        results: dict[str, dict[int, tuple[float, int]]] = {}
        with main_tree() as tree, footnote_server(endpoints, None) as current:
            async with grpc.aio.insecure_channel(current) as channel:
                sample = await pb_grpc.ChatServiceStub(channel).Complete(
                    requests[0], metadata=metadata
                )
            env = {"PYTHONPATH": str(tree)}
            with (
                footnote_server(endpoints, None, cwd=tree, env=env) as previous,
                bare_unary(sample.SerializeToString()) as bare,
            ):
                for n in args.concurrency:
                    for name, target in (("main", previous), ("this", current), ("bare", bare)):
                        results.setdefault(name, {})[n] = await load(target, requests, n, metadata)
        print(f"unary Complete, extractive, {args.requests} requests, 1,000-chunk assistant")
        for n in args.concurrency:
            row = {name: results[name][n] for name in results}
            print(
                f"  concurrency {n:2d}: before {row['main'][0]:6.1f} req/s, this "
                f"{row['this'][0]:6.1f} req/s ({row['this'][0] / row['main'][0]:.2f}x before), "
                f"bare gRPC {row['bare'][0]:7.1f} req/s; errors "
                f"{row['main'][1]}/{row['this'][1]}/{row['bare'][1]}"
            )
    finally:
        stack.stop()


if __name__ == "__main__":
    os.environ.setdefault("FOOTNOTE_LOG_LEVEL", "WARNING")
    asyncio.run(main())
