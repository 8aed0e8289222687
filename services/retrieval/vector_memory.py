"""Exact vector search over a large assistant's chunks, held in this process's memory.

HNSW finds the nearest chunks only where vectors cluster, as embeddings of documents do: on
vectors without that structure (random unit vectors, the hard case) pgvector's index found
0.11-0.15 of the exact top 10 at `ef_search` 100 and 0.36-0.43 at 400, and any graph reaches
0.95 there only by walking more than the exact scan it replaces. That scan in Postgres reads
the assistant's rows one by one (about 100 ms at 100k chunks). Held in memory as 8-bit codes
(a scale per vector), the same 100k chunks of 384 dimensions are scored in about 1.8 ms on one
core (onnxruntime's MatMulInteger, which the embedding model already brings; numpy's float32 product
took 4.5 ms and four times the memory, its 8-bit one 30 ms), 3.1-4.7 ms on cores with AMX
(`Scorer`), and there 2.3-3.5 ms on two threads (SCAN_THREADS). A copy of WIDE_MIN_CHUNKS or
more is held as 4-bit codes instead where the machine scores them faster (`Nibbles`: 1.7-2.1
ms there with a pause between questions, where the 8-bit codes took 4.0-4.9, half the bytes
read). The best CANDIDATES_PER_RESULT
times the wanted count are then ranked by Postgres on their stored vectors, in the statement
that reads their rows: the cosines are pgvector's own, as exact search gives them. On 50
questions of each 100k corpus the exact ten nearest were all among the 64 best codes for random
and clustered vectors, 0.96 of them for real embeddings (where many chunks are exact copies of
one another, and which copy counts is arbitrary).

So an assistant searched through HNSW (more than search.EXACT_MAX_CHUNKS chunks) is loaded into
memory, in the background, at its first question, and its searches are answered here as soon as
the copy is loaded (0.6-0.8 s at 100k chunks). Once it has been asked ASKED_BEFORE_CHECK
questions, its HNSW walk is checked against exact search on them (and on questions made from
its chunks). Where the walk finds nearly all of the exact nearest (embeddings of real
documents: 0.996 at 100k chunks), the copy is dropped and HNSW, which is faster, serves from
then on; where it misses (random vectors: 0.28), the copy goes on serving. Loaded only once the
questions to judge the walk on had been asked, as before, a copy left a new process's first
questions to the walk: at 100k random vectors, asked five a second, the first ten found 0.12 of
the exact ten, and the copy served from the 29th; loaded at once, from the 5th. A question that
finds the copy on its way waits for it (up to WAIT_SECONDS) unless the walk was found good:
walking, questions asked back to back all fell within the load. The price is a
load (under a second of a core per 100k chunks) for a large assistant asked only once or twice,
which the budget's least recently used order bounds. An assistant larger than the whole budget
(FOOTNOTE_VECTOR_MEMORY_MB; 1M chunks take 385 MB) stays on HNSW. A walk judged on some
questions can miss on others: an assistant asked about what its documents do not hold (nothing
near) is walked through a part of the graph it was not judged on. So the questions asked after
a verdict are watched: one whose walk's best cosine is well below those of the questions judged
is unlike them, and once UNLIKE_BEFORE_RECHECK of them have been asked, the walk is checked
again on the questions asked since the first of them.

Written here rather than taken from a vector library because what is the product's own is
knowing when the copy is still the assistant's: a copy records the version of the assistant's
set of READY documents it was loaded from (`document_set_versions`, which Postgres's triggers
bump at the commit of any change to a document that is or becomes READY and undeleted:
migration 0009), and each search reads the current version in the statement that reads its
winners' rows. A copy whose version is not the current one is dropped (that search, and the
next until a fresh copy is loaded, goes to Postgres), so a search never misses a new document
or returns a deleted one.

A smaller assistant, which Postgres searches exactly (search.EXACT_MAX_CHUNKS), is held too
once it has been asked EXACT_ASKED_BEFORE_LOAD questions, with no check: there is no walk to
judge, and the same exact search costs Postgres less from here. At 1,000 chunks the statement
that ranks the held candidates took 1.06 ms where the exact scan took 2.93 (Postgres's own
timing, median of 200 questions); unary Complete on such an assistant at concurrency 16
served 1.12x the requests, Postgres's CPU a request 6.2-7.4 -> 4.9-5.8 ms. A copy loaded for
one kind of search is not used for the other: an assistant whose own HNSW index is built
while it is held goes to the check like any other.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

import numpy as np
import onnxruntime
from onnx import TensorProto, helper
from pgvector import Vector
from sqlalchemy import Engine, Row, text
from sqlalchemy.orm import Session

from services.config import available_cpus

log = logging.getLogger(__name__)

# A copy that turned out stale is loaded again at most this often: an assistant whose
# documents change all the time is searched through Postgres meanwhile, not loaded again
# after every change (loading 100k chunks takes 0.6-0.8 s of a core).
RELOAD_SECONDS = 30.0
# A load that failed is tried again after this long.
RETRY_SECONDS = 60.0
# Once an assistant is held, its HNSW walk is checked against exact search on PROBES
# questions: the last ones the assistant was asked, and as many as are missing made from its
# chunks (each a chunk's vector turned PROBE_TURN in a random direction, as a question lies
# near a passage that answers it). Where the walk finds at least GOOD_RECALL of the exact ten
# nearest (ties with the tenth count), it keeps serving the assistant, which it does sooner
# (2.7 against 4.3 ms at 100k chunks of real embeddings), and the copy is dropped; the verdict
# stands for INDEX_VERDICT_SECONDS or until the assistant has twice the chunks. Made-up
# questions alone misjudge: at 100k chunks the walk found, for chunks turned 0 / 15 / 30 / 45
# degrees, random vectors 0.39 / 0.39 / 0.34 / 0.24, clustered 0.998 / 0.996 / 0.972 / 0.992,
# real embeddings of manual pages 0.978 / 0.980 / 0.960 / 0.940 (0.984 on their real
# questions); at 1M clustered chunks 0.966 at 15 degrees where bench/search.py's questions got
# 0.907. So the check waits for ASKED_BEFORE_CHECK questions, or PROBE_WAIT_SECONDS after the
# first; the copy serves meanwhile.
ASKED_BEFORE_CHECK = 20
# A smaller assistant is held from its second question: loading it reads every vector, about as
# much as one exact search does, so an assistant asked once is not loaded.
EXACT_ASKED_BEFORE_LOAD = 2
PROBE_WAIT_SECONDS = 30.0
PROBES = 50
# The questions of at most this many assistants are kept for the check (the most recently
# asked; 75 kB each at 384 dimensions).
ASKING_ASSISTANTS = 256
# ... and the count of questions of at most this many smaller assistants not yet held.
ASKING_EXACT_ASSISTANTS = 4096
PROBE_TURN = np.radians(15)
GOOD_RECALL = 0.95
INDEX_VERDICT_SECONDS = 3600.0
# A question asked after a verdict is unlike those judged when its walk's best cosine is below
# UNLIKE_SHARE of theirs (the median of their exact nearest). On bench/search.py's 100k corpora,
# the exact nearest cosine of the assistant's questions: clustered 0.60-0.62 (0.31 for one), of
# a tenth-size assistant asked the large one's questions (nothing of its own near) 0.15-0.19,
# where its walk found 0.887 of the exact ten; real embeddings 0.39-0.76, median 0.76. Judged
# on the minimum of the first 20 instead, 8-16% (clustered) and 34% (real) of the later
# questions of the same kind counted as unlike. Each verdict allows MAX_RECHECKS such checks
# (each one a load): questions that keep wandering cost at most that many loads an hour.
UNLIKE_SHARE = 0.5
UNLIKE_BEFORE_RECHECK = 10
MAX_RECHECKS = 3
# Cosines this close are one (float32 in memory, pgvector's own arithmetic in Postgres).
TIE_TOLERANCE = 1e-5
# Rows read from the COPY and coded at a time while loading (about 8 MB of it).
LOAD_BATCH_ROWS = 5_000
# Chunks scored from their codes per chunk wanted (at least MIN_CANDIDATES), ranked exactly by
# Postgres: at 100k random vectors, 2 per chunk took the vector search 3.9 ms, 4 took 4.9, both
# finding every exact neighbour of 40 questions.
CANDIDATES_PER_RESULT = 2
MIN_CANDIDATES = 100
# A question asked while an assistant's copy is being loaded, and whose walk is not known to be
# good (never judged, or judged to miss), waits up to WAIT_SECONDS for the copy rather than
# walking, when the assistant has at most WAIT_MAX_CHUNKS chunks (a load of 100k takes 0.6-0.8 s
# of a core; beyond, the first questions would wait longer than the walk costs them). Walked,
# the questions of a new process asked back to back, one every 7 ms at 100k random vectors, all
# fell within the load and found 0.13 of the exact ten.
WAIT_SECONDS = 2.0
WAIT_MAX_CHUNKS = 200_000
# Codes are kept in blocks of this many chunks (6 MB), onnxruntime scoring a block per call, so
# that a load never holds a second copy of all the codes. Scoring is bound by memory, about
# 1.8 ms per 100k chunks whatever the blocks (one call over all of them, batched: the same).
BLOCK_CHUNKS = 16_384

# The digest of an assistant's READY documents: the version of their set (0 until the first
# change). Read by key, it costs the same however many documents the assistant holds, where a
# hash of every READY row's id and `xmin`, as before, took 0.9 ms at 1,000 documents and 6-10
# ms at 10,000 on each search.
DIGEST = """
    SELECT coalesce(
      (SELECT v.version FROM document_set_versions v WHERE v.assistant_id = :assistant), 0
    ) AS digest
