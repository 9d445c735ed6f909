"""The package's layers import downward only, and no two modules import each other, directly or
in a circle: read from the source (every import, those inside functions and type-checking
blocks included), so a new import that leans upward fails here, not in a reader's head.

The layers, lowest first, are the ones docs/ARCHITECTURE.md draws. Inside ``opguard.analysis``
each subpackage answers one question and sits above the ones it builds on.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "opguard"

# Lowest first; a unit may import units of lower layers (and of its own), never higher.
# The root package is the public recording API: it defines ``__version__``, which every layer
# may read, and loads the recorder on first use (a facade, whose imports are not counted).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("opguard", "opguard._C", "opguard.dtypes", "opguard.capture_spec", "opguard.spending_limits"),
    ("opguard.store", "opguard.record_options", "opguard.children"),
    ("opguard.analysis.words", "opguard.analysis.elementwise"),
    ("opguard.analysis.align",),
    ("opguard.analysis.divergence",),
    ("opguard.analysis.tolerant", "opguard.analysis.state_diff"),
    ("opguard.analysis.result",),
    ("opguard.analysis.diff",),
    ("opguard.analysis", "opguard.analysis.contract", "opguard.analysis.browse"),
    ("opguard.distributed",),
    ("opguard.recorder", "opguard.hunt", "opguard.tool_registry"),
    ("opguard.report",),
    ("opguard.agent",),
    ("opguard.tools",),
    ("opguard.tui",),
    ("opguard.cli", "opguard.__main__", "opguard.demo"),
)
LAYER_OF = {unit: level for level, units in enumerate(LAYERS) for unit in units}


def _module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> Iterator[str]:
    """Every module of ``modules`` that ``path`` imports (``from X import name``: X.name where
    that is a module, else X)."""
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                name = f"{target}.{alias.name}"
                yield name if name in modules else target


def _unit(module: str) -> str:
    """The layer unit a module belongs to: an analysis subpackage or module, else a
    top-level package or module."""
    if module == "opguard":
        return module
    parts = module.split(".")
    depth = 3 if parts[:2] == ["opguard", "analysis"] and len(parts) > 2 else 2
    return ".".join(parts[:depth])


def _modules() -> dict[str, set[str]]:
    """Each module of the package and the package's modules it imports."""
    paths = {_module_of(p): p for p in PACKAGE.rglob("*.py")}
    known = set(paths) | {"opguard._C"}
    return {
        module: {t for t in _imports(path, known) if t in known and t != module}
        if module != "opguard"  # the facade
        else set()
        for module, path in paths.items()
    }


def test_every_unit_has_a_layer() -> None:
    units = {_unit(m) for m in _modules()}
    assert units <= set(LAYER_OF), f"give these a layer: {sorted(units - set(LAYER_OF))}"


def test_layers_import_downward_only() -> None:
    upward = sorted(
        f"{module} imports {target}"
        for module, targets in _modules().items()
        for target in targets
        if LAYER_OF[_unit(target)] > LAYER_OF[_unit(module)]
    )
    assert not upward, "\n".join(upward)


def test_no_modules_import_each_other() -> None:
    """No circle of module imports (a package's ``__init__`` re-exporting its modules is not
    one: the modules import what they need from each other, never from their ``__init__``)."""
    graph = _modules()
    # A package's __init__ importing its own modules is the facade, not a dependency.
    for module, targets in graph.items():
        if (PACKAGE.parent / module.replace(".", "/") / "__init__.py").exists():
            graph[module] = {t for t in targets if not t.startswith(module + ".")}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if state.get(target) is None and (found := visit(target)) is not None:
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if state.get(module) is None:
            circle = visit(module)
            assert circle is None, " -> ".join(circle)
