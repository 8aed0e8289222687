"""Scoring a labelled question set: which cited sources are the right document and place.

The metrics are defined in docs/quality.md; this module is their one implementation, used by
`footnote eval` (answers through the API) and bench/retrieval.py (retrieval alone).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOCATION_KEYS = ("start_line", "end_line", "page", "heading")


class EvalSetError(ValueError):
    """A labelled set that cannot be read; the message names the line."""


@dataclass(frozen=True)
class Expected:
    """One acceptable answer location: a document and its lines, page or heading."""

    document: str
    start_line: int = 0
    end_line: int = 0
    page: int = 0
    heading: str = ""
    quote: str = ""


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    answers: tuple[Expected, ...]
    no_answer: bool


@dataclass(frozen=True)
class SourceView:
    """What scoring needs of a source: its document and where it points."""

    index: int
    document_name: str
    start_line: int = 0
    end_line: int = 0
    page_start: int = 0
    page_end: int = 0
    heading_path: tuple[str, ...] = ()


@dataclass(frozen=True)
class Outcome:
    """One question's answer as scored: the sources given, and the numbers cited."""

    question: Question
    sources: tuple[SourceView, ...]
    cited: tuple[int, ...]
    answer: str = ""
    error: str = ""
    # The answer's cited sentences, as (start, end) code-point ranges of answer.
    spans: tuple[tuple[int, int], ...] = ()

    @property
    def cited_share(self) -> float:
        """The share of the answer's characters that sit inside a cited span."""
        covered, reach = 0, 0
        for start, end in sorted(self.spans):
            start = max(start, reach)
            if end > start:
                covered += end - start
                reach = end
        return covered / len(self.answer) if self.answer else 0.0

    @property
    def cited_sources(self) -> tuple[SourceView, ...]:
        wanted = set(self.cited)
        return tuple(s for s in self.sources if s.index in wanted)

    @property
    def abstained(self) -> bool:
        return not self.cited

    @property
    def document_hit(self) -> bool:
        return any(is_expected_document(self.question, s) for s in self.cited_sources)

    @property
    def location_hit(self) -> bool:
        return any(is_expected_location(self.question, s) for s in self.cited_sources)

    @property
    def precise_citations(self) -> tuple[int, int]:
        """(cited sources from an expected document, cited sources)."""
        cited = self.cited_sources
        return sum(is_expected_document(self.question, s) for s in cited), len(cited)

    @property
    def retrieved_document_rank(self) -> int:
        """1-based rank of the first source from an expected document, 0 when none."""
        return first_rank(self.sources, lambda s: is_expected_document(self.question, s))

    @property
    def retrieved_location_rank(self) -> int:
        """1-based rank of the first source at an expected location, 0 when none."""
        return first_rank(self.sources, lambda s: is_expected_location(self.question, s))


def first_rank(sources: Sequence[SourceView], hit: Callable[[SourceView], bool]) -> int:
    ordered = sorted(sources, key=lambda s: s.index)
    return next((rank for rank, s in enumerate(ordered, start=1) if hit(s)), 0)


def load_questions(path: Path) -> list[Question]:
    """Read questions.jsonl; raises EvalSetError naming the bad line."""
    questions: list[Question] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                questions.append(_question(json.loads(line)))
            except (ValueError, KeyError, TypeError) as err:
                raise EvalSetError(f"{path}:{number}: {err}") from None
            if questions[-1].id in seen:
                raise EvalSetError(f"{path}:{number}: duplicate id {questions[-1].id!r}")
            seen.add(questions[-1].id)
    if not questions:
        raise EvalSetError(f"{path}: no questions")
    return questions


def _question(raw: dict[str, Any]) -> Question:
    answers = tuple(
        Expected(
            document=str(a["document"]),
            start_line=int(a.get("start_line", 0)),
            end_line=int(a.get("end_line", a.get("start_line", 0))),
            page=int(a.get("page", 0)),
            heading=str(a.get("heading", "")),
            quote=str(a.get("quote", "")),
        )
        for a in raw.get("answer", [])
    )
    no_answer = bool(raw.get("no_answer", False))
    if not str(raw.get("question", "")).strip():
        raise ValueError("empty question")
    if no_answer == bool(answers):
        raise ValueError("a question has answer locations or no_answer true, not both")
    for a in answers:
        if not (a.start_line or a.page or a.heading):
            raise ValueError(f"answer in {a.document!r} has no start_line, page or heading")
    return Question(str(raw["id"]), str(raw["question"]), answers, no_answer)


def normalize_heading(title: str) -> str:
    # Markdown headings lose their backticks in extraction; trailing dots vary between styles.
    return " ".join(title.replace("`", "").split()).rstrip(".:").casefold()


def location_matches(expected: Expected, source: SourceView) -> bool:
    """Same document, and the source covers the expected lines, page or heading.

    Lines are compared when the label has lines (plain text, Markdown, HTML), else the page
    (PDF), else the innermost heading (DOCX).
    """
    if source.document_name != expected.document:
        return False
    if expected.start_line:
        return bool(source.start_line) and (
            source.start_line <= expected.end_line and expected.start_line <= source.end_line
        )
    if expected.page:
        last = source.page_end or source.page_start
        return bool(source.page_start) and source.page_start <= expected.page <= last
    if expected.heading:
        return bool(source.heading_path) and normalize_heading(
            source.heading_path[-1]
        ) == normalize_heading(expected.heading)
    return False


