"""The harness speaks only the contract: no module of `chaos` imports the reference engine
except the reference engine's adapter package (`chaos/reference`: the adapter, its
observer, its in-process driver for `ninelives sim`, and its broken variants)."""
from __future__ import annotations

import ast
from pathlib import Path

CHAOS = Path(__file__).resolve().parents[2] / "chaos"
#: the reference engine's adapter: the module, or the package it became.
ALLOWED = ("reference/",)


def imports_engine(tree: ast.AST) -> list[int]:
    """Lines that import `engine` or a module of it (absolute imports only)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(n == "engine" or n.startswith("engine.") for n in names):
            lines.append(node.lineno)
    return lines


def test_only_the_reference_adapter_imports_engine():
    offenders = []
    for path in sorted(CHAOS.rglob("*.py")):
        rel = path.relative_to(CHAOS).as_posix()
        if rel.startswith(ALLOWED):
            continue
        lines = imports_engine(ast.parse(path.read_text(), str(path)))
        offenders += [f"chaos/{rel}:{line}" for line in lines]
    assert not offenders, ("modules of chaos other than the reference adapter import engine: "
                           + ", ".join(offenders))
