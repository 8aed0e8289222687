"""`footnote ask` in its three citation styles, and `footnote conversations` over the answers."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.cli.conftest import assert_clean_failure

pytestmark = pytest.mark.usefixtures("worker")

HANDBOOK = Path(__file__).parent.parent / "fixtures" / "documents" / "handbook.md"
QUESTION = "Which PostgreSQL version does the database need?"


@pytest.fixture
async def linked_assistant(cli) -> str:
    """An assistant whose sources carry links (so markdown citations have one), with the
    handbook ingested."""
    made = await cli(
        "assistants",
        "create",
        "--display-name",
        "Handbook",
        "--link-mode",
        "authenticated",
        "--json",
    )
    assistant_id = made.json()["id"]
    uploaded = await cli("upload", str(HANDBOOK), "--assistant", assistant_id, "--json")
    assert uploaded.json()["uploads"][0]["document"]["state"] == "DOCUMENT_STATE_READY"
    return assistant_id


def sources_section(stdout: str) -> list[str]:
    """The lines between "Sources:" and the evidence or the closing "conversation ID" line."""
    lines = stdout.splitlines()
    start = lines.index("Sources:")
    end = next(
        i for i, line in enumerate(lines) if line == "Evidence:" or line.startswith("conversation ")
    )
    return [line for line in lines[start + 1 : end] if line]


async def test_ask_streams_the_answer_then_its_sources(cli, linked_assistant):
    ran = await cli("ask", QUESTION, "--assistant", linked_assistant)
    assert ran.exit_code == 0, ran.stderr
    assert "PostgreSQL 16" in ran.stdout.split("Sources:")[0]
    sources = sources_section(ran.stdout)
    assert sources[0].startswith("[1] [handbook.md")
    # Below it: where the source sits, and its link.
    assert sources[1].strip().startswith("lines ")
    assert "/v1/documents/" in sources[2]
    conversation = ran.stdout.splitlines()[-1].removeprefix("conversation ")
    assert uuid.UUID(conversation)


async def test_ask_shows_each_citations_verdict_and_quote(cli, linked_assistant):
    ran = await cli("ask", QUESTION, "--assistant", linked_assistant)
    assert ran.exit_code == 0, ran.stderr
    evidence = ran.stdout.split("Evidence:", 1)[1].splitlines()
    verdict_line = next(line for line in evidence if line.strip().startswith("[1] cited,"))
    assert any(word in verdict_line for word in ("supported", "partial", "UNSUPPORTED"))
    assert "handbook.md" in verdict_line
    # The quote follows on the next line, in the source's own words.
    quote = evidence[evidence.index(verdict_line) + 1].strip()
    assert quote.startswith('"') and "PostgreSQL" in quote


async def test_the_three_styles_look_different(cli, linked_assistant):
    shown = {}
    for style in ("inline", "footnote", "markdown"):
        ran = await cli("ask", QUESTION, "--assistant", linked_assistant, "--style", style)
        assert ran.exit_code == 0, ran.stderr
        shown[style] = sources_section(ran.stdout)
    first = {style: lines[0] for style, lines in shown.items()}
    assert first["inline"].startswith("[1] [handbook.md, ")
    assert first["footnote"].startswith("[1] [^") and "]: handbook.md:" in first["footnote"]
    assert first["markdown"].startswith("[1] [handbook.md](http")
    assert "/v1/documents/" in first["markdown"] and "#L" in first["markdown"]
    assert len({tuple(lines) for lines in shown.values()}) == 3


async def test_ask_as_json_is_the_final_response(cli, linked_assistant):
    ran = await cli(
        "ask", QUESTION, "--assistant", linked_assistant, "--style", "footnote", "--json"
    )
    body = ran.json()  # nothing but the one document: no streamed text before it
    assert body["message"]["role"] == "ROLE_ASSISTANT"
    assert "PostgreSQL 16" in body["message"]["content"]
    cited_indices = body["citations"]["referenced_indices"]
    assert cited_indices
    cited = body["citations"]["sources"][cited_indices[0] - 1]
    assert cited["document_name"] == "handbook.md"
    assert cited["formatted"].startswith("[^")
    assert uuid.UUID(body["conversation_id"])


async def test_ask_continues_a_conversation(cli, linked_assistant):
    first = (await cli("ask", QUESTION, "--assistant", linked_assistant, "--json")).json()
    second = await cli(
        "ask",
        "And where are the settings read from?",
        "--assistant",
        linked_assistant,
        "--conversation",
        first["conversation_id"],
        "--json",
    )
    assert second.json()["conversation_id"] == first["conversation_id"]
    shown = (await cli("conversations", "show", first["conversation_id"], "--json")).json()
    assert shown["conversation"]["message_count"] == 4
    assert [m["role"] for m in shown["messages"]] == [
        "ROLE_USER",
        "ROLE_ASSISTANT",
        "ROLE_USER",
        "ROLE_ASSISTANT",
    ]


async def test_ask_an_unknown_assistant_exits_1(cli):
    ran = await cli("ask", QUESTION, "--assistant", str(uuid.uuid4()))
    assert_clean_failure(ran)
    assert ran.stderr.startswith("footnote: NOT_FOUND: ")


async def test_ask_with_an_unknown_style_is_a_usage_error(cli, assistant_id):
    assert_clean_failure(await cli("ask", "hi", "--assistant", assistant_id, "--style", "apa"), 2)


async def test_conversations_list(cli, linked_assistant, make_key):
    answered = (await cli("ask", QUESTION, "--assistant", linked_assistant, "--json")).json()
    conversation = answered["conversation_id"]

    body = (await cli("conversations", "list", "--assistant", linked_assistant, "--json")).json()
    assert [c["id"] for c in body["conversations"]] == [conversation]
    assert body["conversations"][0]["message_count"] == 2
    assert body["next_page_token"] == ""

    rows = (await cli("conversations", "list", "--assistant", linked_assistant)).tsv()
    assert rows[0] == ["id", "title", "messages", "assistant_id", "update_time"]
    assert rows[1][0] == conversation and rows[1][2] == "2" and rows[1][3] == linked_assistant

    everything = (await cli("conversations", "list", "--json")).json()
    assert conversation in [c["id"] for c in everything["conversations"]]
    other_tenant = make_key(f"t-{uuid.uuid4().hex[:12]}")
    theirs = (await cli("conversations", "list", "--json", key=other_tenant)).json()
    assert theirs == {"conversations": [], "next_page_token": ""}


async def test_conversations_show_prints_messages_and_cited_sources(cli, linked_assistant):
    answered = (await cli("ask", QUESTION, "--assistant", linked_assistant, "--json")).json()
    conversation = answered["conversation_id"]

    ran = await cli("conversations", "show", conversation)
    assert ran.exit_code == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0] == f"conversation {conversation}"
    assert f"assistant {linked_assistant}" in lines
    assert any(line.startswith("user · ") for line in lines)
    assert QUESTION in lines
    assert any(line.startswith("assistant · ") for line in lines)
    assert "Sources:" in lines
    source = lines[lines.index("Sources:") + 1]
    assert source.startswith("[1] handbook.md (") and "lines " in source
    link = lines[lines.index("Sources:") + 2]
    assert "/v1/documents/" in link

    body = (await cli("conversations", "show", conversation, "--json")).json()
    assert body["conversation"]["id"] == conversation
    assistant_message = body["messages"][1]
    assert assistant_message["content"] == answered["message"]["content"]
    assert (
        assistant_message["citations"]["referenced_indices"]
        == (answered["citations"]["referenced_indices"])
    )


async def test_show_an_unknown_conversation_exits_1(cli):
    ran = await cli("conversations", "show", str(uuid.uuid4()), "--json")
    assert_clean_failure(ran)
    assert ran.stderr.startswith("footnote: NOT_FOUND: ")
    assert ran.stdout == ""
