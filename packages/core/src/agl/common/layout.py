"""agl-core's map of itself: its stages, lowest first, and the import graph over its modules, read from the source
(only packages' `__init__`s are imported, to tell a submodule from a name). `packages/core/tests/test_layout.py`
checks that no module imports a stage above its own; the docs' architecture page draws the stages and their folders
from the same functions.

The functions take another package's map as well (`stages=`; the package is the first part of the modules'
names): agl-trainer checks its own stages with them (`agl_trainer.stages`).
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Sequence
from pathlib import Path

# a package's map: (stage, what it does, the modules and packages it holds), lowest first
Stages = Sequence[tuple[str, str, tuple[str, ...]]]

# agl-core's: a module may import its own stage and the stages below it, never one above
STAGES: list[tuple[str, str, tuple[str, ...]]] = [
    (
        "shared",
        "the public records, the names on the wire, the REST client, and what every stage shares",
        ("agl._version", "agl.schema", "agl.protocol", "agl.client", "agl.common"),
    ),
    ("capture", "the agent's side: runs it and records what it does", ("agl.capture",)),
    ("store", "the durable store that keeps what was captured", ("agl.store",)),
    ("server", "`agl serve` over the store: REST API, OTLP receiver, LLM proxy, dashboard", ("agl.server",)),
    ("learn", "turns stored rollouts into transitions and credit", ("agl.learn",)),
    (
        "tools",
        "use every stage: the public names, the CLI, test helpers, deprecated aliases",
        ("agl", "agl.cli", "agl.testing", "agl.credit", "agl.air", "agl.transitions", "agl.trainable"),
    ),
]


def stage(module: str, stages: Stages = STAGES) -> int:
    """The rank of the stage `module` belongs to: the longest prefix in `stages` that names it."""
    best = (-1, -1)
    for rank, (_, _, prefixes) in enumerate(stages):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                best = max(best, (len(prefix), rank))
    if best[1] < 0:
        raise ValueError(f"{module} belongs to no stage of its package's map")
    return best[1]


def module_name(path: Path, root: Path) -> str:
    """`agl.capture.runner` for `root/capture/runner.py` (`root` being the `agl` package's folder, or another's)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str) -> bool:
    """Whether `dotted` names a module, asked only of packages: finding a module's submodule would import it (a
    module's names are never modules), and the packages' `__init__`s are light."""
    try:
        parent = importlib.util.find_spec(dotted.rsplit(".", 1)[0])
        if parent is None or parent.submodule_search_locations is None:
            return False
        return importlib.util.find_spec(dotted) is not None
    except ModuleNotFoundError:
        return False


def imports(source: str, name: str, *, is_package: bool = False) -> set[str]:
    """Every agl module the module `name` (its `source`) imports, at its top or inside a function (a lazy import is
    still a dependency); `from agl.x import y` where y is a module counts as importing agl.x.y. For a module of
    another package, that package's own modules (`agl_trainer.x` imports of `agl_trainer.y`)."""
    root = name.split(".")[0]
    package = name if is_package else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == root}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != root:
                continue
            found.add(target)
            found |= {f"{target}.{a.name}" for a in node.names if _is_module(f"{target}.{a.name}")}
    return found


def graph(root: Path) -> dict[str, set[str]]:
    """Every module under `root` (the `agl` package's folder, or another's) → the modules of its package it
    imports."""
    return {
        module_name(path, root): imports(
            path.read_text(), module_name(path, root), is_package=path.name == "__init__.py"
        )
        for path in sorted(root.rglob("*.py"))
    }


def upward_imports(name: str, targets: set[str], stages: Stages = STAGES) -> list[str]:
    """The imports of `name` that reach a stage above its own, described."""
    root = name.split(".")[0]
    out = []
    for target in sorted(targets):
        if target == root and name != root:  # `from agl import x`: judged by x itself
            continue
        here, there = stage(name, stages), stage(target, stages)
        if there > here:
            out.append(f"{name} ({stages[here][0]}) imports {target} ({stages[there][0]})")
    return out


def cycles(modules: dict[str, set[str]], *, ignore: frozenset[str] = frozenset({"agl"})) -> list[list[str]]:
    """The import circles among `modules` (a `graph`): each strongly connected group of two or more modules, sorted.
    `ignore`: modules whose imports are judged by what they name (a package's public face, `from agl import x`). A
    module's import of a package it is in is no edge: Python has run that package's `__init__` before the module
    (`from agl.store import rows` in `agl.store.lifecycle` names `rows`, not a dependency on `agl.store`)."""
    edges = {
        m: sorted(t for t in targets if t in modules and t not in ignore and not _within(m, t))
        for m, targets in modules.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:  # Tarjan's algorithm, iterative (deep packages would overflow recursion)
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            advanced = False
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(edges[target])))
                    advanced = True
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))

    for module in sorted(edges):
        if module not in index and module not in ignore:
            visit(module)
    return sorted(found)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")
