"""`footnote ask`: stream an answer, then list its sources in the chosen style and its evidence."""

from __future__ import annotations

import sys
from enum import StrEnum
from typing import Annotated

import typer

from footnote.cli.connection import ApiKeyOpt, ClientStateDirOpt, JsonOpt, TargetOpt, connect, fail
from footnote.cli.evidence_view import evidence_lines
from footnote.cli.output import print_json
from footnote.client import stream_answer, styled_sources_lines
from footnote.v1 import chat_service_pb2 as cpb


class Style(StrEnum):
    inline = "inline"
    footnote = "footnote"
    markdown = "markdown"


STYLES = {
    Style.inline: cpb.CITATION_STYLE_INLINE,
    Style.footnote: cpb.CITATION_STYLE_FOOTNOTE,
    Style.markdown: cpb.CITATION_STYLE_MARKDOWN,
}


def ask(
    question: Annotated[str, typer.Argument(help="The question.", show_default=False)],
    assistant: Annotated[
        str, typer.Option("--assistant", help="The assistant's id.", show_default=False)
    ],
    conversation: Annotated[
        str, typer.Option("--conversation", help="Continue this conversation.")
    ] = "",
    style: Annotated[
        Style,
        typer.Option(
            help="How each cited source is written: inline ([name, §heading]), footnote "
            "([^label]: name:line) or markdown ([name](link#L42), needs a link mode).",
        ),
    ] = Style.inline,
    as_json: JsonOpt = False,
    target: TargetOpt = None,
    api_key: ApiKeyOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """Stream an answer as it comes, then list the sources it cited, with locations and links.

    With --json nothing streams: the final CompleteResponse is printed as one JSON document.
    """
    request = cpb.CompleteRequest(
        assistant_id=assistant,
        conversation_id=conversation,
        messages=[cpb.ChatMessage(role=cpb.ROLE_USER, content=question)],
        options=cpb.CompletionOptions(citation_style=STYLES[style]),
    )

    streamed = False

    def write(text: str) -> None:
        nonlocal streamed
        if not as_json:
            sys.stdout.write(text)
            sys.stdout.flush()
            streamed = True

    with connect(target, api_key, state_dir) as client:
        try:
            response = stream_answer(client.chat, client.conn, request, write)
        except BaseException as err:
            if streamed:
                print()  # end the cut-off answer's line before the error is reported
            if isinstance(err, RuntimeError):
                fail("the answer stream ended without its complete message")
            raise
    if as_json:
        print_json(response)
        return
    print()
    lines = styled_sources_lines(response.citations) if response.HasField("citations") else []
    if lines:
        print("\nSources:")
        for line in lines:
            print(line)
    evidence = evidence_lines(response)
    if evidence:
        print()
        for line in evidence:
            print(line)
    print(f"\nconversation {response.conversation_id}")
