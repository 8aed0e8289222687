"""`footnote eval`: score a labelled question set through the real API (docs/quality.md)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from footnote.cli.connection import (
    ApiKeyOpt,
    ClientStateDirOpt,
    JsonOpt,
    TargetOpt,
    connect,
)
from footnote.cli.verdicts import report_lines, score_verdicts
from footnote.evaluation import (
    METRICS,
    EvalSetError,
    Outcome,
    Question,
    Report,
    SourceView,
    load_questions,
    score,
)


def evaluate(
    questions_file: Annotated[
        Path,
        typer.Argument(
            metavar="FILE.jsonl", help="The labelled questions.", exists=True, dir_okay=False
        ),
    ],
    assistant: Annotated[
        str, typer.Option("--assistant", help="Ask this assistant (its documents are the set's).")
    ] = "",
    upload: Annotated[
        Path | None,
        typer.Option(
            "--upload",
            help="First create a fresh assistant and upload every file in this folder to it.",
            exists=True,
            file_okay=False,
        ),
    ] = None,
    claims: Annotated[
        Path | None,
        typer.Option(
            "--claims",
            help="Labelled (claim, passage, verdict) triples to score the evidence verdicts "
            "against; default: claims.jsonl beside FILE.jsonl, when there is one.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
    target: TargetOpt = None,
    api_key: ApiKeyOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """Ask every question, then print document recall, location recall, citation precision
    and abstention, with a row per question, and how often the evidence verdicts agree with
    labelled claims."""
    if bool(assistant) == (upload is not None):
        raise typer.BadParameter("give --assistant ID or --upload DIR (one of them)")
    try:
        questions = load_questions(questions_file)
    except EvalSetError as err:
        raise typer.BadParameter(str(err), param_hint="FILE.jsonl") from None
    # Scored first: a bad labelled file fails before any question is asked.
    claims = claims or _beside(questions_file)
    verdicts = score_verdicts(claims)  # run here, like eval-claims: no server involved
    with connect(target, api_key, state_dir) as client:
        channel, conn = client.channel, client.conn
        if upload is not None:
            assistant = upload_set(channel, conn, upload, questions_file.stem)
            typer.echo(f"footnote: evaluating assistant {assistant}", err=True)
        outcomes = [ask(channel, conn, assistant, q) for q in questions]
    report = score(outcomes)
    if verdicts is not None:
        report.metrics["verdict_agreement"] = verdicts.agreement
    if as_json:
        extra = {"verdicts": verdicts.to_json()} if verdicts is not None else {}
        print(json.dumps({"assistant": assistant, **report.__dict__, **extra}, indent=2))
    else:
        print_report(report, outcomes)
        if verdicts is not None:
            print(f"\nevidence verdicts against {claims}:")
            print("\n".join(report_lines(verdicts)))
    if any(o.error for o in outcomes):
        raise typer.Exit(1)


def _beside(questions_file: Path) -> Path | None:
    path = questions_file.with_name("claims.jsonl")
    return path if path.is_file() and path != questions_file else None


def upload_set(channel: object, conn: object, folder: Path, name: str) -> str:
    """A new assistant holding every file of folder, all READY; exits when one fails."""
    from footnote.client import upload_requests, wait_final
    from footnote.v1 import assistants_service_pb2 as apb
    from footnote.v1 import assistants_service_pb2_grpc as apb_grpc
    from footnote.v1 import documents_service_pb2 as dpb
    from footnote.v1 import documents_service_pb2_grpc as dpb_grpc

    metadata = conn.metadata  # type: ignore[attr-defined]
    made = apb_grpc.AssistantsServiceStub(channel).CreateAssistant(
        apb.CreateAssistantRequest(
            assistant=apb.Assistant(display_name=f"eval {name} {time.strftime('%Y-%m-%d %H:%M')}")
        ),
        metadata=metadata,
    )
    docs = dpb_grpc.DocumentsServiceStub(channel)
    files = sorted(p for p in folder.iterdir() if p.is_file())
    if not files:
        raise typer.BadParameter(f"no files in {folder}", param_hint="--upload")
    for path in files:
        doc = docs.UploadDocument(upload_requests(path, made.id, lambda _: None), metadata=metadata)
        final = wait_final(docs, conn, doc.id)  # type: ignore[arg-type]
        if final.state != dpb.DOCUMENT_STATE_READY:
            typer.echo(f"footnote: {path.name} did not index: {final.error}", err=True)
            raise typer.Exit(1)
    return made.id


def ask(channel: object, conn: object, assistant: str, question: Question) -> Outcome:
    """One question through Complete, as a fresh conversation."""
    import grpc

    from footnote.v1 import chat_service_pb2 as cpb
    from footnote.v1 import chat_service_pb2_grpc as cpb_grpc

    request = cpb.CompleteRequest(
        assistant_id=assistant,
        messages=[cpb.ChatMessage(role=cpb.ROLE_USER, content=question.question)],
    )
    try:
        response = cpb_grpc.ChatServiceStub(channel).Complete(
            request,
            metadata=conn.metadata,  # type: ignore[attr-defined]
        )
    except grpc.RpcError as err:
        return Outcome(question, (), (), error=f"{err.code().name}: {err.details()}")
    citations = response.citations
    sources = tuple(
        SourceView(
            index=s.index,
            document_name=s.document_name,
            start_line=s.location.start_line,
            end_line=s.location.end_line,
            page_start=s.location.page_start,
            page_end=s.location.page_end,
            heading_path=tuple(s.location.heading_path),
        )
        for s in citations.sources
    )
    return Outcome(
        question,
        sources,
        tuple(citations.referenced_indices),
        answer=response.message.content,
        spans=tuple((span.start, span.end) for span in citations.spans),
    )


def _mark(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "NO")


def print_report(report: Report, outcomes: list[Outcome]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("id", "document", "location", "cited", "precise", "first loc", "question")
    for row, outcome in zip(report.questions, outcomes, strict=True):
        if row["no_answer"]:
            document, location = "-", "abstained" if row["abstained"] else "CITED"
        else:
            document, location = _mark(row["document_hit"]), _mark(row["location_hit"])
        table.add_row(
            row["id"],
            document,
            location,
            ",".join(map(str, row["cited"])) or "-",
            f"{row['cited_from_expected_document']}/{row['cited_total']}",
            str(row["retrieved_location_rank"] or "-"),
            row["error"] or outcome.question.question[:60],
        )
    console = Console(file=sys.stdout)
    console.print(table)
    for metric in METRICS:
        value = report.metrics[metric.name]
        shown = "n/a" if value is None else f"{value:.3f}"
        console.print(f"{metric.name:<27} {shown:>6}  {metric.description}")
