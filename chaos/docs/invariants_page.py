"""The invariants' reference page, generated from the checkers themselves: what each claims
(its docstring), the evidence it reads (its module's READS), the capabilities it asks the
engine for and the ways it fails (read from its code: the `capable(...)` and `.fail(...)`
calls of the check and the module's functions it calls), and the dangerous situations that
exercise it (`chaos.situations`)."""
from __future__ import annotations

import ast
import functools
import importlib
import inspect
from typing import Any, Callable


def page() -> str:
    """docs/reference/invariants.md's text."""
    from chaos.checkers import CHECKERS, INVARIANTS, READS, load
    from chaos.situations import CATALOG, EXERCISES
    load()
    lines = ["# The invariants", "",
             "Generated from the checkers (`python -m chaos.docs --write`). Each is a pure "
             "function of the run's history and final snapshot. A verdict is `pass`, `fail` "
             "(with witnesses: the operations that break it), or `unknown` with the reason: "
             "the evidence it reads is absent, the engine does not declare a capability it "
             "needs, or nothing of its kind happened. A pass of an invariant that lists "
             "situations below, where the run reached none of them, is "
             "`pass, not exercised`. The fields are those of [the history](history.md).", "",
             "| invariant | fails as | exercised by |", "|---|---|---|"]
    facts = {name: _facts(CHECKERS[name]) for name in INVARIANTS}
    for name in INVARIANTS:
        kinds = ", ".join(f"`{k}`" for k in facts[name]["kinds"]) or "—"
        where = ", ".join(f"`{s}`" for s in EXERCISES.get(name, ())) or "every run"
        lines.append(f"| [{name}](#{name}) | {kinds} | {where} |")
    lines.append("")
    for name in INVARIANTS:
        fn, found = CHECKERS[name], facts[name]
        lines += [f"## {name}", "", _claim(fn), ""]
        reads = READS.get(name, ())
        if reads:
            lines += ["**Evidence it reads:** " + ", ".join(f"`{r}`" for r in reads) + ".", ""]
        if found["capabilities"]:
            lines.append("**Capabilities it asks of the engine** (without one, the parts that "
                         "need it are `unknown`): "
                         + ", ".join(f"`{c}`" for c in found["capabilities"]) + ".")
            lines.append("")
        if found["kinds"]:
            lines += ["**Fails as:** " + ", ".join(f"`{k}`" for k in found["kinds"]) + ".", ""]
        situations = EXERCISES.get(name, ())
        if situations:
            lines += ["**Exercised by:**", ""]
            lines += [f"- `{s}`: {CATALOG.get(s, '')}" for s in situations]
        else:
            lines.append("**Exercised by:** every run (it guarantees something of any run, "
                         "not of one dangerous situation).")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _claim(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return " ".join(doc.split("\n\n", 1)[0].split()) if doc else "(no description)"


def _facts(fn: Callable[..., Any]) -> dict[str, list[str]]:
    """The capabilities and failure kinds named in `fn` and in the checkers' functions it
    calls, directly or through others, in its module or another of chaos.checkers."""
    kinds: list[str] = []
    capabilities: list[str] = []
    seen: set[tuple[str, str]] = set()
    todo = [(fn.__module__, fn.__name__)]
    while todo:
        module_name, name = todo.pop()
        if (module_name, name) in seen:
            continue
        seen.add((module_name, name))
        module = importlib.import_module(module_name)
        body = _bodies(module_name).get(name)
        if body is None:
            continue
        for node in ast.walk(body):
            if not isinstance(node, ast.Call):
                continue
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else \
                node.func.id if isinstance(node.func, ast.Name) else None
            first = node.args[0] if node.args else None
            second = node.args[1] if len(node.args) > 1 else None
            if callee == "fail" and isinstance(first, ast.Constant) and isinstance(first.value, str):
                kinds.append(first.value)
            elif callee == "capable" and isinstance(second, ast.Constant):
                capabilities.append(second.value)
            elif callee in _bodies(module_name):
                todo.append((module_name, callee))  # a function, method or nested one here
            elif callee:
                target = getattr(module, callee, None)
                home = getattr(target, "__module__", "") or ""
                if callable(target) and home.startswith("chaos.checkers"):
                    todo.append((home, getattr(target, "__name__", callee)))
    return {"kinds": sorted(set(kinds)), "capabilities": sorted(set(capabilities))}


@functools.lru_cache(maxsize=None)
def _bodies(module_name: str) -> dict[str, ast.AST]:
    """The module's functions (methods and nested ones too) by name, parsed from its source."""
    module = importlib.import_module(module_name)
    tree = ast.parse(inspect.getsource(module))
    return {node.name: node for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
