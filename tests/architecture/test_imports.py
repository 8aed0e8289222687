"""The import rules of docs/architecture.md, checked with ast over the source tree."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, absolute, at any depth (including function-level imports)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def within(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def shown(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name


def violations(files: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{shown(f)} imports {name}"
        for f in files
        for name in sorted(imports_of(f))
        if within(name, *forbidden)
    ]


def test_the_source_tree_is_where_the_rules_expect_it() -> None:
    assert modules("services") and modules("workers") and modules("devstack")
    assert (ROOT / "footnote" / "cli").is_dir()


def test_services_import_no_workers_devstack_or_cli() -> None:
    assert (
        violations(modules("services"), ("workers", "devstack", "footnote.cli", "footnote.client"))
        == []
    )


def test_workers_import_no_devstack_or_cli() -> None:
    assert violations(modules("workers"), ("devstack", "footnote.cli", "footnote.client")) == []


def test_citations_import_nothing_outside_themselves() -> None:
    files = modules("services/citations")
    outside = [
        f"{shown(f)} imports {name}"
        for f in files
        for name in sorted(imports_of(f))
        if within(name, "services", "footnote", "workers", "devstack")
        and not within(name, "services.citations")
    ]
    assert outside == []
    # Third-party code has no place in the engine either: the standard library only.
    third_party = (
        {
            name.split(".")[0]
            for f in files
            for name in imports_of(f)
            if not within(name, "services")
        }
        - set(sys.stdlib_module_names)
        - {"__future__"}
    )
    assert third_party == set()


def test_conversations_do_not_import_chat() -> None:
    assert violations(modules("services/conversations"), ("services.chat",)) == []


def test_api_commands_talk_to_the_server_only_through_grpc() -> None:
    # main.py also runs the server and the workers in-process (dev, serve, worker, migrate,
    # keys), and verdicts.py runs the evidence scorer itself on a labelled file (eval-claims,
    # no server involved); every other command module, and the client helpers, only call the API.
    local = {"main.py", "verdicts.py"}
    files = [ROOT / "footnote" / "client.py"] + [
        f for f in sorted((ROOT / "footnote" / "cli").glob("*.py")) if f.name not in local
    ]
    assert violations(files, ("services", "workers", "devstack")) == []


@pytest.mark.parametrize(
    "servicer", sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("services/*/servicer.py"))
)
def test_servicers_only_convert(servicer: str) -> None:
    forbidden = ("sqlalchemy", "services.storage", "services.db", "celery", "kombu", "minio")
    assert violations([ROOT / servicer], forbidden) == []


def test_the_rules_catch_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from workers.app import app\n    import sqlalchemy.orm\n")
    assert violations([bad], ("workers",)) == [
        "bad.py imports workers.app",
        "bad.py imports workers.app.app",
    ]
    assert violations([bad], ("sqlalchemy",)) == ["bad.py imports sqlalchemy.orm"]