def is_expected_document(question: Question, source: SourceView) -> bool:
    return any(source.document_name == a.document for a in question.answers)


def is_expected_location(question: Question, source: SourceView) -> bool:
    return any(location_matches(a, source) for a in question.answers)


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def _answerable(outcomes: Sequence[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if not o.question.no_answer]


def document_recall(outcomes: Sequence[Outcome]) -> float | None:
    return _mean(o.document_hit for o in _answerable(outcomes))


def location_recall(outcomes: Sequence[Outcome]) -> float | None:
    return _mean(o.location_hit for o in _answerable(outcomes))


def citation_precision(outcomes: Sequence[Outcome]) -> float | None:
    pairs = [o.precise_citations for o in _answerable(outcomes)]
    cited = sum(total for _, total in pairs)
    return sum(right for right, _ in pairs) / cited if cited else None


def abstention(outcomes: Sequence[Outcome]) -> float | None:
    return _mean(o.abstained for o in outcomes if o.question.no_answer)


def retrieval_document_recall(outcomes: Sequence[Outcome]) -> float | None:
    return _mean(o.retrieved_document_rank > 0 for o in _answerable(outcomes))


def retrieval_location_recall(outcomes: Sequence[Outcome]) -> float | None:
    return _mean(o.retrieved_location_rank > 0 for o in _answerable(outcomes))


def _answered(outcomes: Sequence[Outcome]) -> list[Outcome]:
    return [o for o in _answerable(outcomes) if not o.abstained]


def cited_share_mean(outcomes: Sequence[Outcome]) -> float | None:
    return _mean(o.cited_share for o in _answered(outcomes))


def cited_share_min(outcomes: Sequence[Outcome]) -> float | None:
    shares = [o.cited_share for o in _answered(outcomes)]
    return min(shares) if shares else None


# What a model copies from the prompt instead of answering: the current source tags
# (`<source id="1" title="...">`, `</source>`) or the earlier `[1] (Source: "...")` header.
PASTED_HEADER = re.compile(r"</?source\b|\(Source:", re.IGNORECASE)


def pasted_headers(outcomes: Sequence[Outcome]) -> float | None:
    """The share of answers that paste a source header from the prompt."""
    answered = [o for o in outcomes if not o.error]
    if not answered:
        return None
    return sum(bool(PASTED_HEADER.search(o.answer)) for o in answered) / len(answered)


def verdict_agreement(outcomes: Sequence[Outcome]) -> float | None:
    """Not computed from answers: `footnote eval --claims` fills it from labelled claims."""
    return None


@dataclass(frozen=True)
class Metric:
    name: str
    description: str
    compute: Callable[[Sequence[Outcome]], float | None]
    headline: bool = True


# The order of the report. A new measure is one more entry here.
METRICS: tuple[Metric, ...] = (
    Metric(
        "document_recall",
        "answerable questions whose answer cites a source from an expected document",
        document_recall,
    ),
    Metric(
        "location_recall",
        "answerable questions whose answer cites a source at an expected location",
        location_recall,
    ),
    Metric(
        "citation_precision",
        "cited sources (answerable questions) that come from an expected document",
        citation_precision,
    ),
    Metric(
        "abstention",
        "no-answer questions answered without any citation",
        abstention,
    ),
    Metric(
        "cited_share_mean",
        "of each answered question's answer, the share of its text inside cited spans (mean)",
        cited_share_mean,
    ),
    Metric(
        "cited_share_min",
        "the same share for the least-cited answer",
        cited_share_min,
    ),
    Metric(
        "pasted_headers",
        "answers that paste a source header or tag from the prompt (a model's failure)",
        pasted_headers,
    ),
    Metric(
        "verdict_agreement",
        "evidence verdicts that agree with the labelled claims (--claims; three classes)",
        verdict_agreement,
    ),
    Metric(
        "retrieval_document_recall",
        "answerable questions with an expected document among the sources given",
        retrieval_document_recall,
        headline=False,
    ),
    Metric(
        "retrieval_location_recall",
        "answerable questions with an expected location among the sources given",
        retrieval_location_recall,
        headline=False,
    ),
)


@dataclass
class Report:
    metrics: dict[str, float | None] = field(default_factory=dict)
    questions: list[dict[str, Any]] = field(default_factory=list)


def score(outcomes: Sequence[Outcome]) -> Report:
    """Every metric, and one row per question."""
    report = Report(metrics={m.name: m.compute(outcomes) for m in METRICS})
    for o in outcomes:
        right, cited = o.precise_citations
        report.questions.append(
            {
                "id": o.question.id,
                "no_answer": o.question.no_answer,
                "cited": list(o.cited),
                "document_hit": None if o.question.no_answer else o.document_hit,
                "location_hit": None if o.question.no_answer else o.location_hit,
                "cited_from_expected_document": right,
                "cited_total": cited,
                "abstained": o.abstained,
                "retrieved_location_rank": o.retrieved_location_rank,
                "error": o.error,
                "answer": o.answer,
            }
        )
    return report
