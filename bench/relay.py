"""The StreamComplete relay against a bare grpc.aio server stream, at 1, 100 and 1,000 streams.

    .venv/bin/python bench/relay.py                       # 1 and 100 streams, 2,000 deltas
    .venv/bin/python bench/relay.py --streams 1000 --deltas 200
    .venv/bin/python bench/relay.py --streams 1000 --deltas 100 --pace-ms 20   # a model's pace

A scripted upstream streams `deltas` chunks per answer, one write each (with `--pace-ms`, one
every so many milliseconds, as a model produces them, and the echo likewise); Footnote relays them
(assistant with RAG off, so the relay alone is measured). The baseline is a bare grpc.aio
server streaming the same number of StreamCompleteResponse deltas. Both batches run in the
same run, alternately, `--rounds` times; printed per batch: upstream deltas relayed per second
(wall time of the whole batch), the ratio to the echo, failed calls, the p99 gap between
the delta messages of a stream, the median time to the first delta, and the p99 time from
the last delta to the end of the call (Footnote stores the exchange and sends the final
message then). A batch whose p99 gap is more than 10 ms over the echo's also says where its
longest gaps fell: when in the batch they began, after which message of their stream, and
when those streams got their first delta. Footnote runs once per event loop in `--loops`
(asyncio, uvloop).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import statistics
import time
from collections import Counter

import corpus
import grpc
from harness import (
    CALL_SECONDS,
    echo,
    footnote_server,
    loop_option,
    machine,
    make_assistant,
    percentile,
    upstream,
)

from footnote.v1 import chat_service_pb2 as pb
from footnote.v1 import chat_service_pb2_grpc as pb_grpc

# The target at 1,000 streams: the p99 gap within this much of the echo's. A round that misses it
# also prints where its longest gaps fell (long_gaps).
GAP_TARGET_MS = 10


async def one_stream(stub, request, metadata):
    """When the call began, when each delta arrived, the characters, when it ended."""
    began = time.perf_counter()
    stamps = []
    chars = 0
    async for message in stub.StreamComplete(request, metadata=metadata, timeout=CALL_SECONDS):
        if message.HasField("delta"):
            stamps.append(time.perf_counter())
            chars += len(message.delta.content)
    return began, stamps, chars, time.perf_counter()


async def batch(target: str, streams: int, request, metadata):
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.ChatServiceStub(channel)
        await channel.channel_ready()
        began = time.perf_counter()
        results = await asyncio.gather(
            *(one_stream(stub, request, metadata) for _ in range(streams)),
            return_exceptions=True,
        )
        wall = time.perf_counter() - began
    errors = Counter(
        f"{r.code().name}: {r.details()}" for r in results if isinstance(r, grpc.aio.AioRpcError)
    )
    errors.update(
        type(r).__name__
        for r in results
        if isinstance(r, BaseException) and not isinstance(r, grpc.aio.AioRpcError)
    )
    ok = [r for r in results if not isinstance(r, BaseException)]
    gaps = [length for length, _, _, _ in stream_gaps(ok)]
    first = [stamps[0] - start for start, stamps, _, _ in ok if stamps]
    # After the last delta Footnote still stores the exchange and sends the final message.
    tail = [end - stamps[-1] for _, stamps, _, end in ok if stamps]
    return wall, errors, gaps, first, ok, tail


def stream_gaps(ok):
    """Each gap between two delta messages of a stream: its length, when it began, the number of
    the message it follows, and how long after its call the stream's first delta came."""
    for began, stamps, _, _ in ok:
        for i, (a, b) in enumerate(itertools.pairwise(stamps), start=1):
            yield b - a, a, i, stamps[0] - began


def long_gaps(ok) -> str:
    """Where a batch's longest gaps fall: those at or over its p99, which decide the figure.

    A stream of few (coalesced) messages has few gaps, so its p99 is decided by a few dozen
    of them; this says whether they came together (one moment of the batch, a group of streams
    waiting at once) and after which of their streams' messages.
    """
    start = min(began for began, _, _, _ in ok)
    gaps = [(length, at - start, i, first) for length, at, i, first in stream_gaps(ok)]
    p99 = percentile([g[0] for g in gaps], 99)
    longest = [g for g in gaps if g[0] >= p99]
    begins = [g[1] for g in longest]
    after, count = Counter(g[2] for g in longest).most_common(1)[0]
    return (
        f"the {len(longest)} gaps at or over the p99 began {percentile(begins, 10):.2f} to "
        f"{percentile(begins, 90):.2f} s into the batch (10th to 90th percentile), "
        f"{count} of them after their stream's message {after}; those streams' first delta "
        f"p50 {statistics.median(g[3] for g in longest):.2f} s"
    )