"""


class Walk(Protocol):
    """The cosines of the chunks the assistant's vector index finds for a vector."""

    def __call__(
        self, s: Session, tenant_id: str, assistant_id: str, vector: Sequence[float], limit: int
    ) -> list[float]: ...


@dataclass
class Verdict:
    """An assistant whose HNSW walk was found good enough, and what it was asked since."""

    chunks: int  # the assistant's chunks when it was judged
    until: float  # when the verdict lapses
    near: float  # a question whose walk's best cosine is below this is unlike those judged
    rechecks: int = 0  # checks started since by unlike questions
    asked: int = 0  # questions asked since the verdict (or since its last check)
    unlike: int = 0  # how many of them were unlike those judged
    first_unlike: int = 0  # which of them (counting from 1) was the first unlike one

    def watching(self, chunks: int, now: float) -> bool:
        """Whether the verdict still stands for an assistant of this many chunks."""
        return now < self.until and chunks <= 2 * self.chunks


@dataclass(frozen=True)
class Digest:
    version: int  # of the assistant's set of READY documents


@dataclass
class HeldAssistant:
    """One assistant's searchable chunks: their ids, and their unit vectors as 8-bit codes."""

    digest: Digest
    ids: np.ndarray  # (n, 16) uint8: each chunk id's bytes
    blocks: list[np.ndarray]  # m chunks' codes each, in the layout of `scorer()`
    scales: np.ndarray  # (n,) float32: a chunk's vector is its codes times its scale
    offsets: np.ndarray  # (n,) int32: 128 times the sum of a chunk's codes (`Scorer.products`)
    used: float = field(default_factory=time.monotonic)
    stale: bool = False
    exact: bool = False  # held in place of Postgres's exact search, not of an HNSW walk
    # Whether the assistant's HNSW walk has been checked against this copy: one loaded at an
    # assistant's first question serves it until enough questions were asked to judge the walk.
    judged: bool = True
    # A large copy's vectors as 4-bit codes (`Nibbles`), in place of the blocks, scales and
    # offsets, which are then empty.
    nibbles: Nibbles | None = None

    @property
    def chunks(self) -> int:
        return len(self.ids)

    @property
    def dim(self) -> int:
        if self.nibbles is not None:
            return self.nibbles.dim
        return scorer().dim(self.blocks[0]) if self.blocks else 0

    @property
    def nbytes(self) -> int:
        arrays = (self.ids, self.scales, self.offsets, *self.blocks)
        held = self.nibbles.nbytes if self.nibbles is not None else 0
        return held + sum(a.nbytes for a in arrays)

    def candidates(self, query: Sequence[float], limit: int) -> list[str]:
        """The ids of the chunks whose codes score best against the query, in no order, enough
        of them to hold the `limit` nearest by cosine, the codes' rounding notwithstanding.

        Each id is its 32 hex digits, which Postgres reads as a uuid: making 128 uuid.UUID
        objects took 0.43 ms, on the path to an answer's first delta."""
        if self.chunks == 0 or limit <= 0:
            return []
        count = max(CANDIDATES_PER_RESULT * limit, MIN_CANDIDATES)
        query = np.asarray(query, np.float32)
        if self.nibbles is not None:
            score = self.nibbles.scores(query)
        else:
            score = scorer().products(self.blocks, self.offsets, query)
            score *= self.scales
        cut = self.chunks - count
        top = np.argpartition(score, cut)[cut:] if cut > 0 else slice(None)
        return self.ids_at(top)

    def ids_at(self, rows: Any) -> list[str]:
        """The ids of these chunks (an index of rows), each as the 32 hex digits Postgres reads
        as a uuid."""
        digits = self.ids[rows].tobytes().hex()
        return [digits[i : i + 32] for i in range(0, len(digits), 32)]


