"""`footnote eval` end to end: upload a small set to a fresh assistant and score it over gRPC."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from typer.testing import CliRunner

from footnote.cli.main import app

pytestmark = pytest.mark.usefixtures("worker")

LEAVE = """# Leave policy

## Annual leave

Everyone gets 25 days of paid annual leave each year.
Unused days expire at the end of March.

## Sick leave

Tell your manager before 10:00 on the first day you are sick.
"""
KITCHEN = """# Kitchen

The espresso machine is descaled every Friday by the facilities team.
"""


async def test_eval_uploads_the_set_and_scores_it(tmp_path, grpc_target, make_key) -> None:
    documents = tmp_path / "documents"
    documents.mkdir()
    (documents / "leave.md").write_text(LEAVE)
    (documents / "kitchen.md").write_text(KITCHEN)
    questions = tmp_path / "questions.jsonl"
    rows = [
        {"id": "q1", "question": "How many days of paid annual leave do I get each year?",
         "answer": [{"document": "leave.md", "start_line": 5, "end_line": 5,
                     "heading": "Annual leave"}], "no_answer": False},
        {"id": "q2", "question": "When is the espresso machine descaled?",
         "answer": [{"document": "kitchen.md", "start_line": 3, "end_line": 3}],
         "no_answer": False},
        {"id": "q3", "question": "What is the dress code for the summer party?", "answer": [],
         "no_answer": True},
    ]  # fmt: skip
    questions.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    key = make_key("eval-cli")
    args = ["eval", str(questions), "--upload", str(documents), "--target", grpc_target]
    result = await asyncio.to_thread(CliRunner().invoke, app, [*args, "--api-key", key, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [q["id"] for q in report["questions"]] == ["q1", "q2", "q3"]
    metrics = report["metrics"]
    assert metrics["retrieval_document_recall"] == 1.0
    assert metrics["retrieval_location_recall"] == 1.0
    assert metrics["document_recall"] == 1.0
    assert set(metrics) >= {"location_recall", "citation_precision", "abstention"}
    assert metrics["verdict_agreement"] is None

    async def again():
        args = ["eval", str(questions), "--assistant", report["assistant"]]
        return await asyncio.to_thread(
            CliRunner().invoke, app, [*args, "--target", grpc_target, "--api-key", key, "--json"]
        )

    # A second run on the same assistant asks again and gives the same report.
    second = await again()
    assert second.exit_code == 0, second.output
    assert json.loads(second.stdout)["metrics"] == metrics

    # Labelled claims beside the questions: the evidence verdicts are scored against them too.
    passage = "Everyone gets 25 days of paid annual leave each year."
    claims = [
        {"id": "a", "claim": "Everyone gets 25 days of paid annual leave.", "verdict": "SUPPORTED",
         "passage": passage},
        {"id": "b", "claim": "Everyone gets 30 days of paid annual leave.",
         "verdict": "UNSUPPORTED", "passage": passage},
    ]  # fmt: skip
    (tmp_path / "claims.jsonl").write_text("".join(json.dumps(c) + "\n" for c in claims))
    scored = await again()
    assert scored.exit_code == 0, scored.output
    with_verdicts = json.loads(scored.stdout)
    assert with_verdicts["metrics"]["verdict_agreement"] == 1.0
    assert with_verdicts["verdicts"]["confusion"]["UNSUPPORTED"]["UNSUPPORTED"] == 1


async def test_eval_refuses_bad_claims_before_asking(tmp_path, grpc_target) -> None:
    questions = tmp_path / "questions.jsonl"
    row = {"id": "q1", "question": "Where?", "answer": [], "no_answer": True}
    questions.write_text(json.dumps(row) + "\n")
    claims = tmp_path / "labels.jsonl"
    claims.write_text('{"id": "a", "claim": "x", "passage": "y", "verdict": "PERHAPS"}\n')
    result = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["eval", str(questions), "--assistant", "unknown", "--claims", str(claims),
         "--target", grpc_target, "--api-key", "wrong"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "verdict must be one of" in result.output


async def test_eval_refuses_a_bad_set(tmp_path, grpc_target) -> None:
    questions = tmp_path / "questions.jsonl"
    questions.write_text('{"id": "q1", "question": "?", "answer": [], "no_answer": false}\n')
    result = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["eval", str(questions), "--assistant", "x", "--target", grpc_target, "--api-key", "k"],
    )
    assert result.exit_code == 2
    # The error box wraps long paths wherever the terminal width falls: compare without it.
    assert "questions.jsonl:1" in re.sub(r"[\s│]+", "", result.output)
