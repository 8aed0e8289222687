"""The evidence section printed after an answer, and `footnote eval-claims`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from footnote.cli.evidence_view import evidence_lines
from footnote.cli.main import app
from footnote.v1 import chat_service_pb2 as pb
from footnote.v1 import citations_pb2 as cpb


def response() -> pb.CompleteResponse:
    loc = cpb.SourceLocation(
        start_offset=9, end_offset=60, start_line=3, end_line=3, heading="Paris"
    )
    return pb.CompleteResponse(
        citations=cpb.Citations(
            sources=[
                cpb.CitationSource(index=1, document_name="paris.md"),
                cpb.CitationSource(index=2, document_name="berlin.md"),
            ],
            spans=[
                cpb.CitationSpan(
                    start=0,
                    end=26,
                    source_indices=[1],
                    cited_text="Berlin sits on the Spree.",
                    verdict=cpb.SUPPORT_VERDICT_UNSUPPORTED,
                    evidence=[
                        cpb.Evidence(
                            source_index=1,
                            quote="Paris sits on the Seine.",
                            location=loc,
                            support_score=0.1,
                            verdict=cpb.SUPPORT_VERDICT_UNSUPPORTED,
                            origin=cpb.CITATION_ORIGIN_MODEL,
                        ),
                        cpb.Evidence(
                            source_index=2,
                            quote="Berlin sits on the Spree.",
                            support_score=0.9,
                            verdict=cpb.SUPPORT_VERDICT_SUPPORTED,
                            origin=cpb.CITATION_ORIGIN_ATTRIBUTED,
                        ),
                    ],
                )
            ],
            uncited_claims=[cpb.CitationSpan(start=27, end=60, cited_text="The moon is cheese.")],
        )
    )


def test_evidence_lines_show_verdicts_quotes_and_uncited_claims() -> None:
    lines = evidence_lines(response())
    assert lines[0] == "Evidence:"
    assert lines[1] == '  "Berlin sits on the Spree." [1] UNSUPPORTED'
    assert lines[2] == "    [1] cited, UNSUPPORTED 0.10: paris.md, line 3, §Paris"
    assert lines[3] == '        "Paris sits on the Seine."'
    assert lines[4] == "    [2] attributed, supported 0.90: berlin.md"
    assert lines[-2:] == [
        "Claims that no source supports:",
        '  "The moon is cheese." (characters 27-60)',
    ]


def test_no_citations_no_lines() -> None:
    assert evidence_lines(pb.CompleteResponse()) == []


@pytest.mark.parametrize("embedder", ["static", "local"])
def test_eval_claims_reports_agreement(tmp_path, embedder: str) -> None:
    rows = [
        {"id": "a", "claim": "Tokens expire after 30 days.", "verdict": "SUPPORTED",
         "passage": "Tokens expire after 30 days. They can be renewed.", "trap": "none"},
        {"id": "b", "claim": "Tokens expire after 90 days.", "verdict": "UNSUPPORTED",
         "passage": "Tokens expire after 30 days. They can be renewed.", "trap": "number"},
    ]  # fmt: skip
    path = tmp_path / "claims.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(app, ["eval-claims", str(path), "--json", "--embedder", embedder])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["total"] == 2
    assert report["agreement"] == 1.0
    assert report["confusion"]["UNSUPPORTED"]["UNSUPPORTED"] == 1


def test_eval_claims_rejects_a_bad_file(tmp_path) -> None:
    path = tmp_path / "claims.jsonl"
    path.write_text('{"id": "a", "claim": "x", "passage": "y", "verdict": "MAYBE"}\n')
    result = CliRunner().invoke(app, ["eval-claims", str(path)])
    assert result.exit_code == 2
    assert "verdict must be one of" in result.output


def test_eval_claims_rejects_an_unknown_embedder(tmp_path) -> None:
    path = tmp_path / "claims.jsonl"
    path.write_text('{"id": "a", "claim": "x", "passage": "y", "verdict": "SUPPORTED"}\n')
    result = CliRunner().invoke(app, ["eval-claims", str(path), "--embedder", "nli"])
    assert result.exit_code == 2
    assert "--embedder must be static or local" in result.output