def summary(name, deltas, streams, wall, errors, gaps, first, ok, tail):
    rate = streams * deltas / wall
    first_ms = statistics.median(first) * 1000 if first else float("nan")
    print(
        f"  {name:16s} {rate:9,.0f} deltas/s  wall {wall:6.2f} s  errors {sum(errors.values())}"
        f"{' ' + str(dict(errors)) if errors else ''}  p99 gap between deltas "
        f"{percentile(gaps, 99) * 1000:6.1f} ms  first delta p50 {first_ms:7.1f} ms  last "
        f"delta to end p99 {percentile(tail, 99) * 1000:6.1f} ms"
    )
    return rate


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, nargs="*", default=[1, 100])
    parser.add_argument("--deltas", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--pace-ms",
        type=float,
        default=0.0,
        help="time between tokens, upstream and echo alike, as a model paces them (0: none)",
    )
    loop_option(
        parser, "event loops to run Footnote on, each a server of its own (FOOTNOTE_EVENT_LOOP)"
    )
    args = parser.parse_args()
    print(machine(), flush=True)

    stack = corpus.start_stack(corpus.state_dir().with_name("fnbench-relay"))
    try:
        endpoints = stack.endpoints
        key, assistant = make_assistant(
            endpoints.database_url, "bench-relay", enable_rag=False, enable_citations=False
        )
        request = pb.CompleteRequest(
            assistant_id=assistant,
            messages=[pb.ChatMessage(role=pb.ROLE_USER, content="Tell me a long story.")],
        )
        metadata = (("authorization", f"Bearer {key}"),)
        with contextlib.ExitStack() as running:
            llm = running.enter_context(upstream(args.deltas, pace_ms=args.pace_ms))
            bare = running.enter_context(echo(args.deltas, pace_ms=args.pace_ms))
            # A batch of long answers on 2 busy cores can outlast the default answer deadline.
            relays = {
                f"footnote {loop}": running.enter_context(
                    footnote_server(endpoints, llm, llm_timeout_seconds="600", event_loop=loop)
                )
                for loop in args.loops
            }
            paced = f", one every {args.pace_ms:g} ms" if args.pace_ms else ""
            print(f"relay: {args.deltas:,} upstream deltas per stream{paced}, {args.rounds} rounds")
            for target in (bare, *relays.values()):  # connections and the pool warm up
                await batch(target, 4, request, metadata)
            for streams in args.streams:
                print(f"{streams} concurrent streams")
                ratios: dict[str, list[float]] = {name: [] for name in relays}
                for _ in range(args.rounds):
                    e = await batch(bare, streams, request, metadata)
                    echo_rate = summary("echo", args.deltas, streams, *e)
                    for name, relay in relays.items():
                        f = await batch(relay, streams, request, metadata)
                        rate = summary(name, args.deltas, streams, *f)
                        assert all(r[2] == args.deltas * len("word ") for r in f[4]), "text lost"
                        ratios[name].append(rate / echo_rate)
                        messages = statistics.fmean(len(r[1]) for r in f[4])
                        gap_diff = (percentile(f[2], 99) - percentile(e[2], 99)) * 1000
                        print(
                            f"    {messages:,.0f} delta messages a stream for {args.deltas:,} "
                            f"upstream deltas; ratio to the echo {ratios[name][-1]:.2f}, p99 gap "
                            f"between deltas {gap_diff:+.1f} ms over the echo's"
                        )
                        if gap_diff > GAP_TARGET_MS:
                            print(f"    {long_gaps(f[4])}")
                for name, values in ratios.items():
                    print(
                        f"  {name}: median ratio over {args.rounds} rounds "
                        f"{statistics.median(values):.2f}"
                    )
    finally:
        stack.stop()


if __name__ == "__main__":
    asyncio.run(main())
