"""The project's import graph, read with `ast` (nothing is imported).

- No cycle among module-level imports: those run at import time, so a cycle makes the
  result depend on which module is imported first (a partly initialised module, or
  imports moved to the end of a file to dodge that). Imports inside functions run later
  and are no edge; `if TYPE_CHECKING:` blocks never run and are no edge either.
- No module imports a private (`_name`) name from another project module, wherever the
  import sits: what another module uses is public and named so.

Every .py file under the packages below is read, in subpackages too, so the test keeps
working when a package is split into folders."""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("grpo_core", "tasks", "flows")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    """{dotted name: file} of every module and package of PACKAGES."""
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[_module_name(path)] = path
    return found


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _base(module: str, node: ast.ImportFrom) -> str | None:
    """The absolute module an ImportFrom reads from (relative imports resolved)."""
    if not node.level:
        return node.module
    package = module if _is_package(module) else module.rpartition(".")[0]
    parts = package.split(".")
    if node.level - 1 >= len(parts):
        return None
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_time_nodes(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module is imported: module level, inside
    if/try/with/for/while and class bodies, not inside functions or TYPE_CHECKING blocks."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _import_time_nodes(node.orelse)
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(node, field, None) or []:
                    yield from _import_time_nodes(
                        child.body if isinstance(child, (ast.ExceptHandler, ast.match_case))
                        else [child])


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, str | None]]:
    """(project module imported, name taken from it or None) for each name of `node`."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name in MODULES:
                yield alias.name, None
        return
    base = _base(module, node)
    if base not in MODULES:
        return
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in MODULES:  # `from pkg import submodule`
            yield sub, None
        else:
            yield base, alias.name


def _trees() -> dict[str, ast.Module]:
    return {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


TREES = _trees()


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, tree in TREES.items():
        for node in _import_time_nodes(tree.body):
            for target, _ in _targets(name, node):
                if target != name:
                    graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path a -> ... -> a) per strongly connected component of more than
    one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        comp.append(member)
                        if member == node:
                            break
                    if len(comp) > 1:
                        components.append(sorted(comp))
    return [_path_in(graph, comp) for comp in components]


def _path_in(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """A shortest cycle through the first module of a strongly connected component."""
    members, start = set(comp), comp[0]
    parent: dict[str, str] = {}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph[node] & members):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if child not in parent:
                parent[child] = node
                queue.append(child)
    return [*comp, start]


def _private_imports() -> list[tuple[str, int, str, str]]:
    """(importing module, line, source module, name) of every private name imported from
    another project module, at module level or inside functions."""
    found = []
    for name, tree in TREES.items():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target, imported in _targets(name, node):
                leaf = imported if imported is not None else target.rpartition(".")[2]
                if target != name and leaf.startswith("_") and not leaf.startswith("__"):
                    found.append((name, node.lineno, target, leaf))
    return found


def _in_package(module: str, pkg: str) -> bool:
    return module == pkg or module.startswith(pkg + ".")


def test_modules_found():
    assert {"tasks.tracking", "flows.pipeline", "grpo_core.store"} <= set(MODULES)


def test_graph_sees_submodule_and_relative_imports():
    mod = "tasks.tracking"
    tree = ast.parse("from tasks import stages\nfrom . import cache\nfrom .cache import x\n"
                     "import flows.pipeline\nif TYPE_CHECKING:\n    import tasks.launch\n"
                     "def f():\n    import tasks.plots\n")
    targets = {t for node in _import_time_nodes(tree.body) for t, _ in _targets(mod, node)}
    assert targets == {"tasks.stages", "tasks.cache", "flows.pipeline"}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_import_cycle(pkg):
    cycles = [c for c in _cycles(_graph()) if any(_in_package(m, pkg) for m in c)]
    assert not cycles, "module-level import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_private_name_imported_from_another_module(pkg):
    bad = [f"{MODULES[m].relative_to(ROOT)}:{line}: from {src} import {leaf}"
           for m, line, src, leaf in _private_imports() if _in_package(m, pkg)]
    assert not bad, "private names imported from another module:\n" + "\n".join(bad)


def test_ruff_is_clean_with_the_projects_rules():
    """The rule set is pyproject's [tool.ruff.lint]; ruff comes with the dev extra."""
    import shutil
    import subprocess
    import sys

    ruff = [sys.executable, "-m", "ruff"] if shutil.which("ruff") is None else ["ruff"]
    res = subprocess.run([*ruff, "check", "."], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
