"""`footnote eval-claims FILE.jsonl`: agreement of the evidence verdicts with hand labels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from services.evidence.calibration import Report


def eval_claims(
    path: Annotated[Path, typer.Argument(help="Labelled claims, one JSON object a line.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    fit: Annotated[
        bool, typer.Option("--fit", help="Also fit the calibration on the training split.")
    ] = False,
    embedder: Annotated[
        str | None,
        typer.Option(
            "--embedder",
            help="static or local (default: FOOTNOTE_EVIDENCE_EMBEDDER, else static).",
        ),
    ] = None,
) -> None:
    """Score (claim, passage, verdict) triples with the evidence scorer and report agreement."""
    # Imported here: the scorer loads numpy and the embedding model, which other commands skip.
    from services.evidence.calibration import LabelError, score_claims

    if embedder is None:
        from services.config import get_settings

        embedder = get_settings().evidence_embedder
    if embedder not in ("static", "local"):
        typer.echo(
            f"footnote eval-claims: --embedder must be static or local, not {embedder}", err=True
        )
        raise typer.Exit(2)
    if not path.is_file():
        typer.echo(f"footnote eval-claims: no such file: {path}", err=True)
        raise typer.Exit(2)
    try:
        report = score_claims(path, embedder, refit=fit)
    except LabelError as err:
        typer.echo(f"footnote eval-claims: {path}: {err}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
        return
    for line in report_lines(report):
        typer.echo(line)


def report_lines(report: Report) -> list[str]:
    """The report as plain text: agreement, splits, a confusion matrix and per-trap agreement."""
    from services.evidence.calibration import LABELS

    lines = [
        f"claims: {report.total}",
        f"agreement: {report.agreement:.3f}",
        f"SUPPORTED against the rest: {report.supported_agreement:.3f}",
        f"train split: {report.train_agreement:.3f}   held-out split: "
        f"{report.heldout_agreement:.3f} ({report.heldout_total} claims)",
        "",
        "label \\ verdict".ljust(18) + "".join(label.ljust(13) for label in LABELS),
    ]
    for label in LABELS:
        row = report.confusion[label]
        lines.append(label.ljust(18) + "".join(str(row[p]).ljust(13) for p in LABELS))
    lines.append("")
    lines.append("agreement by trap:")
    lines.extend(f"  {trap.ljust(16)} {value:.3f}" for trap, value in report.by_trap.items())
    return lines


def score_verdicts(path: Path | None) -> Report | None:
    """The evidence scorer's agreement with the labelled claims in path, run here with the
    configured evidence embedder (as `footnote eval-claims` does); None without a file."""
    if path is None:
        return None
    from services.config import get_settings
    from services.evidence.calibration import LabelError, score_claims

    try:
        return score_claims(path, get_settings().evidence_embedder)
    except LabelError as err:
        raise typer.BadParameter(f"{path}: {err}", param_hint="--claims") from None
