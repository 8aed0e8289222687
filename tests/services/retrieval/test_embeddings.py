"""The local embedding model, and the OpenAI-compatible client against a real HTTP server."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import multiprocessing
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest

from services.retrieval.embeddings import (
    LOCAL_DIM,
    LOCAL_MODEL,
    EmbeddingError,
    EmbeddingUnavailable,
    LocalEmbedder,
    OpenAIEmbedder,
    create_embedder,
    embeddings_url,
    local_model_files,
    quantized_model,
)


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


# --- the local model ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local() -> LocalEmbedder:
    embedder = create_embedder()
    assert isinstance(embedder, LocalEmbedder)
    return embedder


def test_local_model_files_are_the_pinned_ones() -> None:
    model, tokenizer = local_model_files()
    assert model.name == "model.onnx" and model.stat().st_size > 20_000_000
    assert tokenizer.name == "tokenizer.json"


def test_local_embedder_declares_its_dimension(local: LocalEmbedder) -> None:
    assert (local.name, local.dim) == (LOCAL_MODEL, LOCAL_DIM) == (LOCAL_MODEL, 384)
    assert len(local.embed_query("How do I rotate the API key?")) == 384


def test_a_paraphrase_is_closer_than_an_unrelated_sentence(local: LocalEmbedder) -> None:
    query = local.embed_query("How do I reset my password?")
    paraphrase, unrelated, also_unrelated = local.embed_documents(
        [
            "To change a forgotten password, click 'Forgot password' on the sign-in page.",
            "Quarterly revenue grew by four percent, driven by the European market.",
            "The recipe calls for two cups of flour and a pinch of salt.",
        ]
    )
    assert cosine(query, paraphrase) > 0.5
    assert cosine(query, paraphrase) > cosine(query, unrelated) + 0.3
    assert cosine(query, paraphrase) > cosine(query, also_unrelated) + 0.3


def test_the_right_passage_ranks_first(local: LocalEmbedder) -> None:
    passages = [
        "Celery workers take tasks from a broker such as Redis or RabbitMQ.",
        "PostgreSQL stores the chunks; pgvector indexes their embeddings.",
        "The invoice is due thirty days after the delivery date.",
        "Presigned URLs let a client download an object without credentials.",
    ]
    vectors = local.embed_documents(passages)
    query = local.embed_query("which message queue do the background workers read from?")
    scores = [cosine(query, v) for v in vectors]
    assert scores.index(max(scores)) == 0


def test_vectors_are_unit_length(local: LocalEmbedder) -> None:
    for vector in local.embed_documents(["short", "a much longer sentence " * 20, "", "ü ß 漢字"]):
        assert norm(vector) == pytest.approx(1.0, abs=1e-5)


def test_a_batch_equals_one_by_one(local: LocalEmbedder) -> None:
    # Mixed lengths, so the batches are reordered and padded.
    texts = [
        "The quick brown fox jumps over the lazy dog. " * 12,
        "hello",
        "Footnote returns the sources an answer was built from, with their locations.",
        "hello",
        "Pages, lines and headings are recorded for every chunk. " * 4,
    ]
    batched = local.embed_documents(texts)
    for text, vector in zip(texts, batched, strict=True):
        assert local.embed_documents([text])[0] == pytest.approx(vector, abs=1e-5)
    assert batched[1] == batched[3]


def test_a_question_s_vector_does_not_depend_on_the_others(local: LocalEmbedder) -> None:
    # The 8-bit copy scales each activation tensor as a whole, so a batch would share scales.
    texts = ["hello", "How many days of annual leave do new starters get? " * 3, "ü ß 漢字"]
    together = local.embed_queries(texts)
    for text, vector in zip(texts, together, strict=True):
        assert local.embed_query(text) == pytest.approx(vector, abs=1e-6)
    assert local.embed_queries([]) == []


def test_a_question_s_vector_is_its_passage_s_to_within_the_8_bit_arithmetic(
    local: LocalEmbedder,
) -> None:
    texts = [
        "How do I rotate the API key?",
        "Which message queue do the background workers read from?",
        "Quelle est la durée du préavis ?",
        "The invoice is due thirty days after the delivery date. " * 6,
    ]
    for text, passage in zip(texts, local.embed_documents(texts), strict=True):
        question = local.embed_query(text)
        assert norm(question) == pytest.approx(1.0, abs=1e-5)
        assert 0.98 < cosine(question, passage) < 1 - 1e-4


def test_questions_can_keep_the_passages_arithmetic(local: LocalEmbedder) -> None:
    exact = create_embedder(questions="float32")
    texts = ["How do I rotate the API key?", "ü ß 漢字"]
    together = exact.embed_queries(texts)
    for text, passage, question in zip(texts, local.embed_documents(texts), together, strict=True):
        assert exact.embed_query(text) == pytest.approx(passage, abs=1e-5)
        assert question == pytest.approx(passage, abs=1e-5)
    with pytest.raises(ValueError, match="int8, float32"):
        create_embedder(questions="int4")


async def test_the_server_embeds_questions_as_configured(settings: Any) -> None:
    from services.config import Settings
    from services.server import Deps

    for arithmetic in ("int8", "float32"):
        deps = Deps.from_settings(settings.model_copy(update={"question_embedding": arithmetic}))
        try:
            assert deps.chat.questions.embedder.questions == arithmetic
        finally:
            await deps.aclose()
    with pytest.raises(ValueError, match="question_embedding"):
        Settings(question_embedding="int4")


def test_the_questions_copy_runs_on_one_thread(local: LocalEmbedder) -> None:
    from services.retrieval import embeddings

    local.embed_query("loads the copy")
    assert embeddings._query_model is not None
    options = embeddings._query_model.session.get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 1)


def test_without_the_copy_questions_take_the_passages_arithmetic(
    local: LocalEmbedder, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from services.retrieval import embeddings

    attempts: list[Path] = []

    def unbuildable(source: Path) -> bytes:
        attempts.append(source)
        raise OSError("no writable temporary directory")

    monkeypatch.setattr(embeddings, "_query_model", None)
    monkeypatch.setattr(embeddings, "quantized_model", unbuildable)
    text = "How do I rotate the API key?"
    with caplog.at_level(logging.WARNING, logger="services.retrieval.embeddings"):
        first = local.embed_query(text)
        again = local.embed_queries([text, "second question"])
    assert first == pytest.approx(local.embed_documents([text])[0], abs=1e-5)
    assert again[0] == first
    assert len(attempts) == 1  # tried once, not on every question
    assert "questions are embedded in float32" in caplog.text
    assert "no writable temporary directory" in caplog.text


def test_the_questions_copy_multiplies_in_8_bits() -> None:
    import onnx

    graph = onnx.load_from_string(quantized_model(local_model_files()[0])).graph
    weights = {w.name for w in graph.initializer}
    ops = [n.op_type for n in graph.node]
    # Six layers of six weight matrices each; what stays in float32 multiplies activations by
    # activations (the attention's two products per layer).
    assert ops.count("MatMulInteger") == 36
    float_products = [n for n in graph.node if n.op_type == "MatMul"]
    assert len(float_products) == 12
    assert not any(name in weights for n in float_products for name in n.input)


def test_small_batches_give_the_same_vectors(local: LocalEmbedder) -> None:
    texts = [f"passage number {i} about topic {i % 3}" for i in range(7)]
    small = LocalEmbedder(batch_size=2).embed_documents(texts)
    for got, expected in zip(small, local.embed_documents(texts), strict=True):
        assert got == pytest.approx(expected, abs=1e-5)


def test_long_input_is_truncated_not_rejected(local: LocalEmbedder) -> None:
    long_text = "word " * 5000
    prefix = "word " * 400  # well past 256 tokens as well
    assert local.embed_query(long_text) == pytest.approx(local.embed_query(prefix), abs=1e-5)


def test_concurrent_calls_share_the_model_safely(local: LocalEmbedder) -> None:
    texts = [f"thread-safety check {i}: the same text gives the same vector" for i in range(8)]
    expected = local.embed_documents(texts)
    questions = local.embed_queries(texts)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda t: local.embed_documents([t])[0], texts * 3))
        asked = list(pool.map(local.embed_query, texts * 3))
    for i, (vector, question) in enumerate(zip(results, asked, strict=True)):
        assert vector == pytest.approx(expected[i % len(texts)], abs=1e-5)
        assert question == pytest.approx(questions[i % len(texts)], abs=1e-5)


def _embed_in_child(queue: multiprocessing.Queue[list[float]]) -> None:
    queue.put(create_embedder().embed_query("embedded after fork"))


def test_a_forked_worker_process_embeds(local: LocalEmbedder) -> None:
    # Celery's prefork pool forks after the parent may have loaded the model.
    expected = local.embed_query("embedded after fork")
    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[list[float]] = context.Queue()
    child = context.Process(target=_embed_in_child, args=(queue,))
    child.start()
    try:
        assert queue.get(timeout=60) == pytest.approx(expected, abs=1e-5)
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0


_FORK_AND_EXIT = """
import os, sys
from services.retrieval.embeddings import create_embedder
embedder = create_embedder()
embedder.embed_query("the parent loads the model before forking")
pid = os.fork()
if pid == 0:
    embedder.embed_query("the child loads its own")
    sys.exit(0)  # a normal interpreter exit, unlike multiprocessing's os._exit
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_exits_normally() -> None:
    # onnxruntime 1.29 to 1.31 hang a forked child at exit once the parent has imported it;
    # this is why the requirement stays below 1.29.
    result = subprocess.run(
        [sys.executable, "-c", _FORK_AND_EXIT],
        cwd=Path(__file__).resolve().parents[3],
        timeout=120,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_empty_and_invalid_input(local: LocalEmbedder) -> None:
    assert local.embed_documents([]) == []
    with pytest.raises(TypeError):
        local.embed_documents("a bare string is not a list of texts")
    with pytest.raises(TypeError):
        local.embed_documents(["fine", 3])  # type: ignore[list-item]


def test_local_configuration_is_checked() -> None:
    assert isinstance(create_embedder(model=LOCAL_MODEL, dim=384), LocalEmbedder)
    with pytest.raises(ValueError, match="serves"):
        create_embedder(model="text-embedding-3-small")
    with pytest.raises(ValueError, match="384"):
        create_embedder(dim=1536)
    with pytest.raises(ValueError):
        create_embedder(batch_size=0)


# --- the OpenAI-compatible client --------------------------------------------------------------


def fake_vector(text: str, dim: int) -> list[float]:
    """A deterministic, not normalised vector for a text."""
    digest = hashlib.sha256(text.encode()).digest() * (dim // 8 + 1)
    return [struct.unpack_from("b", digest, i)[0] / 16 for i in range(dim)]


@dataclass
class Behaviour:
    """What the fake server answers; tests change it between calls."""

    dim: int = 8
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    body: bytes | None = None
    reverse: bool = False  # answer in reverse order, relying on "index"
    drop_last: bool = False
    requests: list[dict[str, Any]] = field(default_factory=list)
    released: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def server() -> Iterator[tuple[str, Behaviour]]:
    behaviour = Behaviour()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            behaviour.requests.append(
                {"path": self.path, "auth": self.headers.get("Authorization"), "json": payload}
            )
            if behaviour.delay:
                behaviour.released.wait(behaviour.delay)
            if behaviour.body is not None:
                body = behaviour.body
            else:
                data = [
                    {"object": "embedding", "index": i, "embedding": fake_vector(t, behaviour.dim)}
                    for i, t in enumerate(payload["input"])
                ]
                if behaviour.reverse:
                    data.reverse()
                if behaviour.drop_last:
                    data.pop()
                body = json.dumps({"object": "list", "data": data, "model": "fake"}).encode()
            try:
                self.send_response(behaviour.status)
                for name, value in behaviour.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass  # the client gave up (the timeout test)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", behaviour
    finally:
        behaviour.released.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def remote(base_url: str, **kwargs: Any) -> OpenAIEmbedder:
    options: dict[str, Any] = {"base_url": base_url, "dim": 8, "timeout": 5.0} | kwargs
    embedder = create_embedder(**options)
    assert isinstance(embedder, OpenAIEmbedder)
    return embedder


def test_batches_requests_and_keeps_the_order(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    texts = [f"text {i}" for i in range(5)]
    vectors = remote(url, batch_size=2).embed_documents(texts)

    assert [len(r["json"]["input"]) for r in behaviour.requests] == [2, 2, 1]
    assert [t for r in behaviour.requests for t in r["json"]["input"]] == texts
    for text, vector in zip(texts, vectors, strict=True):
        expected = fake_vector(text, 8)
        assert vector == pytest.approx([x / norm(expected) for x in expected])
        assert norm(vector) == pytest.approx(1.0)


def test_a_server_embeds_questions_as_it_embeds_passages(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    embedder = remote(url, batch_size=4)
    questions = ["annual leave?", "sick days?", "notice period?"]
    assert embedder.embed_queries(questions) == embedder.embed_documents(questions)
    assert [r["json"]["input"] for r in behaviour.requests] == [questions, questions]


def test_sends_model_and_key_and_finds_the_endpoint(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    embedder = remote(f"{url}/v1/", model="bge-small", api_key="s3cret")
    assert (embedder.name, embedder.dim) == ("bge-small", 8)
    embedder.embed_query("hello")
    remote(url).embed_query("hello")

    first, second = behaviour.requests
    assert first["path"] == second["path"] == "/v1/embeddings"
    assert first["auth"] == "Bearer s3cret"
    assert first["json"] == {"input": ["hello"], "model": "bge-small"}
    assert second["auth"] is None
    assert second["json"] == {"input": ["hello"]}


def test_orders_vectors_by_index(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    behaviour.reverse = True
    texts = ["alpha", "beta", "gamma"]
    vectors = remote(url).embed_documents(texts)
    assert vectors == [pytest.approx(remote(url).embed_query(t)) for t in texts]


def test_empty_input_sends_nothing(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    assert remote(url).embed_documents([]) == []
    assert behaviour.requests == []


@pytest.mark.parametrize("status", [503, 429, 502])
def test_overload_is_unavailable(server: tuple[str, Behaviour], status: int) -> None:
    url, behaviour = server
    behaviour.status = status
    behaviour.headers = {"Retry-After": "7"}
    behaviour.body = b'{"error": "busy"}'
    with pytest.raises(EmbeddingUnavailable) as err:
        remote(url).embed_query("hello")
    assert err.value.retry_after == 7.0
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert str(status) in err.value.message


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_a_rejected_request_is_a_plain_error(server: tuple[str, Behaviour], status: int) -> None:
    url, behaviour = server
    behaviour.status = status
    behaviour.body = b'{"error": {"message": "no"}}'
    with pytest.raises(EmbeddingError) as err:
        remote(url).embed_query("hello")
    assert not isinstance(err.value, EmbeddingUnavailable)


def test_dimension_mismatch_is_an_error(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    behaviour.dim = 12
    with pytest.raises(EmbeddingError, match="12-dimensional") as err:
        remote(url, dim=8).embed_query("hello")
    assert not isinstance(err.value, EmbeddingUnavailable)


def test_remote_dim_defaults_to_the_local_models(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    behaviour.dim = 384
    embedder = create_embedder(base_url=url)
    assert embedder.dim == 384
    assert len(embedder.embed_query("hello")) == 384


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b'{"data": "nope"}',
        b'{"data": [{"index": 0, "embedding": ["a", "b"]}]}',
        b'{"data": [{"index": 0, "embedding": "AAAAAA=="}]}',
        b"{}",
    ],
)
def test_a_malformed_response_is_an_error(server: tuple[str, Behaviour], body: bytes) -> None:
    url, behaviour = server
    behaviour.body = body
    with pytest.raises(EmbeddingError) as err:
        remote(url).embed_query("hello")
    assert not isinstance(err.value, EmbeddingUnavailable)


def test_too_few_vectors_is_an_error(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    behaviour.drop_last = True
    with pytest.raises(EmbeddingError, match="1 vectors for 2 texts"):
        remote(url).embed_documents(["one", "two"])


def test_a_slow_server_times_out_as_unavailable(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    behaviour.delay = 10.0
    started = time.monotonic()
    with pytest.raises(EmbeddingUnavailable, match="timed out"):
        remote(url, timeout=0.3).embed_query("hello")
    assert time.monotonic() - started < 5


def test_a_closed_port_is_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(EmbeddingUnavailable, match="unreachable"):
        remote(f"http://127.0.0.1:{port}").embed_query("hello")


def test_embeddings_url() -> None:
    assert embeddings_url("http://tei:8080") == "http://tei:8080/v1/embeddings"
    assert embeddings_url("http://tei:8080/v1") == "http://tei:8080/v1/embeddings"
    assert embeddings_url("http://h/openai/v1/") == "http://h/openai/v1/embeddings"
    assert embeddings_url("http://h/v1/embeddings") == "http://h/v1/embeddings"


# --- the local model's thread count ------------------------------------------------------------


def test_session_options_carry_the_thread_count() -> None:
    from services.retrieval.embeddings import session_options

    capped = session_options(3)
    assert (capped.intra_op_num_threads, capped.inter_op_num_threads) == (3, 1)
    default = session_options(0)
    assert default.intra_op_num_threads == 0  # onnxruntime picks: one per core
    with pytest.raises(ValueError, match="threads"):
        create_embedder(threads=-1)


_WORKER_SESSION_THREADS = """
from services.config import get_settings
from workers.resources import Resources
from services.retrieval import embeddings
Resources(get_settings()).embedder.load()
options = embeddings._model.session.get_session_options()
print(options.intra_op_num_threads, options.inter_op_num_threads)
"""


@pytest.mark.parametrize(("setting", "expected"), [("1", "1 1"), ("2", "2 1"), (None, "0 ")])
def test_the_setting_reaches_the_worker_s_onnx_session(
    setting: str | None, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The model is loaded once per process, so each setting gets a fresh interpreter.
    monkeypatch.delenv("FOOTNOTE_EMBEDDING_THREADS", raising=False)
    if setting is not None:
        monkeypatch.setenv("FOOTNOTE_EMBEDDING_THREADS", setting)
    result = subprocess.run(
        [sys.executable, "-c", _WORKER_SESSION_THREADS],
        cwd=Path(__file__).resolve().parents[3],
        timeout=120,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(expected)


def test_pool_processes_share_the_cpus() -> None:
    from services.config import Settings, available_cpus, pool_embedding_threads

    assert pool_embedding_threads(1, cpus=2) == 2
    assert pool_embedding_threads(2, cpus=2) == 1
    assert pool_embedding_threads(4, cpus=2) == 1
    assert pool_embedding_threads(2, cpus=8) == 4
    assert pool_embedding_threads(1) == available_cpus() >= 1
    assert Settings(embedding_threads=3).embedding_threads == 3
    with pytest.raises(ValueError):
        Settings(embedding_threads=-1)
