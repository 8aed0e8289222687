"""The evidence scorer's embedder: WordLlama's static token vectors, averaged.

Evidence embeds every answer sentence and its candidate quotes, so its embedder sits on the
path of each streamed sentence. The local MiniLM model takes 13-20 ms a sentence on two CPU
cores, so a paraphrased sentence, which needs its own vector and those of a few quotes, cost
70-130 ms at p95: several times the 20 ms a sentence may cost. A static model is a
lookup table: a text's vector is the mean of its tokens' vectors, about 0.1 ms a sentence. On
eval/claims.jsonl its verdicts agree with the labels about 1 point less often than MiniLM's (see
docs/quality.md), which is why `FOOTNOTE_EVIDENCE_EMBEDDER=local` keeps MiniLM available.

The weights (l2_supercat, 256 dimensions, 16 MB) and their tokenizer ship in the wordllama
wheel and are read from it, pinned by sha256 like the MiniLM files, because the calibration's
thresholds hold for these vectors only. The pooling is written here rather than taken from
wordllama's inference module: that module configures the root logger when imported and pulls
in its download and training machinery, and what it would do for us is one mean and one norm.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from services.retrieval.embeddings import EmbeddingError

if TYPE_CHECKING:
    import tokenizers

STATIC_MODEL = "wordllama-l2-supercat-256"
STATIC_DIM = 256
_DIST = "wordllama"
_WEIGHTS_FILE = "wordllama/weights/l2_supercat_256.safetensors"
_WEIGHTS_SHA256 = "64b47a2dc493cb8e85944076601189739852d7b64e0e1eedcb1937a251cd9fd5"
_TOKENIZER_FILE = "wordllama/tokenizers/l2_supercat_tokenizer_config.json"
_TOKENIZER_SHA256 = "93248f2a9ec36c7b35f700a033d5f36228aae48db61aee31007fa49062cdeb68"


@dataclass(frozen=True)
class _Model:
    table: np.ndarray  # (vocabulary, STATIC_DIM) float32
    tokenizer: tokenizers.Tokenizer


_model: _Model | None = None
_lock = threading.Lock()


def _packaged(name: str, expected: str) -> Path:
    try:
        path = Path(str(metadata.distribution(_DIST).locate_file(name)))
    except metadata.PackageNotFoundError as err:
        raise EmbeddingError("the evidence embedder is not installed; install wordllama") from err
    if not path.is_file():
        raise EmbeddingError(f"the evidence embedder's {Path(name).name} is missing")
    if hashlib.sha256(path.read_bytes()).hexdigest() != expected:
        raise EmbeddingError(
            f"the installed {Path(name).name} is not the pinned {STATIC_MODEL} file; install "
            "the wordllama version this release of Footnote requires"
        )
    return path


def _load() -> _Model:
    global _model
    with _lock:
        if _model is None:
            import tokenizers
            from safetensors import safe_open

            with safe_open(
                str(_packaged(_WEIGHTS_FILE, _WEIGHTS_SHA256)), framework="np"
            ) as weights:
                table = np.ascontiguousarray(weights.get_tensor("embedding.weight"), np.float32)
            tokenizer = tokenizers.Tokenizer.from_file(
                str(_packaged(_TOKENIZER_FILE, _TOKENIZER_SHA256))
            )
            tokenizer.no_truncation()
            tokenizer.no_padding()
            _model = _Model(table, tokenizer)
        return _model


class StaticEmbedder:
    """Unit vectors for texts from WordLlama's static token table; thread-safe, CPU only."""

    name = STATIC_MODEL
    dim = STATIC_DIM

    def load(self) -> None:
        """Read the table now (about 0.1 s) rather than in the first answer."""
        _load()

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        return self.embed_array(texts).tolist()

    def embed_array(self, texts: Sequence[str]) -> np.ndarray:
        """The texts' vectors as rows of one array; a text without tokens gets zeros."""
        model = _load()
        out = np.zeros((len(texts), STATIC_DIM), dtype=np.float32)
        encodings = model.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        for row, encoding in enumerate(encodings):
            ids = np.asarray(encoding.ids, dtype=np.int64)
            if not ids.size:
                continue
            mean = model.table[np.clip(ids, 0, len(model.table) - 1)].mean(axis=0)
            norm = float(np.linalg.norm(mean))
            if norm > 0:
                out[row] = mean / norm
        return out


_WORD_CACHE = 65536
_words: dict[str, np.ndarray] = {}
_words_lock = threading.Lock()


def word_vectors(words: Sequence[str]) -> np.ndarray:
    """The words' unit vectors as rows, the new ones embedded in one batch; answers reuse
    their words, so each is kept (up to _WORD_CACHE words, then the cache starts over)."""
    if not words:
        return np.zeros((0, STATIC_DIM), dtype=np.float32)
    with _words_lock:
        found = {w: _words.get(w) for w in set(words)}
        new = sorted(w for w, vector in found.items() if vector is None)
        if new:
            rows = StaticEmbedder().embed_array(new)
            found.update(zip(new, rows, strict=True))
            if len(_words) + len(new) > _WORD_CACHE:
                _words.clear()
            _words.update(zip(new, rows, strict=True))
        return np.stack([found[w] for w in words])
