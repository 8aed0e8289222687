"""`footnote conversations`: list stored conversations and show one with its citations."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

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
    message_to_dict,
    print_json,
    print_table,
    text_console,
    timestamp,
)
from footnote.client import pages, source_lines
from footnote.v1 import chat_service_pb2 as cpb
from footnote.v1 import conversations_service_pb2 as cvpb

app = typer.Typer(
    help="List conversations and show one, message by message, with its citations.",
    no_args_is_help=True,
)


@app.command("list")
def list_(
    assistant: Annotated[
        str | None,
        typer.Option(
            "--assistant", help="Only conversations with this assistant.", show_default=False
        ),
    ] = None,
    page_size: PageSizeOpt = None,
    page_token: PageTokenOpt = None,
    as_json: JsonOpt = False,
    target: TargetOpt = None,
    api_key: ApiKeyOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """List conversations, newest first: every page, or one with --page-size/--page-token."""
    request = cvpb.ListConversationsRequest(
        assistant_id=assistant or "", page_size=page_size or 0, page_token=page_token or ""
    )
    with connect(target, api_key, state_dir) as client:
        call = client.conversations.ListConversations
        if page_size or page_token:
            result = call(request, metadata=client.metadata)
        else:
            result = cvpb.ListConversationsResponse()
            for page in pages(call, request, client.metadata):
                result.conversations.extend(page.conversations)
    if as_json:
        print_json(result)
        return
    rows = [
        (
            c.id,
            c.title,
            str(c.message_count),
            c.assistant_id,
            timestamp(c.update_time),
        )
        for c in result.conversations
    ]
    print_table(
        ("id", "title", "messages", "assistant_id", "update_time"),
        rows,
        whole=("id", "assistant_id"),
    )
    if result.next_page_token:
        typer.echo(f"next page: --page-token {result.next_page_token}", err=True)


@app.command()
def show(
    conversation_id: Annotated[
        str, typer.Argument(metavar="ID", help="The conversation's id.", show_default=False)
    ],
    as_json: JsonOpt = False,
    target: TargetOpt = None,
    api_key: ApiKeyOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """Print every message; after each answer, the sources it cited with locations and links.

    Links are signed afresh; a source whose document changed since is marked.
    """
    with connect(target, api_key, state_dir) as client:
        conversation = client.conversations.GetConversation(
            cvpb.GetConversationRequest(id=conversation_id), metadata=client.metadata
        )
        messages: list[cvpb.Message] = []
        request = cvpb.ListMessagesRequest(conversation_id=conversation_id, page_size=100)
        for page in pages(client.conversations.ListMessages, request, client.metadata):
            messages.extend(page.messages)
    if as_json:
        print_json(
            {
                "conversation": message_to_dict(conversation),
                "messages": [message_to_dict(m) for m in messages],
            }
        )
        return
    console = text_console()
    console.print(Text(f"conversation {conversation.id}", style="bold"))
    console.print(f"assistant {conversation.assistant_id}")
    if conversation.title:
        console.print(f"title {conversation.title}")
    for message in messages:
        role = enum_name(cpb.Role, message.role, "ROLE_").lower()
        console.print()
        console.print(Text(f"{role} · {timestamp(message.create_time)}", style="bold cyan"))
        console.print(message.content)
        lines = source_lines(message.citations) if message.HasField("citations") else []
        if lines:
            console.print(Text("Sources:", style="bold"))
            for line in lines:
                console.print(line)
