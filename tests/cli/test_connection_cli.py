"""How the CLI finds the server, what it says when it cannot, and how it prints on a terminal."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from footnote.client import NO_SERVER
from tests.cli.conftest import assert_clean_failure, clean_env, run_on_terminal, run_process


def write_client_file(state: Path, target: str, key: str) -> None:
    state.mkdir(parents=True, exist_ok=True)
    (state / "client.json").write_text(json.dumps({"target": target, "api_key": key}))


async def test_a_dev_stack_in_dot_state_is_found_by_default(
    tmp_path, grpc_target, api_key, assistant_id
):
    # What `footnote dev` leaves in ./state while it runs, pointing at the test server.
    write_client_file(tmp_path / "state", grpc_target, api_key)
    ran = await run_process(["assistants", "list", "--json"], tmp_path, clean_env())
    assert ran.exit_code == 0, ran.stderr
    assert [a["id"] for a in json.loads(ran.stdout)["assistants"]] == [assistant_id]


async def test_no_server_anywhere_is_a_clear_error(tmp_path):
    ran = await run_process(["assistants", "list"], tmp_path, clean_env())
    assert_clean_failure(ran)
    assert ran.stderr == f"footnote: {NO_SERVER}\n"
    assert "footnote dev" in NO_SERVER and "--target and --api-key" in NO_SERVER


async def test_state_dir_names_a_running_dev_stack(cli, tmp_path, grpc_target, api_key):
    write_client_file(tmp_path / "elsewhere", grpc_target, api_key)
    ran = await cli("assistants", "list", "--state-dir", str(tmp_path / "elsewhere"), key=None)
    assert ran.tsv()[0][0] == "id"
    missing = await cli("assistants", "list", "--state-dir", str(tmp_path / "nothing"), key=None)
    assert_clean_failure(missing)
    assert missing.stderr.startswith(f"footnote: no running footnote dev in {tmp_path}/nothing")


async def test_the_environment_names_the_server(cli, grpc_target, api_key, assistant_id):
    env = {"FOOTNOTE_TARGET": grpc_target, "FOOTNOTE_API_KEY": api_key}
    ran = await cli("assistants", "get", assistant_id, "--json", key=None, env=env)
    assert ran.json()["id"] == assistant_id


async def test_a_target_without_a_key_is_refused(cli, grpc_target):
    ran = await cli("assistants", "list", "--target", grpc_target, key=None)
    assert_clean_failure(ran)
    assert "--api-key" in ran.stderr and "FOOTNOTE_API_KEY" in ran.stderr


async def test_an_unreachable_server_is_unavailable(cli, api_key):
    ran = await cli("assistants", "list", "--target", "127.0.0.1:1", "--api-key", api_key, key=None)
    assert_clean_failure(ran)
    assert ran.stderr.startswith("footnote: UNAVAILABLE: ")


async def test_a_terminal_gets_a_table_with_whole_ids(grpc_target, api_key, assistant_id):
    args = ["assistants", "list", "--target", grpc_target, "--api-key", api_key]
    wide = await asyncio.to_thread(run_on_terminal, args, 200)
    assert "┃ id " in wide  # a rich table, not tab-separated lines
    row = next(line for line in wide.splitlines() if assistant_id in line)
    assert row.startswith(f"│ {assistant_id} │ test ")
    # Too narrow for the table: one "field value" block per row, the id still whole.
    narrow = await asyncio.to_thread(run_on_terminal, args, 60)
    lines = [line.rstrip() for line in narrow.splitlines()]
    assert re.fullmatch(rf"id +{assistant_id}", lines[0]), lines
    assert re.fullmatch(r"display_name +test", lines[1]), lines
    assert "\t" not in wide + narrow
