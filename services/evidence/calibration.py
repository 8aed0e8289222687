"""Agreement of the evidence verdicts with a hand-labelled set of (claim, passage, verdict).

score_claims() runs the product's own scoring: each passage is treated as the one chunk an
answer cited, the claim as the cited sentence, and the verdict is what the span would carry.
fit() searches the Calibration on a training split by coordinate ascent over a coarse grid;
the report gives a held-out split too, which fit() never sees. Written here rather than with an
optimiser from a package: agreement is a step function of 15 thresholds and weights, flat almost
everywhere, which gradient and simplex methods cannot follow, and a coarse grid keeps the
fit's freedom small for a few hundred labels.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from services.citations import SupportVerdict
from services.evidence.builder import TextEmbedder, evidence_builder
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
    document: str = ""  # the file the passage comes from; its name is context for names


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
            Claim(
                row["id"],
                row["claim"],
                row["passage"],
                row["verdict"],
                row.get("trap", ""),
                str(row.get("document", "")),
            )
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
            around = c.passage[
                sentences[max(0, w.first - 1)][0] : sentences[min(len(sentences) - 1, w.last + 1)][
                    1
                ]
            ]
            candidates.append(
                features(
                    c.claim,
                    c.passage[w.start : w.end],
                    cosine,
                    around=around,
                    context=c.document,
                )
            )
        scored.append(Scored(c, tuple(candidates)))
    return scored


def agreement(items: Iterable[Scored], calibration: Calibration) -> float:
    items = list(items)
    if not items:
        return 0.0
    return sum(i.verdict(calibration) == i.claim.verdict for i in items) / len(items)


def _steps(low: float, high: float, step: float) -> tuple[float, ...]:
    return tuple(round(low + step * i, 3) for i in range(round((high - low) / step) + 1))


# The search space of fit(): coarse on purpose, so the fit has few degrees of freedom.
STEPS: dict[str, tuple[float, ...]] = {
    "cosine_weight": _steps(0.2, 0.8, 0.1),
    "cosine_floor": _steps(0.0, 0.5, 0.1),
    "negation_penalty": _steps(0.0, 0.6, 0.1),
    "polarity_penalty": _steps(0.0, 0.3, 0.05),
    "antonym_penalty": _steps(0.0, 0.6, 0.1),
    "swap_penalty": _steps(0.0, 0.6, 0.1),
    "added_name_penalty": _steps(0.0, 0.3, 0.05),
    "number_missing_penalty": _steps(0.0, 0.2, 0.05),
    "copy_coverage": _steps(0.8, 1.0, 0.05),
    "contradiction_cap": _steps(0.2, 1.0, 0.05),
    "clause_gap": _steps(0.2, 1.0, 0.05),
    "clause_low": _steps(0.2, 0.6, 0.05),
    "clause_high": _steps(0.5, 1.0, 0.05),
    "supported": _steps(0.3, 0.9, 0.025),
    "partial": _steps(0.1, 0.6, 0.025),
}
ROUNDS = 6


def fit(items: Sequence[Scored], start: Calibration = CALIBRATION) -> Calibration:
    """Coordinate ascent: each value of each parameter in turn, keeping any that agrees more.

    Rounds repeat until none improves (at most ROUNDS). A local optimum, which is what a
    calibration with so few labelled pairs deserves; ties keep the earlier value.
    """
    best, best_agreement = start, agreement(items, start)
    for _ in range(ROUNDS):
        improved = False
        for name, values in STEPS.items():
            for value in values:
                candidate = replace(best, **{name: value})
                if candidate.partial >= candidate.supported:
                    continue
                value_agreement = agreement(items, candidate)
                if value_agreement > best_agreement + 1e-9:
                    best, best_agreement, improved = candidate, value_agreement, True
        if not improved:
            break
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


def score_claims(path: str | Path, embedder: str = "static", *, refit: bool = False) -> Report:
    """Agreement of the shipped calibration with the labels in path (JSON lines), with the
    evidence embedder named ("static" or "local") and the calibration fitted for it.

    With refit, the calibration is first fitted on the training split, and the report shows it.
    """
    builder = evidence_builder(embedder)
    items = featurize(load_claims(path), builder.embedder)
    calibration = builder.calibration
    if refit:
        calibration = fit(
            [i for i in items if in_training_split(i.claim)], start=builder.calibration
        )
    return report(items, calibration)


def counts(items: Sequence[Scored]) -> Counter[str]:
    return Counter(i.claim.verdict for i in items)
