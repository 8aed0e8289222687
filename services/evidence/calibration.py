"""Agreement of the evidence verdicts with a hand-labelled set of (claim, passage, verdict).

score_claims() runs the product's own scoring: each passage is treated as the one chunk an
answer cited, the claim as the cited sentence, and the verdict is what the span would carry.
fit() searches the Calibration on a training split; the report gives a held-out split too.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from services.citations import SupportVerdict
from services.evidence.builder import TextEmbedder
from services.evidence.quotes import sentences_of, windows_of
from services.evidence.scorer import (
    CALIBRATION,
    Calibration,
    Features,
    features,
    support_score,
    verdict_for,
)

LABELS = ("SUPPORTED", "PARTIAL", "UNSUPPORTED")
_NAMES = {SupportVerdict.SUPPORTED: "SUPPORTED", SupportVerdict.PARTIAL: "PARTIAL",
          SupportVerdict.UNSUPPORTED: "UNSUPPORTED"}  # fmt: skip
# Rows whose id hashes below this share form the training split; the rest are held out.
TRAIN_SHARE = 0.6


class LabelError(ValueError):
    """The labelled file is malformed: says which line and why."""


@dataclass(frozen=True, slots=True)
class Claim:
    id: str
    claim: str
    passage: str
    verdict: str
    trap: str = ""


@dataclass(frozen=True, slots=True)
class Scored:
    """A labelled claim with the features of every candidate quote in its passage."""

    claim: Claim
    candidates: tuple[Features, ...]

    def verdict(self, calibration: Calibration) -> str:
        best = max(support_score(f, calibration) for f in self.candidates)
        return _NAMES[verdict_for(best, calibration)]


@dataclass
class Report:
    total: int
    agreement: float
    # Agreement on SUPPORTED against the rest (PARTIAL and UNSUPPORTED together).
    supported_agreement: float
    confusion: dict[str, dict[str, int]]  # label -> predicted -> count
    by_trap: dict[str, float]
    train_agreement: float
    heldout_agreement: float
    heldout_total: int
    calibration: dict[str, float]
    mistakes: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def load_claims(path: str | Path) -> list[Claim]:
    claims: list[Claim] = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise LabelError(f"line {number}: not JSON ({err.msg})") from None
        missing = [
            k for k in ("id", "claim", "passage", "verdict") if not isinstance(row.get(k), str)
        ]
        if missing:
            raise LabelError(f"line {number}: missing or non-string {', '.join(missing)}")
        if row["verdict"] not in LABELS:
            raise LabelError(f"line {number}: verdict must be one of {', '.join(LABELS)}")
        claims.append(
            Claim(row["id"], row["claim"], row["passage"], row["verdict"], row.get("trap", ""))
        )
    if not claims:
        raise LabelError("the file holds no labelled claims")
    return claims


def in_training_split(claim: Claim) -> bool:
    digest = hashlib.sha256(claim.id.encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < TRAIN_SHARE


def featurize(claims: Sequence[Claim], embedder: TextEmbedder) -> list[Scored]:
    """Features of each claim against each candidate quote of its passage (one batch)."""
    plans = []
    texts: set[str] = set()
    for c in claims:
        sentences = sentences_of(c.passage)
        windows = windows_of(sentences, c.passage)
        plans.append((sentences, windows))
        texts.add(c.claim)
        texts.update(c.passage[a:b] for a, b in sentences)
    ordered = sorted(texts)
    vectors = dict(
        zip(
            ordered,
            (np.asarray(v, dtype=np.float32) for v in embedder.embed_documents(ordered)),
            strict=True,
        )
    )
    scored: list[Scored] = []
    for c, (sentences, windows) in zip(claims, plans, strict=True):
        candidates = []
        for w in windows:
            total = np.sum(
                [vectors[c.passage[a:b]] for a, b in sentences[w.first : w.last + 1]], axis=0
            )
            total = total / max(float(np.linalg.norm(total)), 1e-12)
            cosine = float(np.dot(vectors[c.claim], total))
            candidates.append(features(c.claim, c.passage[w.start : w.end], cosine))
        scored.append(Scored(c, tuple(candidates)))
    return scored


def agreement(items: Iterable[Scored], calibration: Calibration) -> float:
    items = list(items)
    if not items:
        return 0.0
    return sum(i.verdict(calibration) == i.claim.verdict for i in items) / len(items)


# The search space of fit(): coarse on purpose, so the fit has few degrees of freedom.
GRID = {
    "cosine_weight": (0.4, 0.5, 0.6, 0.7, 0.8),
    "cosine_floor": (0.0, 0.2, 0.4),
    "negation_penalty": (0.2, 0.3, 0.4),
    "antonym_penalty": (0.1, 0.25),
    "name_penalty": (0.05, 0.1, 0.2),
    "number_missing_penalty": (0.0, 0.15),
}
THRESHOLDS = tuple(round(0.3 + 0.05 * i, 2) for i in range(12))  # 0.30 .. 0.85


def fit(items: Sequence[Scored], start: Calibration = CALIBRATION) -> Calibration:
    """The grid point (weights, then both thresholds) with the best agreement on items."""
    matrix, owner = _feature_matrix(items)
    labels = np.array([LABELS.index(i.claim.verdict) for i in items])
    best, best_agreement = start, -1.0
    keys = list(GRID)
    for values in itertools.product(*(GRID[k] for k in keys)):
        weights = dict(zip(keys, values, strict=True))
        scores = _best_scores(matrix, owner, len(items), replace(start, **weights))
        for supported, partial in itertools.product(THRESHOLDS, THRESHOLDS):
            if partial >= supported:
                continue
            predicted = np.where(scores >= supported, 0, np.where(scores >= partial, 1, 2))
            value = float((predicted == labels).mean())
            if value > best_agreement + 1e-9:
                best_agreement = value
                best = replace(start, **weights, supported=supported, partial=partial)
    return best


def _feature_matrix(items: Sequence[Scored]) -> tuple[np.ndarray, np.ndarray]:
    rows, owner = [], []
    for k, item in enumerate(items):
        for f in item.candidates:
            rows.append(
                (
                    f.cosine,
                    f.coverage,
                    f.number_changed,
                    f.number_missing,
                    f.negation_mismatch,
                    f.antonym,
                    min(f.missing_names, 2),
                )
            )
            owner.append(k)
    return np.array(rows, dtype=float).reshape(-1, 7), np.array(owner, dtype=int)


def _best_scores(matrix: np.ndarray, owner: np.ndarray, n: int, c: Calibration) -> np.ndarray:
    """support_score of every candidate, vectorised; then the best per claim."""
    cosine = np.maximum(0.0, (matrix[:, 0] - c.cosine_floor) / (1.0 - c.cosine_floor))
    score = c.cosine_weight * cosine + (1.0 - c.cosine_weight) * matrix[:, 1]
    score -= c.negation_penalty * matrix[:, 4] + c.antonym_penalty * matrix[:, 5]
    score -= c.number_missing_penalty * matrix[:, 3] + c.name_penalty * matrix[:, 6]
    score = np.where(matrix[:, 2] > 0, np.minimum(score, c.partial - 0.01) * 0.5, score)
    score = np.clip(score, 0.0, 1.0)
    best = np.full(n, -1.0)
    np.maximum.at(best, owner, score)
    return best


def report(items: Sequence[Scored], calibration: Calibration = CALIBRATION) -> Report:
    confusion = {label: dict.fromkeys(LABELS, 0) for label in LABELS}
    per_trap: dict[str, list[bool]] = {}
    mistakes = []
    for item in items:
        predicted = item.verdict(calibration)
        confusion[item.claim.verdict][predicted] += 1
        per_trap.setdefault(item.claim.trap or "-", []).append(predicted == item.claim.verdict)
        if predicted != item.claim.verdict:
            mistakes.append(
                {"id": item.claim.id, "label": item.claim.verdict, "predicted": predicted}
            )
    train = [i for i in items if in_training_split(i.claim)]
    held = [i for i in items if not in_training_split(i.claim)]
    rest = [p for p in LABELS if p != "SUPPORTED"]
    binary = confusion["SUPPORTED"]["SUPPORTED"] + sum(
        confusion[label][p] for label in rest for p in rest
    )
    return Report(
        total=len(items),
        agreement=round(agreement(items, calibration), 4),
        supported_agreement=round(binary / max(1, len(items)), 4),
        confusion=confusion,
        by_trap={t: round(sum(v) / len(v), 4) for t, v in sorted(per_trap.items())},
        train_agreement=round(agreement(train, calibration), 4),
        heldout_agreement=round(agreement(held, calibration), 4),
        heldout_total=len(held),
        calibration=asdict(calibration),
        mistakes=mistakes,
    )


def score_claims(
    path: str | Path, embedder: TextEmbedder | None = None, *, refit: bool = False
) -> Report:
    """Agreement of the shipped calibration with the labels in path (JSON lines).

    With refit, the calibration is first fitted on the training split, and the report shows it.
    """
    if embedder is None:
        from services.retrieval.embeddings import LocalEmbedder

        embedder = LocalEmbedder()
    items = featurize(load_claims(path), embedder)
    calibration = CALIBRATION
    if refit:
        calibration = fit([i for i in items if in_training_split(i.claim)])
    return report(items, calibration)


def counts(items: Sequence[Scored]) -> Counter[str]:
    return Counter(i.claim.verdict for i in items)
