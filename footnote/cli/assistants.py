"""`footnote assistants`: create, list, show, change and delete assistants."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer

from footnote.cli.connection import (
    ApiKeyOpt,
    ClientStateDirOpt,
    JsonOpt,
    PageSizeOpt,
    PageTokenOpt,
    TargetOpt,
    connect,
)
from footnote.cli.output import (
    enum_name,
    print_deleted,
    print_json,
    print_record,
    print_table,
    timestamp,
)
from footnote.client import pages
from footnote.v1 import assistants_service_pb2 as apb

app = typer.Typer(
    help="Create, list, show, change and delete assistants and their settings.",
    no_args_is_help=True,
)

SETTINGS_PANEL = "Settings"


class LinkMode(StrEnum):
    none = "none"
    authenticated = "authenticated"
    public = "public"


LINK_MODES = {
    LinkMode.none: apb.CITATION_LINK_MODE_NONE,
    LinkMode.authenticated: apb.CITATION_LINK_MODE_AUTHENTICATED,
    LinkMode.public: apb.CITATION_LINK_MODE_PUBLIC,
}


def settings_option(*names: str, help: str) -> Any:
    return typer.Option(*names, help=help, rich_help_panel=SETTINGS_PANEL)


IdArg = Annotated[str, typer.Argument(metavar="ID", help="The assistant's id.", show_default=False)]
SystemPromptOpt = Annotated[
    str | None,
    settings_option(
        "--system-prompt", help="Instructions placed first in the prompt; '' for the built-in one."
    ),
]
ModelOpt = Annotated[
    str | None,
    settings_option("--model", help="Generator model name; '' for the server's default."),
]
TemperatureOpt = Annotated[
    float | None, settings_option("--temperature", help="Sampling temperature, 0 to 2.")
]
MaxOutputTokensOpt = Annotated[
    int | None,
    settings_option("--max-output-tokens", help="Longest answer in tokens, 1 to 32768."),
]
EnableRagOpt = Annotated[
    bool | None,
    settings_option("--enable-rag/--no-enable-rag", help="Answer from retrieved document chunks."),
]
EnableCitationsOpt = Annotated[
    bool | None,
    settings_option(
        "--enable-citations/--no-enable-citations", help="Give answers with citations."
    ),
]
LinkModeOpt = Annotated[
    LinkMode | None,
    settings_option(
        "--link-mode",
        help="Download link on cited sources: none, authenticated (the HTTP endpoint, "
        "needs the key) or public (a presigned URL).",
    ),
]
TopKOpt = Annotated[
    int | None, settings_option("--top-k", help="Chunks retrieval returns, 1 to 100.")
]
ScoreThresholdOpt = Annotated[
    float | None,
    settings_option("--score-threshold", help="Lowest score, 0 to 1, a chunk needs to be used."),
]
MaxSourcesOpt = Annotated[
    int | None,
    settings_option("--max-sources", help="Most sources given to the model, 1 to 100."),
]
ExcerptCharsOpt = Annotated[
    int | None,
    settings_option("--excerpt-chars", help="Length of each source excerpt, 20 to 5000."),
]
RetrievalGateOpt = Annotated[
    bool | None,
    settings_option(
        "--enable-retrieval-gate/--no-enable-retrieval-gate",
        help="Let messages that need no documents, such as greetings, skip retrieval.",
    ),
]


def settings_from_flags(**flags: Any) -> tuple[apb.AssistantSettings, list[str]]:
    """The settings the given flags set, and their update_mask paths (flags left out are None)."""
    settings = apb.AssistantSettings()
    paths = []
    for name, value in flags.items():
        if value is None:
            continue
        if name == "citation_link_mode":
            value = LINK_MODES[value]
        setattr(settings, name, value)
        paths.append(f"settings.{name}")
    return settings, paths


def number(value: float) -> str:
    return f"{value:g}"


def assistant_fields(a: apb.Assistant) -> list[tuple[str, str]]:
    s = a.settings
    return [
        ("id", a.id),
        ("display_name", a.display_name),
        ("create_time", timestamp(a.create_time)),
        ("update_time", timestamp(a.update_time)),
        ("settings.system_prompt", s.system_prompt),
        ("settings.model", s.model),
        ("settings.temperature", number(s.temperature)),
        ("settings.max_output_tokens", str(s.max_output_tokens)),
        ("settings.enable_rag", str(s.enable_rag).lower()),
        ("settings.enable_citations", str(s.enable_citations).lower()),
        ("settings.citation_link_mode", link_mode_name(s.citation_link_mode)),
        ("settings.top_k", str(s.top_k)),
        ("settings.score_threshold", number(s.score_threshold)),
        ("settings.max_sources", str(s.max_sources)),
        ("settings.excerpt_chars", str(s.excerpt_chars)),
        ("settings.enable_retrieval_gate", str(s.enable_retrieval_gate).lower()),
    ]


def link_mode_name(value: int) -> str:
    return enum_name(apb.CitationLinkMode, value, "CITATION_LINK_MODE_").lower()


def show(assistant: apb.Assistant, as_json: bool) -> None:
    if as_json:
        print_json(assistant)
    else:
        print_record(assistant_fields(assistant))


@app.command()
def create(
    display_name: Annotated[
        str, typer.Option("--display-name", help="The assistant's name.", show_default=False)
    ],
    system_prompt: SystemPromptOpt = None,
    model: ModelOpt = None,
    temperature: TemperatureOpt = None,
    max_output_tokens: MaxOutputTokensOpt = None,
    enable_rag: EnableRagOpt = None,
    enable_citations: EnableCitationsOpt = None,
    link_mode: LinkModeOpt = None,
    top_k: TopKOpt = None,
    score_threshold: ScoreThresholdOpt = None,
    max_sources: MaxSourcesOpt = None,
    excerpt_chars: ExcerptCharsOpt = None,
    enable_retrieval_gate: RetrievalGateOpt = None,
    request_id: Annotated[
        str, typer.Option(help="Makes a retried create return the first assistant.")
    ] = "",
    as_json: JsonOpt = False,
    target: TargetOpt = None,
    api_key: ApiKeyOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """Create an assistant; settings left out take the server's defaults. Prints it."""
    settings, _ = settings_from_flags(
        system_prompt=system_prompt,
        model=model,
        temperature=temperature,
        max_output_tokens=max_output_tokens,
        enable_rag=enable_rag,
        enable_citations=enable_citations,
        citation_link_mode=link_mode,
        top_k=top_k,
        score_threshold=score_threshold,
        max_sources=max_sources,
        excerpt_chars=excerpt_chars,
        enable_retrieval_gate=enable_retrieval_gate,
    )
    request = apb.CreateAssistantRequest(
        assistant=apb.Assistant(display_name=display_name, settings=settings),
        request_id=request_id,
    )
    with connect(target, api_key, state_dir) as client:
        created = client.assistants.CreateAssistant(request, metadata=client.metadata)
    show(created, as_json)


