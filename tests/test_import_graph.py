"""The project's import graph, read with `ast` (nothing is imported).

- No cycle among module-level imports: those run at import time, so a cycle makes the
  result depend on which module is imported first (a partly initialised module, or
  imports moved to the end of a file to dodge that). Imports inside functions run later
  and are no edge; `if TYPE_CHECKING:` blocks never run and are no edge either.
- No cycle among the modules of one folder (a package's __init__ and its modules), late
  imports included: an import moved into a function dodges the import-time cycle, not the
  tangle (the two modules still need each other; the piece both use belongs in one of
  them, or in a small module of its own).
- No module imports a private (`_name`) name from another project module, wherever the
  import sits: what another module uses is public and named so.
- grpo_core's subpackages are layered (grpo_core.LAYERS, read from grpo_core/__init__.py
  with `ast`): no import, wherever it sits, goes from a layer to a later one; the top
  modules import no subpackage (bar config's declared late imports).
- grpo_core imports neither prefect, mlflow nor matplotlib, wherever the import sits.

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


def _imports_that_run(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, at import time or later (inside functions):
    all of them but those of `if TYPE_CHECKING:` blocks."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _imports_that_run(node.orelse)
            continue
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                yield from _imports_that_run([child])
            elif isinstance(child, (ast.ExceptHandler, ast.match_case)):
                yield from _imports_that_run(child.body)


def _folder(module: str) -> str:
    """The folder a module sits in, as a package name (a package's __init__: its own)."""
    return module if _is_package(module) else module.rpartition(".")[0]


def _folder_graph(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Imports between modules of one folder, wherever the import sits."""
    graph: dict[str, set[str]] = {name: set() for name in trees}
    for name, tree in trees.items():
        for node in _imports_that_run(tree.body):
            for target, _ in _targets(name, node):
                if target != name and _folder(target) == _folder(name):
                    graph[name].add(target)
    return graph


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
    assert {"tasks.tracking", "tasks.tracking.parent_run", "flows.pipeline",
            "grpo_core.data.store"} <= set(MODULES)


def test_graph_sees_submodule_and_relative_imports():
    mod = "tasks.launch"
    tree = ast.parse("from tasks import stages\nfrom . import cache\nfrom .cache import x\n"
                     "import flows.pipeline\nif TYPE_CHECKING:\n    import tasks.launch\n"
                     "def f():\n    import tasks.plots\n")
    targets = {t for node in _import_time_nodes(tree.body) for t, _ in _targets(mod, node)}
    assert targets == {"tasks.stages", "tasks.cache", "flows.pipeline"}
    sub = ast.parse("from . import artifacts\nfrom .. import cache\nfrom tasks.tracking import headline\n")
    assert {t for node in _import_time_nodes(sub.body) for t, _ in _targets("tasks.tracking.registry", node)} \
        == {"tasks.tracking.artifacts", "tasks.cache", "tasks.tracking.headline"}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_folder_graph_sees_late_imports_and_skips_type_checking():
    """The shape the circles adapters <-> hub and fetch <-> loading had: one side's import
    at module level, the other's inside a function."""
    trees = {"grpo_core.data.hub": ast.parse("from grpo_core.data.adapters import Adapter\n"),
             "grpo_core.data.adapters": ast.parse(
                 "def resolve():\n    try:\n        from grpo_core.data.hub import hub_adapter\n"
                 "    except ImportError:\n        pass\n"
                 "if TYPE_CHECKING:\n    from grpo_core.data import store\n"
                 "import grpo_core.modeling.loading\n"),  # another folder: no edge here
             "grpo_core.data.store": ast.parse("")}
    graph = _folder_graph(trees)
    assert graph == {"grpo_core.data.hub": {"grpo_core.data.adapters"},
                     "grpo_core.data.adapters": {"grpo_core.data.hub"}, "grpo_core.data.store": set()}
    assert _cycles(graph) == [["grpo_core.data.adapters", "grpo_core.data.hub",
                               "grpo_core.data.adapters"]]
    assert _folder("flows") == "flows" and _folder("flows.shards") == "flows"
    assert _folder("grpo_core.data") == "grpo_core.data" != _folder("grpo_core.config.sections")


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_import_cycle(pkg):
    cycles = [c for c in _cycles(_graph()) if any(_in_package(m, pkg) for m in c)]
    assert not cycles, "module-level import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_import_cycle_within_a_folder_late_imports_included(pkg):
    cycles = [c for c in _cycles(_folder_graph(TREES)) if _in_package(c[0], pkg)]
    assert not cycles, ("modules of one folder that import each other (an import inside a "
                        "function counts):\n" + "\n".join(" -> ".join(c) for c in cycles))


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_private_name_imported_from_another_module(pkg):
    bad = [f"{MODULES[m].relative_to(ROOT)}:{line}: from {src} import {leaf}"
           for m, line, src, leaf in _private_imports() if _in_package(m, pkg)]
    assert not bad, "private names imported from another module:\n" + "\n".join(bad)


def _core_constant(name: str):
    """A literal assigned at the top of grpo_core/__init__.py (read, not imported)."""
    for node in ast.parse((ROOT / "grpo_core" / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"grpo_core/__init__.py assigns no {name}")


LAYERS = _core_constant("LAYERS")
TOP_MODULES = _core_constant("TOP_MODULES")
CONFIG_LATE_IMPORTS = _core_constant("CONFIG_LATE_IMPORTS")
TOP = -1  # the layer of grpo_core's top modules: below every subpackage


def _layer(module: str) -> int | None:
    """Index in LAYERS of a grpo_core module's subpackage; TOP for a top module; None
    for the package itself and modules outside grpo_core."""
    parts = module.split(".")
    if parts[0] != "grpo_core" or len(parts) == 1:
        return None
    return LAYERS.index(parts[1]) if parts[1] in LAYERS else TOP


def _all_imports() -> Iterator[tuple[str, int, str, bool]]:
    """(importing module, line, project module imported, at import time?) for every
    import of every module, module level, inside functions and TYPE_CHECKING blocks."""
    for name, tree in TREES.items():
        at_import = {id(n) for n in _import_time_nodes(tree.body)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target, _ in _targets(name, node):
                    if target != name:
                        yield name, node.lineno, target, id(node) in at_import


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


def test_every_grpo_core_module_has_a_layer():
    subpackages = {p.name for p in (ROOT / "grpo_core").iterdir()
                   if (p / "__init__.py").is_file()}
    assert subpackages - set(TOP_MODULES) == set(LAYERS), "grpo_core subpackages vs grpo_core.LAYERS"
    tops = {m.split(".")[1] for m in MODULES if _layer(m) == TOP}
    assert tops == set(TOP_MODULES)


def test_layers_sees_upward_imports():
    assert _layer("grpo_core.config") == TOP and _layer("grpo_core") is None
    assert _layer("grpo_core.config.sections") == TOP
    assert _layer("grpo_core.verify.answers") < _layer("grpo_core.train.grpo")


def test_grpo_core_imports_follow_the_layers():
    """A layer imports the top modules, itself and earlier layers only; a top module
    imports no layer (config's modules: only CONFIG_LATE_IMPORTS, inside functions); a
    compatibility re-export imports only the module it re-exports."""
    bad = []
    for module, line, target, at_import in _all_imports():
        src, dst = _layer(module), _layer(target)
        if src is None or dst is None or dst == TOP:
            continue
        if src == TOP:
            ok = _in_package(module, "grpo_core.config") and target in CONFIG_LATE_IMPORTS and not at_import
        else:
            ok = dst <= src
        if not ok:
            bad.append(f"{_where(module, line)}: {module} ({LAYERS[src] if src >= 0 else 'top'})"
                       f" imports {target}")
    assert not bad, f"imports against grpo_core.LAYERS {LAYERS}:\n" + "\n".join(bad)


# The pure library runs from a plain script or a notebook: no orchestration, no tracking
# server, and no plotting (the charts are tasks/plots.py's), wherever the import sits.
CORE_NEVER_IMPORTS = ("prefect", "mlflow", "matplotlib")


def _external_imports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, top-level package) of every absolute import in `tree`, inside functions too."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.lineno, node.module.partition(".")[0]


def test_grpo_core_never_imports_prefect_mlflow_or_matplotlib():
    bad = [f"{_where(m, line)}: imports {pkg}" for m, tree in TREES.items()
           if _in_package(m, "grpo_core")
           for line, pkg in _external_imports(tree) if pkg in CORE_NEVER_IMPORTS]
    assert not bad, "grpo_core is the pure library:\n" + "\n".join(bad)
    tree = ast.parse("def f():\n    from matplotlib.figure import Figure\nimport mlflow.tracking\n")
    assert sorted(pkg for _, pkg in _external_imports(tree)) == ["matplotlib", "mlflow"]


def _import_time_closure(module: str) -> set[str]:
    """The project modules importing `module` imports, itself included."""
    graph, seen, todo = _graph(), set(), [module]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += graph[m]
    return seen


def test_the_tracking_facade_does_not_import_transformers():
    """tasks.tracking is imported by every flow and CLI command; transformers (tens of
    seconds on a loaded machine) only where a trainer is built: tasks.tracking.step_logger,
    imported from there, is not re-exported."""
    closure = _import_time_closure("tasks.tracking")
    assert "tasks.tracking.spool" in closure
    assert "tasks.tracking.step_logger" not in closure
    heavy = [f"{_where(m, node.lineno)}: imports {pkg}" for m in sorted(closure)
             for node in _import_time_nodes(TREES[m].body)
             for pkg in ([a.name.partition(".")[0] for a in node.names] if isinstance(node, ast.Import)
                         else [(node.module or "").partition(".")[0]] if not node.level else [])
             if pkg in ("transformers", "torch", "trl")]
    assert not heavy, "\n".join(heavy)


def test_ruff_is_clean_with_the_projects_rules():
    """The rule set is pyproject's [tool.ruff.lint]; ruff comes with the dev extra."""
    import shutil
    import subprocess
    import sys

    ruff = [sys.executable, "-m", "ruff"] if shutil.which("ruff") is None else ["ruff"]
    res = subprocess.run([*ruff, "check", "."], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]


# Packages whose __init__ is their public face (names gathered from their modules):
# importing from the package is importing from where the package says the name lives.
FACADES = ("grpo_core.config", "tasks.tracking")


def _defined_at_top(tree: ast.Module) -> set[str]:
    """Names a module binds itself at module level (def, class, assignment), not by import."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                node in tree.body:
            names.add(node.name)
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, ast.AnnAssign) else [])
        names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        if isinstance(node, (ast.If, ast.Try)):  # optional definitions
            names |= {n.name for n in ast.walk(node)
                      if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    return names


def _re_exported_imports(files: list[Path]) -> list[str]:
    """`file:line module.name` of every `from <project module> import name` whose module
    does not define `name` (it imports it from elsewhere), facades and submodules aside."""
    defined = {m: _defined_at_top(t) for m, t in TREES.items()}
    bad = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0
                    and node.module in MODULES and node.module not in FACADES):
                continue
            where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
            bad += [f"{where}:{node.lineno} {node.module}.{a.name}"
                    for a in node.names if a.name not in defined[node.module]
                    and f"{node.module}.{a.name}" not in MODULES]
    return bad


def test_every_import_names_the_module_that_defines_it():
    """No re-exports: a reader following an import lands on the definition."""
    files = [p for d in (*PACKAGES, "tests", "bench") for p in sorted((ROOT / d).rglob("*.py"))]
    bad = _re_exported_imports(files)
    assert not bad, "import these from the module that defines them:\n" + "\n".join(bad)


def test_re_export_check_sees_a_re_export(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from tasks.stages import Store, Ctx\n")  # stages imports Store
    assert _re_exported_imports([probe]) == ["probe.py:1 tasks.stages.Store"]
