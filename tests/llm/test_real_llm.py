"""The local tier: model assembly, then a real llama-server answering through OpenAIGenerator."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from devstack import local_llm as local
from devstack.local_llm import LocalLLM, LocalLLMError, ModelPart, assemble_model
from services.chat.pipeline import CITE_REMINDER, DEFAULT_SYSTEM_PROMPT
from services.citations import RetrievedChunk, ScoreKind, build_context, build_manifest
from services.citations.extract import extract
from services.llm.base import Finished, FinishReason, GenerationRequest, PromptMessage, TextPiece
from services.llm.openai_compat import OpenAIGenerator
from tests.llm.conftest import busy_slots

# --- assembly, on small fake parts (no packages needed) -----------------------------------


def fake_parts(tmp_path: Path, blobs: list[bytes]) -> list[ModelPart]:
    parts = []
    for i, blob in enumerate(blobs, start=1):
        path = tmp_path / "site" / f"part{i:02d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
        digest = hashlib.sha256(blob).hexdigest()
        parts.append(ModelPart(f"fake-part{i}", "1.0", path, len(blob), digest))
    return parts


BLOBS = [b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 5]
WHOLE = b"".join(BLOBS)


def test_assembly_concatenates_in_order_and_reuses_the_result(tmp_path: Path) -> None:
    parts = fake_parts(tmp_path, BLOBS)
    dest = tmp_path / "models" / "m.gguf"
    sha = hashlib.sha256(WHOLE).hexdigest()

    assert assemble_model(dest, parts, expected_sha256=sha) == dest
    assert dest.read_bytes() == WHOLE
    first = dest.stat()

    assemble_model(dest, parts, expected_sha256=sha)
    again = dest.stat()
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
    assert sorted(p.name for p in dest.parent.iterdir() if not p.name.endswith(".lock")) == [
        "m.gguf",
        "m.gguf.json",
    ]


def test_a_damaged_result_or_changed_parts_are_assembled_again(tmp_path: Path) -> None:
    parts = fake_parts(tmp_path, BLOBS)
    dest = tmp_path / "models" / "m.gguf"
    assemble_model(dest, parts, expected_sha256=None)

    with dest.open("r+b") as f:
        f.truncate(10)
    assemble_model(dest, parts, expected_sha256=None)
    assert dest.read_bytes() == WHOLE

    newer = fake_parts(tmp_path / "v2", [b"GGUF", b"new"])
    assemble_model(dest, newer, expected_sha256=None)
    assert dest.read_bytes() == b"GGUFnew"


def test_a_part_that_differs_from_its_record_is_refused_and_nothing_is_left(
    tmp_path: Path,
) -> None:
    parts = fake_parts(tmp_path, BLOBS)
    parts[1].path.write_bytes(b"B" * 777)  # same size, other bytes than pip recorded
    dest = tmp_path / "models" / "m.gguf"

    with pytest.raises(LocalLLMError, match="damaged"):
        assemble_model(dest, parts, expected_sha256=None)
    assert [p.name for p in dest.parent.iterdir() if not p.name.endswith(".lock")] == []


def test_parts_that_make_another_file_than_pinned_are_refused(tmp_path: Path) -> None:
    parts = fake_parts(tmp_path, BLOBS)
    dest = tmp_path / "models" / "m.gguf"

    with pytest.raises(LocalLLMError, match="sha256"):
        assemble_model(dest, parts, expected_sha256="0" * 64)
    assert not dest.exists()


def test_missing_packages_name_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> None:
        raise local.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(local.metadata, "distribution", not_installed)
    with pytest.raises(LocalLLMError, match=r"pip install 'footnote\[llm\]'"):
        local.model_parts()


def test_the_server_command_is_loopback_with_the_chat_template(tmp_path: Path) -> None:
    args = local.llama_server_args(Path("/bin/llama-server"), tmp_path / "m.gguf", 23456)

    def flag(name: str) -> str:
        return args[args.index(name) + 1]

    assert (flag("--host"), flag("--port"), flag("--model")) == (
        "127.0.0.1",
        "23456",
        str(tmp_path / "m.gguf"),
    )
    assert flag("--alias") == local.MODEL_NAME
    assert "--jinja" in args and "--offline" in args


def test_the_server_environment_drops_llama_flags() -> None:
    env = local.server_env({"PATH": "/bin", "LLAMA_ARG_HF_REPO": "someone/model"})
    assert env == {"PATH": "/bin"}


# --- the real llama-server ---------------------------------------------------------------


@pytest.fixture
async def real_generator(llama_server: LocalLLM) -> AsyncIterator[OpenAIGenerator]:
    gen = OpenAIGenerator(llama_server.base_url, llama_server.model_name, timeout_seconds=120)
    yield gen
    await gen.aclose()


@pytest.mark.llm
def test_the_assembled_model_is_the_pinned_one_and_is_reused(
    llama_server: LocalLLM, model_home: Path
) -> None:
    path = llama_server.model_path
    assert path.stat().st_size == local.MODEL_SIZE
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"
    before = path.stat()
    again = local.prepare_local_llm(model_home)
    after = again.model_path.stat()
    assert again.model_path == path
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.llm
async def test_an_answer_streams_in_pieces_and_reports_usage(
    real_generator: OpenAIGenerator,
) -> None:
    request = GenerationRequest(
        messages=[PromptMessage("user", "Name three colours of the rainbow, one per line.")],
        temperature=0.0,
        max_output_tokens=48,
    )
    events = [event async for event in real_generator.generate(request)]

    pieces = [e.text for e in events if isinstance(e, TextPiece)]
    assert len(pieces) >= 3
    assert "".join(pieces).strip()
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert sum(isinstance(e, Finished) for e in events) == 1
    assert finished.reason in (FinishReason.STOP, FinishReason.LENGTH)
    assert finished.prompt_tokens > 0
    assert 0 < finished.completion_tokens <= 48


@pytest.mark.llm
async def test_answers_in_a_row_on_one_generator_all_succeed(
    real_generator: OpenAIGenerator,
) -> None:
    # llama-server closes each connection after a stream, racing the client's reuse of it.
    request = GenerationRequest(
        messages=[PromptMessage("user", "Say hello.")], temperature=0.0, max_output_tokens=2
    )
    # Without a retry on such a connection about one answer in three fails here.
    for _ in range(12):
        events = [event async for event in real_generator.generate(request)]
        assert isinstance(events[-1], Finished)


@pytest.mark.llm
async def test_cancelling_mid_answer_frees_the_server_slot(
    llama_server: LocalLLM, real_generator: OpenAIGenerator
) -> None:
    request = GenerationRequest(
        messages=[PromptMessage("user", "Count from 1 to 1000, one number per line.")],
        temperature=0.0,
        max_output_tokens=1500,
    )
    stream = real_generator.generate(request)
    pieces = 0
    async for event in stream:
        assert isinstance(event, TextPiece)
        pieces += 1
        if pieces == 3:
            break
    assert await busy_slots(llama_server.base_url) == 1  # still generating: the check can fail
    await stream.aclose()

    # llama-server notices the closed connection when it writes the next token, which on a
    # busy 2-core machine can take over a second.
    loop = asyncio.get_running_loop()
    until = loop.time() + 5.0
    while await busy_slots(llama_server.base_url) and loop.time() < until:
        await asyncio.sleep(0.05)
    assert await busy_slots(llama_server.base_url) == 0, "llama-server kept generating"


def hit(name: str, text: str, score: float) -> RetrievedChunk:
    return RetrievedChunk(
        f"c-{name}", f"d-{name}", name, "text/markdown", 0, text, score, ScoreKind.FUSED
    )


def prompt(question: str, *hits: RetrievedChunk) -> list[PromptMessage]:
    """The prompt as the chat pipeline builds it: context in the system message, reminder last."""
    context = build_context(build_manifest(hits))
    return [
        PromptMessage("system", f"{DEFAULT_SYSTEM_PROMPT}\n\n{context}"),
        PromptMessage("user", f"{question}\n\n{CITE_REMINDER}"),
    ]


@pytest.mark.llm
async def test_an_answer_about_two_sources_cites_both(real_generator: OpenAIGenerator) -> None:
    request = GenerationRequest(
        messages=prompt(
            "What are the capitals of France and Japan?",
            hit("paris.md", "Paris is the capital of France.", 0.9),
            hit("tokyo.md", "Tokyo is the capital of Japan.", 0.8),
        ),
        temperature=0.0,
        max_output_tokens=96,
    )
    events = [event async for event in real_generator.generate(request)]
    answer = "".join(e.text for e in events if isinstance(e, TextPiece))

    extraction = extract(answer, n_sources=2)
    assert extraction.referenced_indices == (1, 2), answer
    assert extraction.invalid_indices == (), answer
    assert "<source" not in answer and "Source:" not in answer, answer
    assert "Paris" in answer and "Tokyo" in answer