@app.command("list")
def list_(
    page_size: PageSizeOpt = None,
    page_token: PageTokenOpt = None,
    as_json: JsonOpt = False,
    target: TargetOpt = None,
    api_key: ApiKeyOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """List the assistants, oldest first: every page, or one with --page-size/--page-token."""
    request = apb.ListAssistantsRequest(page_size=page_size or 0, page_token=page_token or "")
    with connect(target, api_key, state_dir) as client:
        call = client.assistants.ListAssistants
        if page_size or page_token:
            result = call(request, metadata=client.metadata)
        else:
            result = apb.ListAssistantsResponse()
            for page in pages(call, request, client.metadata):
                result.assistants.extend(page.assistants)
    if as_json:
        print_json(result)
        return
    rows = [
        (
            a.id,
            a.display_name,
            a.settings.model,
            link_mode_name(a.settings.citation_link_mode),
            str(a.settings.top_k),
            timestamp(a.create_time),
        )
        for a in result.assistants
    ]
    print_table(("id", "display_name", "model", "link_mode", "top_k", "create_time"), rows)
    if result.next_page_token:
        typer.echo(f"next page: --page-token {result.next_page_token}", err=True)


@app.command()
def get(
    assistant_id: IdArg,
    as_json: JsonOpt = False,
    target: TargetOpt = None,
    api_key: ApiKeyOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """Show one assistant with all its settings."""
    with connect(target, api_key, state_dir) as client:
        assistant = client.assistants.GetAssistant(
            apb.GetAssistantRequest(id=assistant_id), metadata=client.metadata
        )
    show(assistant, as_json)


@app.command()
def update(
    assistant_id: IdArg,
    display_name: Annotated[
        str | None, typer.Option("--display-name", help="A new name.", show_default=False)
    ] = None,
    system_prompt: SystemPromptOpt = None,
    model: ModelOpt = None,
    temperature: TemperatureOpt = None,
    max_output_tokens: MaxOutputTokensOpt = None,
    enable_rag: EnableRagOpt = None,
    enable_citations: EnableCitationsOpt = None,
    link_mode: LinkModeOpt = None,
    top_k: TopKOpt = None,
    score_threshold: ScoreThresholdOpt = None,
    max_sources: MaxSourcesOpt = None,
    excerpt_chars: ExcerptCharsOpt = None,
    enable_retrieval_gate: RetrievalGateOpt = None,
    as_json: JsonOpt = False,
    target: TargetOpt = None,
    api_key: ApiKeyOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """Change the fields given as flags, and only those (the update_mask names exactly them).

    Prints the assistant as it is afterwards.
    """
    settings, paths = settings_from_flags(
        system_prompt=system_prompt,
        model=model,
        temperature=temperature,
        max_output_tokens=max_output_tokens,
        enable_rag=enable_rag,
        enable_citations=enable_citations,
        citation_link_mode=link_mode,
        top_k=top_k,
        score_threshold=score_threshold,
        max_sources=max_sources,
        excerpt_chars=excerpt_chars,
        enable_retrieval_gate=enable_retrieval_gate,
    )
    if display_name is not None:
        paths.insert(0, "display_name")
    if not paths:
        raise typer.BadParameter("nothing to change: pass --display-name or a settings flag")
    request = apb.UpdateAssistantRequest(
        assistant=apb.Assistant(id=assistant_id, display_name=display_name or "", settings=settings)
    )
    request.update_mask.paths.extend(paths)
    with connect(target, api_key, state_dir) as client:
        updated = client.assistants.UpdateAssistant(request, metadata=client.metadata)
    show(updated, as_json)


@app.command()
def delete(
    assistant_id: IdArg,
    as_json: JsonOpt = False,
    target: TargetOpt = None,
    api_key: ApiKeyOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """Delete an assistant together with its documents and conversations."""
    with connect(target, api_key, state_dir) as client:
        client.assistants.DeleteAssistant(
            apb.DeleteAssistantRequest(id=assistant_id), metadata=client.metadata
        )
    print_deleted("assistant", assistant_id, as_json)
