"""`footnote upload` and `footnote documents` against the real server and a real worker."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import uuid
from pathlib import Path

import httpx
import pytest

from services.storage import object_key
from tests.cli.conftest import assert_clean_failure, run_on_terminal

pytestmark = pytest.mark.usefixtures("worker")

HANDBOOK = Path(__file__).parent.parent / "fixtures" / "documents" / "handbook.md"


@pytest.fixture
async def uploaded(cli, assistant_id) -> dict:
    """handbook.md uploaded through `footnote upload --json` and ingested."""
    ran = await cli("upload", str(HANDBOOK), "--assistant", assistant_id, "--json")
    body = ran.json()
    assert [u["file"] for u in body["uploads"]] == [str(HANDBOOK)]
    doc = body["uploads"][0]["document"]
    assert doc["state"] == "DOCUMENT_STATE_READY", doc
    return doc


async def test_upload_prints_a_table_with_whole_ids(cli, assistant_id, tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("# Notes\n\nThe office opens at eight.\n")
    ran = await cli("upload", str(HANDBOOK), str(notes), "--assistant", assistant_id)
    rows = ran.tsv()
    assert rows[0] == ["file", "document", "state", "chunks", "pages", "error"]
    assert [row[0] for row in rows[1:]] == ["handbook.md", "notes.md"]
    assert all(row[2] == "READY" for row in rows[1:]), rows
    for row in rows[1:]:
        assert uuid.UUID(row[1]) and len(row[1]) == 36
    assert "uploading" in ran.stderr  # the progress bar


async def test_upload_as_json(uploaded, assistant_id):
    assert uploaded["assistant_id"] == assistant_id
    assert uploaded["display_name"] == "handbook.md"
    assert uploaded["sha256"] == hashlib.sha256(HANDBOOK.read_bytes()).hexdigest()
    assert uploaded["chunk_count"] > 0


async def test_a_rejected_upload_exits_1_with_its_error(cli, tmp_path):
    orphan = tmp_path / "orphan.md"
    orphan.write_bytes(b"# Orphan\n")
    ran = await cli("upload", str(orphan), "--assistant", str(uuid.uuid4()), "--json")
    assert_clean_failure(ran)
    (result,) = json.loads(ran.stdout)["uploads"]
    assert result["error"]["code"] == "NOT_FOUND"
    text = await cli("upload", str(orphan), "--assistant", str(uuid.uuid4()))
    assert_clean_failure(text)
    assert "REJECTED" in text.stdout and "NOT_FOUND" in text.stdout


async def test_list_documents_of_an_assistant(cli, uploaded, assistant_id):
    body = (await cli("documents", "list", "--assistant", assistant_id, "--json")).json()
    assert [d["id"] for d in body["documents"]] == [uploaded["id"]]
    assert body["next_page_token"] == ""

    rows = (await cli("documents", "list", "--assistant", assistant_id)).tsv()
    assert rows[0][:3] == ["id", "display_name", "state"]
    assert rows[1][:3] == [uploaded["id"], "handbook.md", "READY"]
    assert rows[1][6] == assistant_id

    ready = await cli("documents", "list", "--assistant", assistant_id, "--state", "ready")
    assert len(ready.tsv()) == 2
    failed = await cli(
        "documents", "list", "--assistant", assistant_id, "--state", "failed", "--json"
    )
    assert failed.json()["documents"] == []
    one = await cli("documents", "list", "--page-size", "1", "--json")
    assert len(one.json()["documents"]) == 1


async def test_get_document(cli, uploaded):
    body = (await cli("documents", "get", uploaded["id"], "--json")).json()
    assert body == uploaded | {"update_time": body["update_time"]}
    shown = (await cli("documents", "get", uploaded["id"])).record()
    assert shown["id"] == uploaded["id"]
    assert shown["state"] == "READY"
    assert shown["sha256"] == uploaded["sha256"]
    assert shown["size_bytes"] == str(HANDBOOK.stat().st_size)


async def test_download_to_a_file_and_to_stdout(cli, uploaded, tmp_path):
    out = tmp_path / "copy.md"
    ran = await cli("documents", "download", uploaded["id"], "-o", str(out))
    assert ran.exit_code == 0, ran.stderr
    assert out.read_bytes() == HANDBOOK.read_bytes()
    assert "verified" in ran.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["copy.md"]

    piped = await cli("documents", "download", uploaded["id"])
    assert piped.exit_code == 0, piped.stderr
    assert piped.stdout_bytes == HANDBOOK.read_bytes()

    again = tmp_path / "again.md"
    body = (await cli("documents", "download", uploaded["id"], "-o", str(again), "--json")).json()
    assert body["document"]["id"] == uploaded["id"]
    assert body["path"] == str(again)
    assert body["bytes_written"] == HANDBOOK.stat().st_size
    assert body["sha256"] == uploaded["sha256"]


async def test_download_as_json_needs_a_file(cli, uploaded):
    ran = await cli("documents", "download", uploaded["id"], "--json")
    assert_clean_failure(ran, 2)
    assert "-o FILE" in ran.stderr


async def test_download_refuses_bytes_that_do_not_match_the_sha256(
    cli, uploaded, storage, tmp_path
):
    # The stored object changes under the document: what arrives no longer matches its sha256.
    tampered = b"# Operator handbook\n\nSomething else entirely.\n"
    storage.put(
        object_key(uploaded["id"], uploaded["sha256"]),
        io.BytesIO(tampered),
        len(tampered),
        "text/markdown",
    )
    out = tmp_path / "copy.md"
    ran = await cli("documents", "download", uploaded["id"], "-o", str(out))
    assert_clean_failure(ran)
    assert "do not match" in ran.stderr and uploaded["sha256"] in ran.stderr
    assert list(tmp_path.iterdir()) == []  # neither the file nor a partial one


async def test_delete_document(cli, uploaded, assistant_id):
    ran = await cli("documents", "delete", uploaded["id"])
    assert ran.exit_code == 0 and ran.stdout == f"deleted document {uploaded['id']}\n"
    gone = await cli("documents", "get", uploaded["id"])
    assert_clean_failure(gone)
    assert gone.stderr.startswith("footnote: NOT_FOUND: ")
    listed = await cli("documents", "list", "--assistant", assistant_id, "--json")
    assert listed.json()["documents"] == []
    again = await cli("documents", "delete", uploaded["id"], "--json")
    assert_clean_failure(again)
    assert "NOT_FOUND" in again.stderr


async def test_delete_document_as_json(cli, uploaded):
    ran = await cli("documents", "delete", uploaded["id"], "--json")
    assert ran.json() == {"id": uploaded["id"], "deleted": True}


@pytest.mark.parametrize("command", ["get", "delete", "download"])
async def test_unknown_document_is_not_found(cli, command):
    ran = await cli("documents", command, str(uuid.uuid4()))
    assert_clean_failure(ran)
    assert ran.stderr.startswith("footnote: NOT_FOUND: ")


async def test_a_malformed_id_names_the_field(cli):
    ran = await cli("documents", "get", "not-an-id")
    assert_clean_failure(ran)
    assert ran.stderr == "footnote: INVALID_ARGUMENT: id is not a valid id (field id)\n"


async def test_download_shows_a_progress_bar_on_a_terminal(
    uploaded, grpc_target, api_key, tmp_path
):
    out = tmp_path / "copy.md"
    args = ["documents", "download", uploaded["id"], "-o", str(out)]
    screen = await asyncio.to_thread(
        run_on_terminal, [*args, "--target", grpc_target, "--api-key", api_key], 120
    )
    assert "downloading handbook.md" in screen
    assert out.read_bytes() == HANDBOOK.read_bytes()


async def test_watch_prints_states_until_final(cli, uploaded):
    ran = await cli("documents", "watch", uploaded["id"])
    assert ran.exit_code == 0, ran.stderr
    assert ran.stdout.splitlines()[-1].split("\t")[1] == "READY"
    body = (await cli("documents", "watch", uploaded["id"], "--json")).json()
    assert body["id"] == uploaded["id"] and body["state"] == "DOCUMENT_STATE_READY"


async def test_url_is_a_working_presigned_link(cli, uploaded):
    ran = await cli("documents", "url", uploaded["id"], "--ttl", "120")
    assert ran.exit_code == 0, ran.stderr
    link = ran.stdout.strip()
    assert "X-Amz-Signature=" in link and "expires " in ran.stderr
    fetched = await asyncio.to_thread(httpx.get, link, timeout=30)
    assert fetched.status_code == 200 and fetched.content == HANDBOOK.read_bytes()
    body = (await cli("documents", "url", uploaded["id"], "--json")).json()
    assert body["url"].startswith("http") and body["expire_time"].endswith("Z")


async def test_url_ttl_limits(cli, uploaded):
    assert_clean_failure(await cli("documents", "url", uploaded["id"], "--ttl", "0"), 2)
    too_long = await cli("documents", "url", uploaded["id"], "--ttl", str(8 * 86400))
    assert_clean_failure(too_long)
    assert too_long.stderr.startswith("footnote: INVALID_ARGUMENT: ")
    assert "(field ttl)" in too_long.stderr
