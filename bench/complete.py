"""Unary Complete with the extractive generator: requests/s at concurrency 1 and 16.

    .venv/bin/python bench/complete.py
    .venv/bin/python bench/complete.py --vectors real --requests 80 --rounds 5 --concurrency 16

Servers on the same database, in the same run: this tree (once per event loop in `--loops`),
the code at `--baseline` (default: this branch's merge base with `main`; exported with
`git archive`: the baseline of the ratio), and a bare grpc.aio server that returns a
CompleteResponse of the same size (the ceiling). The assistant holds the 1,000-chunk corpus
of bench/corpus.py: pseudo-words by default, where the extractive generator finds nothing to
quote, or with `--vectors real` passages of manual pages asked real questions, which it
answers by quoting (about 900 distinct questions: ask for fewer requests and rounds). RAG and
citations are on. Every server is asked the same questions, and each round its own: a server
keeps recent questions' vectors.

The servers take turns, `--rounds` times per concurrency, each round's order rotated, and the
ratio printed is the median of the rounds' own ratios: on a machine whose speed drifts (a
shared host's 2 cores ran the same server at 43 and at 64 req/s a few minutes apart), servers
measured one after the other compared the drift as much as the code. Each round's steal time
(the CPU the hypervisor gave to other guests meanwhile) is printed too: a round that lost much
of it measured the host rather than the code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import corpus
import grpc
import psycopg
from harness import (
    CALL_SECONDS,
    ROOT,
    footnote_server,
    free_port,
    host_steal,
    loop_option,
    machine,
    process,
)

from footnote.v1 import chat_service_pb2 as pb
from footnote.v1 import chat_service_pb2_grpc as pb_grpc
from services import auth
from services.db.session import Database, make_engine

MAIN_TREE = Path("/tmp/fnbench-main")


@contextlib.contextmanager
def main_tree(
    revision: str | None = None, tree: Path = MAIN_TREE, *, newer_migrations: bool = False
) -> Iterator[Path]:
    """The code at revision (default: this branch's merge base with main), with its own stubs;
    with newer_migrations, also this tree's migrations that revision lacks."""
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    git = ["git", "-C", str(ROOT)]
    which = [*git, "rev-parse", revision] if revision else [*git, "merge-base", "HEAD", "main"]
    base = subprocess.run(which, check=True, capture_output=True, text=True).stdout.strip()
    archive = subprocess.run([*git, "archive", base], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    # A server brings the schema to head at start, and alembic stops at a revision it has no
    # script for: a baseline that shares a database with this tree (bench/ttft.py --compare)
    # gets this tree's newer migrations, so that it starts on the schema this tree migrated
    # (columns added since are nullable, and older code ignores them). A baseline with a
    # database of its own (this script's) keeps its own schema.
    versions = Path("services/db/migrations/versions")
    if newer_migrations:
        for script in sorted((ROOT / versions).glob("*.py")):
            if not (tree / versions / script.name).exists():
                shutil.copy(script, tree / versions / script.name)
    import grpc_tools

    protos = sorted(str(p.relative_to(tree / "proto")) for p in tree.glob("proto/**/*.proto"))
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
        cwd=tree,
        check=True,
    )
    yield tree


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
    with tempfile.TemporaryDirectory(prefix="fnbench-bare-") as directory:
        path = Path(directory) / "bare.py"
        path.write_text(code)
        with process([sys.executable, str(path)], port):
            yield f"127.0.0.1:{port}"


def baseline_database(url: str, tree: Path) -> str:
    """A copy of the corpus database for the baseline server, stamped at the newest migration
    the baseline knows: a server refuses a database migrated past its own head. This holds
    while the later migrations only add to the schema or store it differently (0007 keeps
    vectors in the row and rebuilds the HNSW index), which the baseline's queries ignore."""
    heads = [
        m.group(1)
        for f in (tree / "services/db/migrations/versions").glob("*.py")
        if (m := re.search(r'^revision = "([^"]+)"', f.read_text(), re.MULTILINE))
    ]
    source = url.rsplit("/", 1)[1]
    copy = f"{source}_baseline"
    server = url.rsplit("/", 1)[0]
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{copy}"')
        conn.execute(f'CREATE DATABASE "{copy}" TEMPLATE "{source}"')
    with psycopg.connect(f"{server}/{copy}", autocommit=True) as conn:
        conn.execute("UPDATE alembic_version SET version_num = %s", (max(heads),))
    return f"{server}/{copy}"


WARM_UP = 4


async def load(target: str, requests: list[pb.CompleteRequest], concurrency: int, metadata):
    """Requests/s over requests[WARM_UP:] at this concurrency, after the first WARM_UP alone."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.ChatServiceStub(channel)
        for r in requests[:WARM_UP]:
            await stub.Complete(r, metadata=metadata, timeout=CALL_SECONDS)
        queue = list(requests[WARM_UP:])
        errors = 0

        async def client() -> None:
            nonlocal errors
            while queue:
                try:
                    await stub.Complete(queue.pop(), metadata=metadata, timeout=CALL_SECONDS)
                except grpc.aio.AioRpcError:
                    errors += 1

        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return (len(requests) - WARM_UP) / (time.perf_counter() - began), errors


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="per server and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 16])
    parser.add_argument(
        "--baseline",
        help="the git revision to compare with (default: the merge base with main); the "
        "issue's 54 / 82 req/s were measured on f58d6f6",
    )
    parser.add_argument(
        "--vectors",
        choices=corpus.VECTORS,
        default="random",
        help="the corpus: pseudo-words (random, clustered), where the extractive generator "
        "finds nothing to quote, or passages of manual pages asked real questions (real)",
    )
    loop_option(parser, "event loops to run this tree's server on, each a server of its own")
    args = parser.parse_args()
    print(machine(), flush=True)

    stack = corpus.start_stack()
    try:
        c = corpus.open_corpus(stack, 1000, vectors=args.vectors)
        db = Database(make_engine(c.url, pool_size=1))
        key = db.transact(lambda s: auth.create_key(s, c.tenant_id))
        db.dispose()
        endpoints = dataclasses.replace(stack.endpoints, database_url=c.url)
        metadata = (("authorization", f"Bearer {key}"),)
        # Each round gets questions of its own: the server keeps recent questions' vectors, so
        # a question asked again (by the next round) skips the model.
        per_run = WARM_UP + args.requests
        rounds = len(args.concurrency) * args.rounds
        asked = [
            pb.CompleteRequest(
                assistant_id=c.assistant_id,
                messages=[pb.ChatMessage(role=pb.ROLE_USER, content=q)],
            )
            for q, _ in corpus.questions(per_run * rounds + 1, c)
        ]
        sample_request, asked = asked[-1], asked[:-1]
        runs = [asked[i * per_run : (i + 1) * per_run] for i in range(rounds)]
        # results[server][concurrency]: (req/s, errors) of each round
        results: dict[str, dict[int, list[tuple[float, int]]]] = {}
        steal: dict[int, list[float]] = {n: [] for n in args.concurrency}  # per round
        with contextlib.ExitStack() as running:
            tree = running.enter_context(main_tree(args.baseline))
            # The baseline gets its own copy of the corpus, before this tree's servers connect.
            before_endpoints = dataclasses.replace(
                stack.endpoints, database_url=baseline_database(c.url, tree)
            )
            servers = {
                f"this, {loop}": running.enter_context(
                    footnote_server(endpoints, None, event_loop=loop)
                )
                for loop in args.loops
            }
            async with grpc.aio.insecure_channel(next(iter(servers.values()))) as channel:
                sample = await pb_grpc.ChatServiceStub(channel).Complete(
                    sample_request, metadata=metadata, timeout=CALL_SECONDS
                )
            env = {"PYTHONPATH": str(tree)}
            servers = {
                "before": running.enter_context(
                    footnote_server(before_endpoints, None, cwd=tree, env=env)
                ),
                **servers,
                "bare gRPC": running.enter_context(bare_unary(sample.SerializeToString())),
            }
            names = list(servers)
            for i, n in enumerate(args.concurrency):
                for r in range(args.rounds):
                    questions = runs[i * args.rounds + r]
                    with host_steal() as share:
                        for name in names[r % len(names) :] + names[: r % len(names)]:
                            rate = await load(servers[name], questions, n, metadata)
                            results.setdefault(name, {}).setdefault(n, []).append(rate)
                    steal[n] += share
        print(
            f"unary Complete, extractive, {args.requests} requests x {args.rounds} rounds per "
            f"server, 1,000-chunk assistant ({args.vectors}); "
            f"before = {args.baseline or 'the merge base with main'}"
        )
        for n in args.concurrency:
            before = [rate for rate, _ in results["before"][n]]
            print(f"  concurrency {n:2d} (median of the rounds; the rounds' ratios):")
            for name, by_concurrency in results.items():
                rates = [rate for rate, _ in by_concurrency[n]]
                ratios = [rate / base for rate, base in zip(rates, before, strict=True)]
                errors = sum(e for _, e in by_concurrency[n])
                print(
                    f"    {name:16s} {statistics.median(rates):8.1f} req/s  "
                    f"{statistics.median(ratios):5.2f}x before "
                    f"({' '.join(f'{x:.2f}' for x in ratios)})  errors {errors}"
                )
            shares = " ".join(f"{x:.0%}" for x in steal[n])
            print(f"    the host's steal time in each round: {shares}")
    finally:
        stack.stop()


if __name__ == "__main__":
    os.environ.setdefault("FOOTNOTE_LOG_LEVEL", "WARNING")
    asyncio.run(main())
