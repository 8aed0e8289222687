"""`footnote assistants` against the real server: every subcommand, as text and as --json."""

from __future__ import annotations

import uuid

import pytest

from tests.cli.conftest import assert_clean_failure

ALL_SETTINGS = [
    "--system-prompt",
    "Answer briefly.",
    "--model",
    "small-model",
    "--temperature",
    "0.7",
    "--max-output-tokens",
    "300",
    "--no-enable-rag",
    "--no-enable-citations",
    "--link-mode",
    "authenticated",
    "--top-k",
    "17",
    "--score-threshold",
    "0.25",
    "--max-sources",
    "4",
    "--excerpt-chars",
    "120",
    "--no-enable-retrieval-gate",
]


async def test_create_takes_every_setting_as_a_flag(cli):
    made = await cli("assistants", "create", "--display-name", "Full", *ALL_SETTINGS, "--json")
    body = made.json()
    assert body["display_name"] == "Full"
    assert body["settings"] == {
        "system_prompt": "Answer briefly.",
        "model": "small-model",
        "temperature": pytest.approx(0.7),
        "max_output_tokens": 300,
        "enable_rag": False,
        "enable_citations": False,
        "citation_link_mode": "CITATION_LINK_MODE_AUTHENTICATED",
        "top_k": 17,
        "score_threshold": pytest.approx(0.25),
        "max_sources": 4,
        "excerpt_chars": 120,
        "enable_retrieval_gate": False,
    }
    # The text form shows the same assistant, field by field, with its whole id.
    shown = (await cli("assistants", "get", body["id"])).record()
    assert shown["id"] == body["id"]
    assert shown["display_name"] == "Full"
    assert shown["settings.citation_link_mode"] == "authenticated"
    assert shown["settings.top_k"] == "17"
    assert shown["settings.temperature"] == "0.7"
    assert shown["settings.enable_rag"] == "false"


async def test_create_without_flags_takes_the_defaults(cli):
    made = (await cli("assistants", "create", "--display-name", "Plain")).record()
    assert len(made["id"]) == 36 and uuid.UUID(made["id"])
    assert made["settings.top_k"] == "8"
    assert made["settings.max_sources"] == "10"
    assert made["settings.excerpt_chars"] == "200"
    assert made["settings.citation_link_mode"] == "none"
    assert made["settings.enable_rag"] == "true"


async def test_get_as_json_is_the_assistant(cli, assistant_id):
    body = (await cli("assistants", "get", assistant_id, "--json")).json()
    assert body["id"] == assistant_id
    assert body["display_name"] == "test"
    assert body["settings"]["top_k"] == 8
    assert body["create_time"].endswith("Z")


async def test_list_pages_through_everything_or_one_page(cli, make_key):
    key = make_key(f"t-{uuid.uuid4().hex[:12]}")
    ids = []
    for n in range(5):
        made = await cli("assistants", "create", "--display-name", f"a{n}", "--json", key=key)
        ids.append(made.json()["id"])

    everything = (await cli("assistants", "list", "--json", key=key)).json()
    assert [a["id"] for a in everything["assistants"]] == ids
    assert everything["next_page_token"] == ""

    first = (await cli("assistants", "list", "--page-size", "2", "--json", key=key)).json()
    assert [a["id"] for a in first["assistants"]] == ids[:2]
    assert first["next_page_token"]
    rest = await cli(
        "assistants",
        "list",
        "--page-size",
        "3",
        "--page-token",
        first["next_page_token"],
        "--json",
        key=key,
    )
    assert [a["id"] for a in rest.json()["assistants"]] == ids[2:]

    # Piped text: a header, then one row per assistant, the first column the whole id.
    rows = (await cli("assistants", "list", key=key)).tsv()
    assert rows[0][:2] == ["id", "display_name"]
    assert [row[0] for row in rows[1:]] == ids
    assert [row[1] for row in rows[1:]] == [f"a{n}" for n in range(5)]

    paged = await cli("assistants", "list", "--page-size", "2", key=key)
    assert [row[0] for row in paged.tsv()[1:]] == ids[:2]
    assert "--page-token" in paged.stderr


