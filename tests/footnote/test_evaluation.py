"""The eval metrics: matching locations per format, and each metric going down when it should."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from footnote.evaluation import (
    EvalSetError,
    Expected,
    Outcome,
    Question,
    SourceView,
    load_questions,
    location_matches,
    score,
)

TXT = Expected("gpl.txt", start_line=415, end_line=420)
PDF = Expected("spec.pdf", page=4)
DOCX = Expected("mpl.docx", heading="5. Termination")


def test_lines_overlap_pages_contain_and_headings_equal() -> None:
    assert location_matches(TXT, SourceView(1, "gpl.txt", start_line=400, end_line=415))
    assert not location_matches(TXT, SourceView(1, "gpl.txt", start_line=421, end_line=440))
    assert not location_matches(TXT, SourceView(1, "other.txt", start_line=400, end_line=430))
    assert location_matches(PDF, SourceView(1, "spec.pdf", page_start=3, page_end=4))
    assert not location_matches(PDF, SourceView(1, "spec.pdf", page_start=5, page_end=6))
    assert location_matches(DOCX, SourceView(1, "mpl.docx", heading_path=("MPL", "5. Termination")))
    # The innermost heading must match, not a parent of it.
    assert not location_matches(
        DOCX, SourceView(1, "mpl.docx", heading_path=("5. Termination", "5.1"))
    )
    md = Expected("README.md", heading="`load_dotenv`")
    assert location_matches(md, SourceView(1, "README.md", heading_path=("load_dotenv.",)))


def outcome(
    expected: Expected | None, sources: list[SourceView], cited: tuple[int, ...]
) -> Outcome:
    question = Question("q", "?", (expected,) if expected else (), expected is None)
    return Outcome(question, tuple(sources), cited)


def test_metrics() -> None:
    right = SourceView(1, "gpl.txt", start_line=410, end_line=418)
    near = SourceView(2, "gpl.txt", start_line=100, end_line=120)
    wrong = SourceView(3, "apache.txt", start_line=1, end_line=20)
    report = score(
        [
            outcome(TXT, [right, near, wrong], (1, 3)),
            outcome(TXT, [wrong, near], (2,)),
            outcome(None, [wrong], ()),
            outcome(None, [wrong], (1,)),
        ]
    )
    m = report.metrics
    assert m["document_recall"] == 1.0
    assert m["location_recall"] == 0.5
    assert m["citation_precision"] == pytest.approx(2 / 3)
    assert m["abstention"] == 0.5
    assert m["verdict_agreement"] is None
    assert m["retrieval_location_recall"] == 0.5
    assert [q["retrieved_location_rank"] for q in report.questions] == [1, 0, 0, 0]


def test_cited_share_counts_overlapping_spans_once() -> None:
    question = Question("q", "?", (TXT,), False)
    answer = "First claim [1]. Second claim [1]. Uncited tail."
    full = Outcome(question, (), (1,), answer=answer, spans=((0, 16), (17, 34)))
    overlapping = Outcome(question, (), (1,), answer=answer, spans=((0, 16), (5, 16)))
    assert full.cited_share == pytest.approx(33 / len(answer))
    assert overlapping.cited_share == pytest.approx(16 / len(answer))
    report = score(
        [full, overlapping, Outcome(question, (), (), answer="The documents do not say.")]
    )
    assert report.metrics["cited_share_min"] == pytest.approx(16 / len(answer))
    assert report.metrics["cited_share_mean"] == pytest.approx((33 + 16) / 2 / len(answer))


def test_load_questions_checks_every_line(tmp_path: Path) -> None:
    good = {"id": "q1", "question": "Q?", "answer": [{"document": "a.txt", "start_line": 3}]}
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({**good, "id": "q2", "answer": []}))
    with pytest.raises(EvalSetError, match=":3:"):
        load_questions(path)
    path.write_text(json.dumps(good))
    [question] = load_questions(path)
    assert question.answers[0].end_line == 3 and not question.no_answer


def test_answers_that_paste_a_source_header_are_counted() -> None:
    question = Question("q", "?", (TXT,), False)
    answers = [
        "The term is 60 days [1].",
        '<source id="1" title="gpl-3.0.txt">\nYou may convey...',
        '[2] (Source: "apache-2.0.txt") Licensor grants...',
        "The documents do not say.",
    ]
    report = score([Outcome(question, (), (), answer=a) for a in answers])
    assert report.metrics["pasted_headers"] == 0.5
    assert [q["answer"] for q in report.questions] == answers