def encode(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unit vectors (rows) as int8 codes and a scale each (the largest component is 127), and
    each one's offset in `Scorer.products`."""
    scales = np.abs(vectors).max(axis=1) / 127
    codes = np.round(vectors / scales[:, None]).astype(np.int8)
    return codes, scales.astype(np.float32), 128 * codes.sum(axis=1, dtype=np.int32)


@dataclass(frozen=True)
class Scorer:
    """Products of a question's 8-bit codes with a copy's, by onnxruntime's MatMulInteger,
    uint8 by int8, the product it computes fast (int8 by int8 took 20 times as long, a zero
    point of 128 given to the operator 2.5 times). The codes are held in one of two layouts:

    - columns: the question's codes plus 128 (A, uint8 [1, dim]) times a block's codes column
      by column (B, int8 [dim, m]), less each chunk's offset, 128 times the sum of its codes;
    - rows: a block's codes plus 128 chunk by chunk (A, uint8 [m, dim]) times the question's
      codes (B, int8 [dim, 1]), less 128 times the sum of the question's codes.

    Both give the same products; which is faster depends on the CPU, so the process measures
    both (`scorer`). On AVX2 and AVX-512 cores the columns took 1.7-1.8 ms per 98,304 chunks.
    On a Xeon with AMX onnxruntime's kernel repacks its B at every call: the columns took
    10.6-11.7 ms there, the rows 3.1-4.7 ms.

    A copy of WIDE_MIN_CHUNKS or more is scored by `wide`, the same product on SCAN_THREADS
    threads, which onnxruntime splits chunk by chunk (`_session`), or held as 4-bit codes
    instead where this machine scores those faster (`nibbles_faster`, `Nibbles`).
    """

    session: onnxruntime.InferenceSession
    rows: bool
    wide: onnxruntime.InferenceSession | None = None

    def block(self, codes: np.ndarray) -> np.ndarray:
        """Chunks' int8 codes, a chunk a row, as a block of this layout."""
        if self.rows:
            return codes.view(np.uint8) ^ np.uint8(0x80)  # each code plus 128
        return np.ascontiguousarray(codes.T)

    def dim(self, block: np.ndarray) -> int:
        return int(block.shape[1] if self.rows else block.shape[0])

    def products(
        self, blocks: list[np.ndarray], offsets: np.ndarray, query: np.ndarray
    ) -> np.ndarray:
        """Each chunk's codes times the query's codes, in block order; offsets: the chunks'
        (`encode`). As float32, which the search scales and selects from in place: taken as
        int32 and scaled into float64, a held search's candidates at 98,304 chunks took 0.3-0.5
        ms longer p50 (5.58 against 5.24 and 6.15 against 5.68 ms, in turn, with 20 ms pauses
        between questions, on a Xeon with AMX). Float32 holds the products exactly up to 518
        dimensions (at most 255 * 127 * dim, under 2**24); beyond, within a relative 6e-8,
        far finer than the codes' own rounding."""
        peak = float(np.abs(query).max())
        step = peak / 127 if peak > 0 else 1.0
        codes = np.round(query / step)
        wide = self.wide is not None and len(offsets) >= WIDE_MIN_CHUNKS
        session = self.wide if wide else self.session
        if self.rows:
            b = codes.astype(np.int8)[:, None]
            run = [session.run(None, {"A": block, "B": b})[0][:, 0] for block in blocks]
            products = np.concatenate(run, dtype=np.float32)
            products -= 128 * int(codes.sum())
            return products
        a = (codes + 128).astype(np.uint8)[None, :]
        run = [session.run(None, {"A": a, "B": block})[0][0] for block in blocks]
        products = np.concatenate(run, dtype=np.float32)
        products -= offsets
        return products


# The scorer's layouts are timed on this many chunks of the local model's dimensions, each
# layout's best of SCORER_TRIALS runs: about 40 ms at a process's first load.
SCORER_TRIAL_CHUNKS = 16_384
SCORER_TRIALS = 5
# A copy of at least WIDE_MIN_CHUNKS chunks is scored on SCAN_THREADS threads, the products
# being the longest step of its search after the question's embedding. On a Xeon with AMX, in
# the rows layout, per question (p50 of runs in turn, one thread against two):
#   chunks   wall (ms)        CPU (ms)
#   5,000    0.22 -> 0.16     0.23 -> 0.26
#   16,384   0.60 -> 0.50     0.64 -> 0.90
#   32,768   1.24 -> 0.92     1.34 -> 1.60
#   65,536   2.62 -> 2.04     2.82 -> 3.62
#   98,304   4.97 -> 3.51     4.95 -> 6.51   (in another hour 5.43 -> 2.33 and 5.56 -> 3.96)
# and in a search at 100k chunks, its codes no longer in the cache, 6.61 -> 3.84 ms. Smaller
# copies stay on one thread, where the second saves at most a third of a millisecond for 13-40%
# more CPU. Beyond two threads a search would take cores from the other questions being
# answered beside it. A copy of WIDE_MIN_CHUNKS or more is held in 4 bits where the machine
# scores them faster (`Nibbles`; each such copy has a session of its own, so this bounds their
# count too: at most 18 in the default budget).
WIDE_MIN_CHUNKS = 4 * BLOCK_CHUNKS
SCAN_THREADS = min(2, available_cpus())

_scorer_lock = threading.Lock()
_scorer: Scorer | None = None
_nibbles: bool | None = None


def scorer() -> Scorer:
    """The layout this machine scores faster, measured at the first call."""
    global _scorer
    if _scorer is not None:
        return _scorer
    with _scorer_lock:
        if _scorer is None:
            chosen = _faster(_session(rows=False), _session(rows=True))
            if SCAN_THREADS > 1:
                wide = _session(rows=chosen.rows, threads=SCAN_THREADS)
                chosen = replace(chosen, wide=wide)
            _scorer = chosen
        return _scorer


def nibbles_faster() -> bool:
    """Whether this machine scores large copies faster as 4-bit codes (`_nibbles_faster`),
    measured when the first copy that may take them is loaded: a process that never holds one
    never pays for the trial."""
    global _nibbles
    if _nibbles is not None:
        return _nibbles
    chosen = scorer()  # outside the lock, which scorer() takes itself
    with _scorer_lock:
        if _nibbles is None:
            _nibbles = _nibbles_faster(chosen)
        return _nibbles


def _faster(columns: onnxruntime.InferenceSession, rows: onnxruntime.InferenceSession) -> Scorer:
    rng = np.random.default_rng(0)
    codes = rng.integers(-127, 128, size=(SCORER_TRIAL_CHUNKS, 384), dtype=np.int8)
    offsets = 128 * codes.sum(axis=1, dtype=np.int32)
    query = rng.standard_normal(384).astype(np.float32)
    layouts = [Scorer(columns, rows=False), Scorer(rows, rows=True)]
    best = _best_times([partial(s.products, [s.block(codes)], offsets, query) for s in layouts])
    chosen = min(range(len(layouts)), key=best.__getitem__)
    log.info(
        "vector memory: codes held by %s (%.2f ms per %d chunks; the other layout %.2f ms)",
        "rows" if layouts[chosen].rows else "columns",
        best[chosen] * 1000,
        SCORER_TRIAL_CHUNKS,
        best[1 - chosen] * 1000,
    )
    return layouts[chosen]


def _best_times(runs: Sequence[Callable[[], object]]) -> list[float]:
    """Each run's best time of SCORER_TRIALS, the runs taking turns so that all of them see the
    same drift of the machine."""
    best = [float("inf")] * len(runs)
    for _ in range(SCORER_TRIALS):
        for i, run in enumerate(runs):
            began = time.perf_counter()
            run()
            best[i] = min(best[i], time.perf_counter() - began)
    return best


def _session(*, rows: bool, threads: int = 1) -> onnxruntime.InferenceSession:
    """A one-node graph, MatMulInteger of the layout's A and B, on this many threads (their
    idle ones sleep: the process also serves gRPC)."""
    if rows:
        a = helper.make_tensor_value_info("A", TensorProto.UINT8, ["chunks", "dim"])
        b = helper.make_tensor_value_info("B", TensorProto.INT8, ["dim", 1])
        y = helper.make_tensor_value_info("Y", TensorProto.INT32, ["chunks", 1])
    else:
        a = helper.make_tensor_value_info("A", TensorProto.UINT8, [1, "dim"])
        b = helper.make_tensor_value_info("B", TensorProto.INT8, ["dim", "chunks"])
        y = helper.make_tensor_value_info("Y", TensorProto.INT32, [1, "chunks"])
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["A", "B"], ["Y"])], "codes", [a, b], [y]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # what onnxruntime releases of a year ago read
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _nibbles_faster(chosen: Scorer) -> bool:
    """Whether WIDE_MIN_CHUNKS chunks score faster as 4-bit codes than in the chosen layout,
    each on SCAN_THREADS threads, the best of SCORER_TRIALS runs in turn (random codes: about
    0.2 s, once). False where onnxruntime cannot run MatMulNBits."""
    rng = np.random.default_rng(0)
    dim = 384
    # Random bytes: numpy makes them at memory speed, where its integers took 90 ms.
    codes = np.frombuffer(rng.bytes(WIDE_MIN_CHUNKS * dim), np.int8).reshape(-1, dim)
    blocks = [chosen.block(codes[i : i + BLOCK_CHUNKS]) for i in range(0, len(codes), BLOCK_CHUNKS)]
    offsets = 128 * codes.sum(axis=1, dtype=np.int32)
    del codes
    shape = (WIDE_MIN_CHUNKS, -(-dim // NIBBLE_BLOCK), NIBBLE_BLOCK // 2)
    query = rng.standard_normal(dim).astype(np.float32)
    try:
        nibbles = Nibbles.made(
            dim,
            np.frombuffer(rng.bytes(np.prod(shape)), np.uint8).reshape(shape),
            rng.random(shape[:2], dtype=np.float32) / 100,
        )
        best = _best_times(
            [lambda: chosen.products(blocks, offsets, query), lambda: nibbles.scores(query)]
        )
    except Exception:  # an onnxruntime without the operator: the 8-bit codes serve
        log.warning("vector memory: MatMulNBits failed; copies held in 8 bits", exc_info=True)
        return False
    log.info(
        "vector memory: copies of %d chunks or more held in %s (%.2f ms per %d chunks in 4 "
        "bits, %.2f in 8)",
        WIDE_MIN_CHUNKS,
        "4 bits" if best[1] < best[0] else "8 bits",
        best[1] * 1000,
        WIDE_MIN_CHUNKS,
        best[0] * 1000,
    )
    return best[1] < best[0]


# Dimensions per scale of the 4-bit codes. On 98,304 chunks (random unit vectors, clustered
# ones shaped like documents' embeddings) and 40,000 real embeddings of manual-page passages,
# the exact ten nearest of every question were among the best 64 by these codes with 32, 64 or
# 128 dimensions a scale (ties with the tenth counted, as exact copies of a passage make them);
# 128 keeps the fewest scales: 4 bytes a chunk, and the same time.
NIBBLE_BLOCK = 128
# What a copy's onnxruntime session holds besides the codes: 1.1 MB each, measured over 50
# sessions of 6,000 chunks.
NIBBLE_SESSION_BYTES = 5 * 2**18


@dataclass(frozen=True)
class Nibbles:
    """A large copy's unit vectors as 4-bit codes, one scale per NIBBLE_BLOCK dimensions,
    scored by onnxruntime's MatMulNBits: the operator of 4-bit language models' weights, in
    every CPU build (com.microsoft), whose kernels are made for one row (here the question,
    rounded to 8 bits per block: accuracy_level 4) against many columns. It takes the codes
    as a constant, which it packs once, when the copy's session is made: a session per copy,
    on SCAN_THREADS threads.

    On the Xeon with AMX, 98,304 chunks with 20 ms between questions, as a server asks them:
    1.7-2.1 ms (a scale per 32 or 128 dimensions; 3.5-3.9 ms of CPU) where the 8-bit codes
    took 4.0-4.9 (6.6-8.4 of CPU), half the bytes to read from memory; at 40,000 chunks
    0.9-1.0 against 3.2-3.3 ms. The candidates are ranked on their stored vectors by Postgres
    as before, so the codes' coarser rounding changes which chunks are looked at, never their
    cosines.

    Memory: the codes and scales here (204 bytes a chunk at 384 dimensions), which onnxruntime
    is given where they are (they must outlive its session), and its packed copy with a sum
    per block (232 bytes a chunk, measured at 400,000 chunks): 452 bytes a chunk with the id,
    where 8-bit codes take 408, and the session's own 1.1 MB (NIBBLE_SESSION_BYTES).
    """

    dim: int
    codes: np.ndarray  # (n, blocks, NIBBLE_BLOCK // 2) uint8: two codes a byte, each plus 8
    scales: np.ndarray  # (n * blocks,) float32
    session: onnxruntime.InferenceSession

    @classmethod
    def of(cls, vectors: np.ndarray) -> Nibbles:
        """Unit vectors (rows), coded (`nibble_codes`) and given a session."""
        codes, scales = nibble_codes(vectors)
        return cls.made(vectors.shape[1], codes, scales)

    @classmethod
    def made(cls, dim: int, codes: np.ndarray, scales: np.ndarray) -> Nibbles:
        """Codes and scales (`nibble_codes`, of any number of batches joined) and a session."""
        scales = np.ascontiguousarray(scales.reshape(-1))
        return cls(dim, codes, scales, _nibble_session(codes, scales))

    @property
    def nbytes(self) -> int:
        return nibble_bytes(*self.codes.shape[:2])

    def scores(self, query: np.ndarray) -> np.ndarray:
        """Each chunk's cosine with the query (a unit vector), as its codes give it (float32)."""
        a = np.zeros((1, self.codes.shape[1] * NIBBLE_BLOCK), np.float32)
        a[0, : self.dim] = query
        scores: np.ndarray = self.session.run(None, {"A": a})[0][0]
        return scores


def nibble_bytes(chunks: int, blocks: int) -> int:
    """What 4-bit codes of this many chunks of this many blocks hold: the codes and scales
    here, and onnxruntime's packed copy of them with a sum per block (4 bytes a block besides
    its scale), and the session."""
    return chunks * blocks * (2 * NIBBLE_BLOCK // 2 + 4 * 4) + NIBBLE_SESSION_BYTES


def nibble_codes(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors (rows) as 4-bit codes, two a byte (the first in the low half), and a scale
    per NIBBLE_BLOCK dimensions (the block's largest component is 7 times it; a code is the
    component's multiple of it plus 8, as MatMulNBits reads a code with no zero point given),
    the last block padded with zeros."""
    n, dim = vectors.shape
    blocks = -(-dim // NIBBLE_BLOCK)
    padded = np.zeros((n, blocks * NIBBLE_BLOCK), np.float32)
    padded[:, :dim] = vectors
    parts = padded.reshape(n, blocks, NIBBLE_BLOCK)
    scales = np.abs(parts).max(axis=2) / 7
    steps = np.where(scales > 0, scales, 1)[:, :, None]
    codes = (np.clip(np.round(parts / steps), -8, 7) + 8).astype(np.uint8)
    return codes[:, :, 0::2] | (codes[:, :, 1::2] << 4), scales.astype(np.float32)


def _nibble_session(codes: np.ndarray, scales: np.ndarray) -> onnxruntime.InferenceSession:
    """A one-node graph: the question (A, float32 [1, dim padded]) times the codes, given to
    onnxruntime as they are (external initializers) rather than copied into the graph."""
    n, blocks, half = codes.shape

    def constant(name: str, kind: int, shape: list[int]) -> TensorProto:
        tensor = helper.make_tensor(name, kind, [0], [])
        del tensor.dims[:]
        tensor.dims.extend(shape)
        tensor.data_location = TensorProto.EXTERNAL
        tensor.external_data.add(key="location", value="given")
        return tensor

    node = helper.make_node(
        "MatMulNBits",
        ["A", "B", "scales"],
        ["Y"],
        domain="com.microsoft",
        K=blocks * NIBBLE_BLOCK,
        N=n,
        bits=4,
        block_size=NIBBLE_BLOCK,
        accuracy_level=4,
    )
    graph = helper.make_graph(
        [node],
        "nibbles",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, blocks * NIBBLE_BLOCK])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, n])],
        initializer=[
            constant("B", TensorProto.UINT8, [n, blocks, half]),
            constant("scales", TensorProto.FLOAT, [n * blocks]),
        ],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)],
    )
    model.ir_version = 8
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = SCAN_THREADS
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_external_initializers(
        ["B", "scales"],
        [
            onnxruntime.OrtValue.ortvalue_from_numpy(codes),
            onnxruntime.OrtValue.ortvalue_from_numpy(scales),
        ],
    )
    return onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def copy_bytes(chunks: int, dim: int, *, nibbles: bool = False) -> int:
    """What a copy of this many chunks holds, before it is loaded (HeldAssistant.nbytes): in 8
    bits a code byte per dimension, and an id (16 bytes), a scale and an offset (4 each) per
    chunk; in 4 bits (`Nibbles`) the id, the codes and scales twice over (here and in
    onnxruntime's packed copy, which adds a sum per block) and the session."""
    if not nibbles:
        return chunks * (dim + 24)
    return chunks * 16 + nibble_bytes(chunks, -(-dim // NIBBLE_BLOCK))


def digest_of(row: Row[Any]) -> Digest:
    """The digest in a row that holds DIGEST's columns."""
    return Digest(int(row.digest))


class VectorMemory:
    """Assistants' vectors held for exact search, within a budget of bytes, least recently
    searched dropped first. Loads run one at a time on a thread of their own."""

    def __init__(self, budget_bytes: int, searchable_sql: str, walk: Walk) -> None:
        self.budget_bytes = budget_bytes
        # The WHERE clause of a search (search.SEARCHABLE: the assistant's servable documents).
        self.searchable_sql = searchable_sql
        self.walk = walk
        # Assistants whose index was found good enough.
        self._index_good: dict[tuple[str, str, str], Verdict] = {}
        # The last questions asked of assistants not held, and when the first was.
        self._asked: OrderedDict[tuple[str, str, str], deque[np.ndarray]] = OrderedDict()
        self._first_asked: dict[tuple[str, str, str], float] = {}
        # How many questions the assistants searched exactly were asked (until held).
        self._asked_exact: OrderedDict[tuple[str, str, str], int] = OrderedDict()
        self._held: OrderedDict[tuple[str, str, str], HeldAssistant] = OrderedDict()
        self._loading: set[tuple[str, str, str]] = set()
        # The loads a question may wait for (WAIT_SECONDS), by assistant.
        self._coming: dict[tuple[str, str, str], Future[None]] = {}
        self._not_before: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vector-memory")

    def fits(self, chunks: int, dim: int) -> bool:
        return copy_bytes(chunks, dim) <= self.budget_bytes

    def may_nibble(self, chunks: int, dim: int) -> bool:
        """Whether a copy of this many chunks may take 4-bit codes: one of WIDE_MIN_CHUNKS or
        more, whose 4-bit codes fit the budget too (they take a little more than 8-bit ones, so
        an assistant that fits only in 8 bits is held in 8)."""
        fits = copy_bytes(chunks, dim, nibbles=True) <= self.budget_bytes
        return chunks >= WIDE_MIN_CHUNKS and fits

    def get(
        self,
        engine: Engine,
        tenant_id: str,
        assistant_id: str,
        chunks: int,
        query: np.ndarray,
        *,
        exact: bool = False,
        again: bool = False,
    ) -> HeldAssistant | None:
        """The assistant's copy if one is held for its kind of search (exact: in place of
        Postgres's exact search) and not known to be stale; otherwise None, the question
        counted (and kept as a probe of the walk, unless exact), and a load started when the
        assistant fits and none is under way. A copy held before its walk was judged keeps the
        question as a probe too, and starts the check once enough were asked. again: the same
        question asked a second time, once it has waited for a load (`coming`): neither
        counted nor kept again, and no load started for it."""
        key = (str(engine.url), tenant_id, assistant_id)
        now = time.monotonic()
        job: tuple[Any, ...] | None = None
        awaited = False
        with self._lock:
            found = self._held.get(key)
            held = found if found is not None and not found.stale and found.exact == exact else None
            if held is not None:
                held.used = now
                self._held.move_to_end(key)
                judge = not held.judged and not again
                if judge and (probes := self._judge_on(key, query, now)) is not None:
                    job = (self._check, engine, key, held, probes)
            else:
                if found is not None:  # stale or for the other kind: its memory goes at once
                    del self._held[key]
                if not again:  # a question asked again is not counted again
                    job, awaited = self._load_for(engine, key, chunks, query, now, exact)
        if job is not None:
            try:
                future = self._loader.submit(*job)
            except RuntimeError:  # closed (the process reconfigured or stops): no more loads
                with self._lock:
                    self._loading.discard(key)
            else:
                if awaited:
                    with self._lock:
                        self._coming[key] = future
                    future.add_done_callback(lambda done: self._arrived(key, done))
        return held

    def _load_for(
        self,
        engine: Engine,
        key: tuple[str, str, str],
        chunks: int,
        query: np.ndarray,
        now: float,
        exact: bool,
    ) -> tuple[tuple[Any, ...] | None, bool]:
        """For an assistant not held (the lock held): the question counted; the load to start
        if one is wanted now, and whether a question should wait for it (`coming`)."""
        can_load = self.fits(chunks, len(query)) and key not in self._loading
        due = can_load and self._not_before.get(key, 0.0) <= now  # for a first load
        if exact:
            wanted: list[np.ndarray] | None = [] if self._enough(key) and due else None
            recheck = False
        else:
            wanted, recheck = self._probes(key, chunks, query, now, can_load, due)
        if wanted is None:
            return None, False
        self._loading.add(key)
        self._not_before[key] = now + RELOAD_SECONDS
        # Room first, so the process never holds the budget and the new copy at once: for the
        # larger of the two kinds of codes it may take, as the load chooses (`_load`).
        nibble = self.may_nibble(chunks, len(query))
        room = copy_bytes(chunks, len(query), nibbles=nibble)
        self._make_room(max(room, copy_bytes(chunks, len(query))))
        # Waited for where the walk is not known to be good: never judged, or judged to miss
        # (a verdict, standing or lapsed, says it was good).
        awaited = not exact and key not in self._index_good and chunks <= WAIT_MAX_CHUNKS
        return (self._load, engine, key, wanted, recheck, exact, nibble), awaited

    def coming(self, engine: Engine, tenant_id: str, assistant_id: str) -> Future[None] | None:
        """The load under way of the assistant's copy, when a question is better off waiting
        for it (WAIT_SECONDS) than walking the assistant's HNSW index; else None."""
        with self._lock:
            return self._coming.get((str(engine.url), tenant_id, assistant_id))

    def _arrived(self, key: tuple[str, str, str], done: Future[None]) -> None:
        with self._lock:
            if self._coming.get(key) is done:
                del self._coming[key]

    def _enough(self, key: tuple[str, str, str]) -> bool:
        """Whether an assistant searched exactly has now been asked enough questions to be
        held (the lock held)."""
        asked = self._asked_exact.pop(key, 0) + 1
        self._asked_exact[key] = asked
        while len(self._asked_exact) > ASKING_EXACT_ASSISTANTS:
            self._asked_exact.popitem(last=False)
        return asked >= EXACT_ASKED_BEFORE_LOAD

    def _probes(
        self,
        key: tuple[str, str, str],
        chunks: int,
        query: np.ndarray,
        now: float,
        can_load: bool,
        due: bool,
    ) -> tuple[list[np.ndarray] | None, bool]:
        """For an assistant searched through HNSW (the lock held): the question kept as a
        probe; the questions to check its walk on if a load is wanted now (else None), and
        whether that load checks a standing verdict again (which can_load allows, where a
        first load waits until due)."""
        asked = self._keep_probe(key, query, now)
        verdict = self._index_good.get(key)
        if verdict is not None and verdict.watching(chunks, now):
            verdict.asked += 1
            if verdict.unlike >= UNLIKE_BEFORE_RECHECK and verdict.rechecks < MAX_RECHECKS:
                # Judged on the questions since the first unlike one, not on a selection:
                # unlike means the walk's best was low, which a walk that missed gives too.
                if not can_load:
                    return None, False
                since = verdict.asked - verdict.first_unlike + 1
                verdict.rechecks += 1
                verdict.asked = verdict.unlike = 0
                return list(asked)[-min(since, PROBES) :], True
            return None, False  # the verdict stands
        # Loaded at once: the copy serves the assistant until its walk is judged (_load).
        return (list(asked), False) if due else (None, False)

    def _keep_probe(self, key: tuple[str, str, str], query: np.ndarray, now: float) -> deque:
        """The assistant's last questions, this one added (the lock held)."""
        asked = self._asked.setdefault(key, deque(maxlen=PROBES))
        asked.append(query)
        self._asked.move_to_end(key)
        while len(self._asked) > ASKING_ASSISTANTS:
            self._first_asked.pop(self._asked.popitem(last=False)[0], None)
        self._first_asked.setdefault(key, now)
        return asked

    def _enough_asked(self, key: tuple[str, str, str], asked: int, now: float) -> bool:
        """Whether an assistant has been asked enough to judge its walk on (the lock held)."""
        first = self._first_asked.get(key, now)
        return asked >= ASKED_BEFORE_CHECK or now - first >= PROBE_WAIT_SECONDS

    def _judge_on(
        self, key: tuple[str, str, str], query: np.ndarray, now: float
    ) -> list[np.ndarray] | None:
        """For a copy held before its walk was judged (the lock held): the question kept as a
        probe, and the questions to judge the walk on once enough were asked and no load or
        check of the assistant is under way (it is then marked as one)."""
        asked = self._keep_probe(key, query, now)
        if key in self._loading or not self._enough_asked(key, len(asked), now):
            return None
        self._loading.add(key)
        return list(asked)

    def walked(self, engine: Engine, tenant_id: str, assistant_id: str, best: float) -> None:
        """Told the best cosine the walk found for the question last asked of an assistant
        (get returned None): below the verdict's `near`, the question is unlike those judged."""
        key = (str(engine.url), tenant_id, assistant_id)
        with self._lock:
            verdict = self._index_good.get(key)
            if verdict is not None and verdict.asked and best < verdict.near:
                verdict.unlike += 1
                if verdict.unlike == 1:
                    verdict.first_unlike = verdict.asked

    def held_bytes(self) -> int:
        return self.held()[0]

    def held(self) -> tuple[int, int]:
        """The bytes held and how many assistants they are."""
        with self._lock:
            return self._held_bytes(), len(self._held)

    def wait_idle(self, timeout: float) -> bool:
        """Whether every load under way finished within timeout seconds (for benchmarks and
        tests)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._loading:
                    return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        self._loader.shutdown(wait=True, cancel_futures=True)

    def _load(
        self,
        engine: Engine,
        key: tuple[str, str, str],
        asked: list[np.ndarray],
        recheck: bool = False,
        exact: bool = False,
        may_nibble: bool = False,
    ) -> None:
        """Loads the assistant's copy and, once it has been asked enough questions, checks its
        walk on them (with made-up ones, unless this rechecks a standing verdict on the unlike
        questions' stretch); a copy loaded sooner serves unjudged until then (_check), and a
        copy for exact search is kept unchecked. may_nibble: the copy may take 4-bit codes
        (`may_nibble`), as it does where the machine scores them faster (`nibbles_faster`)."""
        _, tenant_id, assistant_id = key
        started = time.perf_counter()
        with self._lock:
            judge = not exact and (recheck or self._enough_asked(key, len(asked), time.monotonic()))
        try:
            nibbles = may_nibble and nibbles_faster()
            held = load(engine, tenant_id, assistant_id, self.searchable_sql, nibbles=nibbles)
            held.exact = exact
            held.judged = exact or judge
            recall, nearest = (
                index_recall(
                    engine, tenant_id, assistant_id, held, self.walk, asked, made_up=not recheck
                )
                if judge
                else (0.0, [])  # nothing judged: kept, like a walk that finds nothing
            )
        except Exception:
            log.exception("could not hold assistant %s's vectors in memory", assistant_id)
            with self._lock:
                self._loading.discard(key)
                self._not_before[key] = time.monotonic() + RETRY_SECONDS
            return
        keep = self._settle(key, held, judge, recall, nearest, recheck=recheck)
        loaded = f"{held.nbytes / 2**20:.1f} MB, loaded in {time.perf_counter() - started:.2f} s"
        if exact:  # not worth a line at INFO: small assistants are held from their second question
            log.debug("assistant %s: holding %d vectors (%s)", assistant_id, held.chunks, loaded)
        elif not judge:
            log.info(
                "assistant %s: holding its %d vectors in memory (%s); its vector index is "
                "checked on the questions to come",
                assistant_id,
                held.chunks,
                loaded,
            )
        else:
            self._log_verdict(assistant_id, held, recall, keep, f"{loaded} and checked", recheck)

    def _check(
        self,
        engine: Engine,
        key: tuple[str, str, str],
        held: HeldAssistant,
        asked: list[np.ndarray],
    ) -> None:
        """Checks the walk of an assistant held unjudged on the questions it was asked (and
        made-up ones): where the walk is good, the copy is dropped and the walk serves."""
        _, tenant_id, assistant_id = key
        started = time.perf_counter()
        try:
            recall, nearest = index_recall(engine, tenant_id, assistant_id, held, self.walk, asked)
        except Exception:
            # Holding is never wrong, only dearer: the copy goes on serving, judged no more.
            log.exception("could not check assistant %s's vector index", assistant_id)
            with self._lock:
                held.judged = True
                self._loading.discard(key)
            return
        keep = self._settle(key, held, True, recall, nearest, loaded=True)
        checked = f"{held.nbytes / 2**20:.1f} MB, checked in {time.perf_counter() - started:.2f} s"
        self._log_verdict(assistant_id, held, recall, keep, checked, recheck=False)

    def _settle(
        self,
        key: tuple[str, str, str],
        held: HeldAssistant,
        judged: bool,
        recall: float,
        nearest: list[float],
        *,
        recheck: bool = False,
        loaded: bool = False,
    ) -> bool:
        """Records the verdict on a walk judged against the copy, and holds the copy unless the
        walk was found good (or it no longer fits). A copy that was already held (loaded) is
        kept only while it still is, and not stale. Returns whether the copy is held."""
        good = judged and not held.exact and recall >= GOOD_RECALL
        with self._lock:
            self._loading.discard(key)
            if good and (not recheck or key not in self._index_good):
                self._index_good[key] = Verdict(
                    held.chunks,
                    time.monotonic() + INDEX_VERDICT_SECONDS,
                    near=UNLIKE_SHARE * float(np.median(nearest)) if nearest else 0.0,
                )
            elif judged and not good and not held.exact:
                self._index_good.pop(key, None)
            if judged:
                held.judged = True
            keep = not good and held.nbytes <= self.budget_bytes
            if loaded:  # checked where it is held: kept only while it still is, and current
                still = self._held.get(key) is held
                keep = keep and still and not held.stale
                if still and not keep:
                    del self._held[key]
            else:
                self._held.pop(key, None)
                if keep:
                    self._make_room(held.nbytes)
                    self._held[key] = held
        return keep

    @staticmethod
    def _log_verdict(
        assistant_id: str, held: HeldAssistant, recall: float, keep: bool, how: str, recheck: bool
    ) -> None:
        log.info(
            "assistant %s: its vector index found %.3f of the exact nearest chunks%s: %s",
            assistant_id,
            recall,
            " (checked again: questions unlike those it was judged on)" if recheck else "",
            f"holding its {held.chunks} vectors in memory ({how})"
            if keep
            else f"searched through it ({how})",
        )

    def _held_bytes(self) -> int:
        return sum(h.nbytes for h in self._held.values())

    def _make_room(self, nbytes: int) -> None:
        """Drops the least recently searched copies until nbytes more fit the budget."""
        while self._held and self._held_bytes() + nbytes > self.budget_bytes:
            self._held.popitem(last=False)


def index_recall(
    engine: Engine,
    tenant_id: str,
    assistant_id: str,
    held: HeldAssistant,
    walk: Walk,
    asked: Sequence[np.ndarray] = (),
    *,
    made_up: bool = True,
) -> tuple[float, list[float]]:
    """The share of the exact ten nearest chunks that the assistant's vector index finds for
    the questions asked and (made_up) made-up ones, PROBES in all (1.0 with no chunks), and
    the exact nearest cosine of each question asked."""
    if held.chunks == 0:
        return 1.0, []
    rng = np.random.default_rng(0)
    asked = [q for q in asked if len(q) == held.dim][-PROBES:]
    missing = min(PROBES - len(asked), held.chunks) if made_up else 0
    chosen = rng.choice(held.chunks, size=missing, replace=False)
    hits = wanted = 0
    nearest: list[float] = []
    with Session(engine) as s, s.begin():
        vectors = s.execute(
            text("SELECT vector_send(embedding) FROM chunks WHERE id = ANY(CAST(:ids AS uuid[]))"),
            {"ids": held.ids_at(chosen)},
        ).scalars()
        made = []
        for vector in unit_rows(list(vectors)):
            turn = rng.standard_normal(vector.shape).astype(np.float32)
            turn -= (turn @ vector) * vector  # orthogonal to the chunk
            made.append(np.cos(PROBE_TURN) * vector + np.sin(PROBE_TURN) * unit(turn))
        for question in asked + made:
            exact = (
                s.execute(
                    text(RANKED),
                    {
                        "query": Vector(question).to_text(),
                        "ids": held.candidates(question, 10),
                        "limit": 10,
                    },
                )
                .scalars()
                .all()
            )
            if len(nearest) < len(asked):
                nearest.append(exact[0])
            tenth = min(exact)
            found = walk(s, tenant_id, assistant_id, question.tolist(), 10)
            hits += sum(1 for x in found if x >= tenth - TIE_TOLERANCE)
            wanted += min(10, held.chunks)
    return (hits / wanted if wanted else 1.0), nearest


# The cosines of the nearest of some chunks, by their stored vectors.
RANKED = """
    SELECT 1 - (embedding <=> CAST(:query AS vector)) FROM chunks
    WHERE id = ANY(CAST(:ids AS uuid[]))
    ORDER BY embedding <=> CAST(:query AS vector) LIMIT :limit
"""


def unit(vectors: np.ndarray) -> np.ndarray:
    """Vectors (a row or rows) of length 1, float32; a zero vector stays zeros."""
    vectors = np.asarray(vectors, np.float32)
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


# PostgreSQL's binary COPY: a signature, flags and the length of a header extension, then
# each row as its field count and each field's length and bytes, then -1.
COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
COPY_HEADER = struct.Struct(">11sii")


def copied_rows(copy: Iterable[Any]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(ids as (n, 16) uint8, vectors as (n, dim) float32), LOAD_BATCH_ROWS rows at a time,
    from a binary COPY of (uuid, vector) rows.

    pgvector's binary vector is its dimension, two unused bytes and big-endian float32s, so
    with one dimension every row has the same length and a batch is read by numpy at once:
    100k rows took 0.55 s from COPY where psycopg's server-side cursor took 0.85 s to make
    its rows. A row of another shape (a NULL, a second dimension) raises ValueError."""
    data = bytearray()
    row: np.dtype | None = None  # once the first row has told the dimension
    for piece in copy:
        data += piece
        if row is None:
            if len(data) < COPY_HEADER.size:
                continue
            signature, _, extension = COPY_HEADER.unpack_from(data)
            if signature != COPY_SIGNATURE:
                raise ValueError("not a binary COPY")
            # The first row's dimension, where copy_row places it.
            dim_at = COPY_HEADER.size + extension + copy_row(1).fields["dim"][1]
            if len(data) < dim_at + 2:
                continue
            (dim,) = struct.unpack_from(">h", data, dim_at)
            if dim <= 0:  # a NULL's length (-1) in its place, or an empty vector
                raise ValueError("a binary COPY row of an unexpected shape")
            row = copy_row(dim)
            del data[: COPY_HEADER.size + extension]
        if len(data) >= LOAD_BATCH_ROWS * row.itemsize:
            yield copied(data, row)
    if row is None:
        if len(data) > COPY_HEADER.size + 2:
            raise ValueError("a binary COPY of an unexpected shape")
        return
    if len(data) >= row.itemsize:
        yield copied(data, row)
    if bytes(data) != b"\xff\xff":
        raise ValueError("a binary COPY row of an unexpected shape")


def copy_row(dim: int) -> np.dtype:
    """One (uuid, vector) row of a binary COPY, for vectors of dim dimensions."""
    return np.dtype(
        [
            ("fields", ">i2"),
            ("id_length", ">i4"),
            ("id", "u1", 16),
            ("vector_length", ">i4"),
            ("dim", ">i2"),
            ("unused", ">i2"),
            ("vector", ">f4", dim),
        ]
    )


def copied(data: bytearray, row: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """The whole rows at the start of data, taken off it."""
    count = len(data) // row.itemsize
    batch = np.frombuffer(data, row, count=count).copy()
    dim = row["vector"].shape[0]
    if not (
        (batch["fields"] == 2).all()
        and (batch["id_length"] == 16).all()
        and (batch["vector_length"] == 4 + 4 * dim).all()
        and (batch["dim"] == dim).all()
    ):
        raise ValueError("a binary COPY row of an unexpected shape")
    del data[: count * row.itemsize]
    return batch["id"], batch["vector"].astype(np.float32)


def unit_rows(sent: list[bytes]) -> np.ndarray:
    """Vectors in pgvector's binary form (vector_send) as float32 rows of length 1, a zero
    vector as zeros."""
    # A 2-byte dimension, 2 unused bytes, then big-endian float32s: the header takes one
    # float32's place and is dropped.
    if not sent:
        return np.zeros((0, 0), np.float32)
    return unit(np.frombuffer(b"".join(sent), ">f4").reshape(len(sent), -1)[:, 1:])


def load(
    engine: Engine,
    tenant_id: str,
    assistant_id: str,
    searchable_sql: str,
    *,
    nibbles: bool = False,
) -> HeldAssistant:
    """The assistant's servable chunks' ids and codes and the digest they belong to, read in
    one snapshot (REPEATABLE READ), the vectors in pgvector's binary form. A zero vector has no
    cosine with anything (pgvector ranks it last) and is not held. nibbles: the codes in 4
    bits (`Nibbles`), else in 8."""
    params = {"tenant": tenant_id, "assistant": uuid.UUID(assistant_id)}
    ids: list[np.ndarray] = []
    scales: list[np.ndarray] = []
    offsets: list[np.ndarray] = []
    blocks: list[np.ndarray] = []
    pending: list[np.ndarray] = []  # codes, row by row, not yet in a block
    layout = scorer()
    dim = 0

    def block() -> None:
        blocks.append(layout.block(np.concatenate(pending)))
        pending.clear()

    rows = text(
        "COPY (SELECT c.id, c.embedding FROM chunks c"
        f" JOIN documents d ON d.id = c.document_id WHERE {searchable_sql})"
        " TO STDOUT (FORMAT binary)"
    )
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        digest = digest_of(conn.execute(text(DIGEST), params).one())
        # Streamed in the snapshot the digest was read in, LOAD_BATCH_ROWS rows at a time.
        sql = str(rows.compile(dialect=conn.dialect))
        with conn.connection.driver_connection.cursor() as cur, cur.copy(sql, params) as copy:
            for batch_ids, raw in copied_rows(copy):
                vectors = unit(raw)
                keep = vectors.any(axis=1)
                ids.append(batch_ids[keep])
                dim = vectors.shape[1]
                if nibbles:
                    codes, scale = nibble_codes(vectors[keep])
                    pending.append(codes)
                    scales.append(scale)
                    continue
                codes, scale, offset = encode(vectors[keep])
                scales.append(scale)
                offsets.append(offset)
                pending.append(codes)
                if sum(len(p) for p in pending) >= BLOCK_CHUNKS:
                    block()
        conn.rollback()
    all_ids = np.concatenate(ids) if ids else np.zeros((0, 16), np.uint8)
    if nibbles:
        coded = None
        if len(all_ids):  # none left (deleted since they were counted): nothing to score
            codes = np.concatenate(pending)
            pending.clear()  # the batches' codes go before onnxruntime packs its own copy
            coded = Nibbles.made(dim, codes, np.concatenate(scales))
        empty = np.zeros(0, np.float32)
        return HeldAssistant(digest, all_ids, [], empty, np.zeros(0, np.int32), nibbles=coded)
    if pending:
        block()
    return HeldAssistant(
        digest,
        all_ids,
        blocks,
        np.concatenate(scales) if scales else np.zeros(0, np.float32),
        np.concatenate(offsets) if offsets else np.zeros(0, np.int32),
    )