async def test_list_of_a_tenant_without_assistants_is_empty(cli, make_key):
    key = make_key(f"t-{uuid.uuid4().hex[:12]}")
    assert (await cli("assistants", "list", "--json", key=key)).json() == {
        "assistants": [],
        "next_page_token": "",
    }
    assert (await cli("assistants", "list", key=key)).tsv() == [
        ["id", "display_name", "model", "link_mode", "top_k", "create_time"]
    ]


async def test_update_changes_exactly_the_flags_given(cli):
    made = await cli(
        "assistants",
        "create",
        "--display-name",
        "Before",
        "--top-k",
        "17",
        "--temperature",
        "0.7",
        "--link-mode",
        "public",
        "--json",
    )
    assistant_id = made.json()["id"]

    after = await cli("assistants", "update", assistant_id, "--max-sources", "5", "--json")
    settings = after.json()["settings"]
    assert settings["max_sources"] == 5
    assert settings["top_k"] == 17
    assert settings["temperature"] == pytest.approx(0.7)
    assert settings["citation_link_mode"] == "CITATION_LINK_MODE_PUBLIC"
    assert after.json()["display_name"] == "Before"

    renamed = await cli(
        "assistants", "update", assistant_id, "--display-name", "After", "--no-enable-citations"
    )
    shown = renamed.record()
    assert shown["display_name"] == "After"
    assert shown["settings.enable_citations"] == "false"
    assert shown["settings.max_sources"] == "5"
    assert shown["settings.top_k"] == "17"

    # A flag given as empty resets that field to its default, and only that field.
    reset = await cli("assistants", "update", assistant_id, "--model", "", "--json")
    assert reset.json()["settings"]["model"] == ""
    assert reset.json()["settings"]["top_k"] == 17


async def test_update_without_a_flag_is_a_usage_error(cli, assistant_id):
    ran = await cli("assistants", "update", assistant_id)
    assert_clean_failure(ran, 2)
    assert "nothing to change" in ran.stderr


async def test_delete_then_get_is_not_found(cli):
    assistant_id = (await cli("assistants", "create", "--display-name", "Gone", "--json")).json()[
        "id"
    ]
    deleted = await cli("assistants", "delete", assistant_id, "--json")
    assert deleted.json() == {"id": assistant_id, "deleted": True}
    ran = await cli("assistants", "get", assistant_id)
    assert_clean_failure(ran)
    assert ran.stderr.startswith("footnote: NOT_FOUND: ")
    assert ran.stdout == ""

    again = await cli("assistants", "delete", assistant_id)
    assert_clean_failure(again)
    assert "NOT_FOUND" in again.stderr

    other = (await cli("assistants", "create", "--display-name", "Gone too", "--json")).json()
    text = await cli("assistants", "delete", other["id"])
    assert text.exit_code == 0 and text.stdout == f"deleted assistant {other['id']}\n"


async def test_bad_input_names_the_field_and_exits_1(cli):
    ran = await cli("assistants", "create", "--display-name", "x", "--top-k", "0")
    assert_clean_failure(ran)
    assert ran.stderr.startswith("footnote: INVALID_ARGUMENT: ")
    assert "(field assistant.settings.top_k)" in ran.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["assistants", "create", "--display-name", "x", "--top-k", "many"],
        ["assistants", "create", "--display-name", "x", "--link-mode", "everywhere"],
        ["assistants", "create"],
        ["assistants", "list", "--page-size", "0"],
        ["assistants", "get"],
        ["assistants", "frobnicate"],
    ],
)
async def test_bad_flags_exit_2(cli, args):
    assert_clean_failure(await cli(*args), 2)


async def test_a_wrong_key_is_unauthenticated(cli):
    ran = await cli("assistants", "list", key="fn_not-a-real-key")
    assert_clean_failure(ran)
    assert ran.stderr.startswith("footnote: UNAUTHENTICATED: ")
