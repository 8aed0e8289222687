"""Domain code records metrics and spans through modules that import no domain code back."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "services" / "observability"
# Imported from chat, llm, documents and workers: they must not lead back into the domain.
LEAF_MODULES = ("metrics.py", "worker_metrics.py", "tracing.py", "logs.py", "task_events.py")
ALLOWED = ("services.observability", "services.config")


def service_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name == "services" or name.startswith("services.")}


@pytest.mark.parametrize("module", LEAF_MODULES)
def test_leaf_modules_import_only_observability_and_config(module):
    outside = {
        name
        for name in service_imports(PACKAGE / module)
        if not any(name == a or name.startswith(a + ".") for a in ALLOWED)
    }
    assert outside == set()
