"""The layers of ``src/phalanx``, one folder each, and the arrows between them pointing down only.

From the bottom, each layer by its folder::

    foundation    phalanx/_foundation/ (env, the filesystem leaf fs/, the helpers that import
                  nothing above them), and errors, _version, constants at the root
    definitions   config/, checkpoint, context, callbacks, backend, validation,
                  reported_checkpoint at the root (plain classes a user builds or receives)
    storage       phalanx/_internal/storage/
    result        result (a run's outcome; it reads a run directory through storage's reader)
    worker        phalanx/_internal/worker/ (the runtime inside a rank)
    engines       phalanx/_internal/engines/
    worker_group  phalanx/_internal/worker_group/
    controller    phalanx/_internal/controller/
    top           the trainer, the session, the package
                  root, the driver side of fit() (phalanx/_fit/), and every feature and
                  framework package (data, predict, cli, torch, xgboost, _gbdt, _devices, ...)

A module's layer is read from its path alone: there is no table of loose modules, and
``phalanx/_internal/`` holds the run machinery's five floors and nothing else.

Rules, each one test below:

- a module imports only modules of its own layer or a lower one; a function-level import counts
  (cycles hide there);
- a ``TYPE_CHECKING`` import follows the same order, except that it may point into the
  definitions layer or at ``phalanx.result`` from anywhere (``errors`` names ``Result`` in an
  annotation);
- no module in ``src/`` imports the package root (``from phalanx import x`` runs the root's
  ``__init__``, and with it the trainer and the controller); ``__version__`` comes from
  ``phalanx._version``;
- no runtime import cycle: the strongly connected components of the module-level plus
  function-level import graph all have size 1;
- ``phalanx.data`` imports no framework package (``phalanx.tensorflow`` registers its conversion
  with the data package instead), and no layer below the top imports an ML framework library.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import phalanx

SRC = Path(phalanx.__file__).parent.parent
ROOT = "phalanx"

LAYERS = (
    "foundation",
    "definitions",
    "storage",
    "result",
    "worker",
    "engines",
    "worker_group",
    "controller",
    "top",
)
FOUNDATION = {"_foundation", "errors", "_version", "constants"}
DEFINITIONS = {"config", "checkpoint", "context", "callbacks", "backend", "validation"}
DEFINITIONS |= {"reported_checkpoint"}
RUN_MACHINERY = ("storage", "worker", "engines", "worker_group", "controller")
# Annotations may name these from any layer (no code runs).
TYPE_ONLY_ANYWHERE = {"phalanx.result"}  # errors names Result
PHALANX_FRAMEWORKS = {"torch", "tensorflow", "jax", "xgboost", "lightgbm", "lightning"}
PHALANX_FRAMEWORKS |= {"huggingface", "horovod", "sklearn"}
ML_LIBRARIES = {"torch", "tensorflow", "jax", "xgboost", "lightgbm", "lightning"}
ML_LIBRARIES |= {"transformers", "sklearn", "keras", "horovod"}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    kind: str  # "module", "function" or "type"
    line: int

    def __str__(self) -> str:
        return f"{self.source} (line {self.line}, {self.kind}-level) imports {self.target}"


def src_modules() -> dict[str, Path]:
    """Every module under src/phalanx by dotted name (a package by its own name)."""
    modules = {}
    for path in sorted((SRC / ROOT).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = src_modules()


def layer_of(module: str) -> str | None:
    """The layer of a module, from its folder (None: a module in no layer's folder)."""
    parts = module.split(".")[1:]
    if not parts:
        return "top"
    if parts[0] == "_internal":
        if len(parts) == 1:
            return "foundation"  # the empty _internal/__init__.py
        return parts[1] if parts[1] in RUN_MACHINERY else None
    if parts[0] in FOUNDATION:
        return "foundation"
    if parts[0] == "result":
        return "result"
    return "definitions" if parts[0] in DEFINITIONS else "top"


def _resolve(name: str, modules: dict[str, Path]) -> str:
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name


def _targets(node: ast.Import | ast.ImportFrom, module: str, modules: dict[str, Path]) -> set[str]:
    """The src modules an import statement runs, as imported names resolve."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
        return {_resolve(n, modules) for n in names if n.split(".")[0] == ROOT}
    base = node.module or ""
    if node.level:
        package = (
            module.split(".") if modules[module].name == "__init__.py" else module.split(".")[:-1]
        )
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, base] if base else package)
    if base.split(".")[0] != ROOT:
        return set()
    if base == ROOT:  # runs the root's __init__ whatever the name is
        return {ROOT}
    found = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules}
    if len(found) < len(node.names):  # some names are attributes of base itself
        found.add(_resolve(base, modules))
    return found


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def walk_imports(module: str, source: str, modules: dict[str, Path]) -> Iterator[Edge]:
    """Every import of a src module in ``source``, with where it runs."""

    def visit(node: ast.AST, kind: str) -> Iterator[Edge]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                for target in sorted(_targets(child, module, modules)):
                    if target != module:
                        yield Edge(module, target, kind, child.lineno)
            elif isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.body:
                    yield from visit(ast.Module(body=[sub], type_ignores=[]), "type")
                for sub in child.orelse:
                    yield from visit(ast.Module(body=[sub], type_ignores=[]), kind)
            else:
                inner = (
                    "function"
                    if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
                    else kind
                )
                yield from visit(child, "type" if kind == "type" else inner)

    yield from visit(ast.parse(source), "module")


def _external_imports(source: str) -> Iterator[tuple[str, int]]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module, node.lineno


EDGES = [
    edge
    for module, path in MODULES.items()
    for edge in walk_imports(module, path.read_text(), MODULES)
]


def rank(module: str) -> int:
    layer = layer_of(module)
    assert layer is not None, module
    return LAYERS.index(layer)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for child in graph.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components: modules that reach each other (a few hundred
    modules: a walk from each is cheap)."""
    reach = {node: _reachable(graph, node) for node in graph}
    components: list[list[str]] = []
    placed: set[str] = set()
    for node in sorted(graph):
        if node not in placed:
            component = sorted({node} | {m for m in reach[node] if node in reach[m]})
            placed.update(component)
            components.append(component)
    return components


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in MODULES if layer_of(m) is None]
    assert not unplaced, (
        f"phalanx/_internal/ holds only {RUN_MACHINERY}: move {unplaced} to the folder of its"
        " layer (phalanx/_foundation/ for a helper that imports nothing above it)"
    )


def test_imports_point_down_the_layers() -> None:
    wrong = []
    for edge in EDGES:
        if edge.target == ROOT:
            continue  # its own test below
        upward = rank(edge.target) > rank(edge.source)
        type_only = edge.kind == "type" and (
            layer_of(edge.target) == "definitions" or edge.target in TYPE_ONLY_ANYWHERE
        )
        if upward and not type_only:
            wrong.append(f"{edge}: {layer_of(edge.source)} -> {layer_of(edge.target)}")
    assert not wrong, "\n".join(wrong)


def test_nothing_in_src_imports_the_package_root() -> None:
    wrong = [str(edge) for edge in EDGES if edge.target == ROOT]
    assert not wrong, "\n".join(wrong)


def test_no_runtime_import_cycle() -> None:
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for edge in EDGES:
        if edge.kind != "type":
            graph[edge.source].add(edge.target)
    cycles = [component for component in strongly_connected(graph) if len(component) > 1]
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def test_the_data_package_imports_no_framework_package() -> None:
    wrong = [
        str(edge)
        for edge in EDGES
        if edge.source.split(".")[:2] == [ROOT, "data"]
        and edge.target.split(".")[1:2]
        and edge.target.split(".")[1] in PHALANX_FRAMEWORKS
    ]
    assert not wrong, "\n".join(wrong)


def test_the_layers_below_the_top_import_no_ml_library() -> None:
    wrong = []
    for module, path in MODULES.items():
        if layer_of(module) in ("top", None):
            continue
        for name, line in _external_imports(path.read_text()):
            if name.split(".")[0] in ML_LIBRARIES:
                wrong.append(f"{module} (line {line}) imports {name}")
    assert not wrong, "\n".join(wrong)


def test_the_walk_sees_every_kind_of_import() -> None:
    """The rules above are only as good as the walk: function-level, relative, TYPE_CHECKING and
    ``from phalanx import x`` imports are all edges."""
    modules = {name: Path(f"{name.replace('.', '/')}.py") for name in ("phalanx", "phalanx.a")}
    modules |= {"phalanx.pkg": Path("phalanx/pkg/__init__.py"), "phalanx.pkg.b": Path("b.py")}
    source = (
        "from typing import TYPE_CHECKING\n"
        "from phalanx import a\n"
        "from . import b\n"
        "if TYPE_CHECKING:\n"
        "    from phalanx.a import X\n"
        "def f():\n"
        "    import phalanx.pkg.b.c\n"
        "    from phalanx.pkg import name_in_init\n"
    )
    edges = {(e.target, e.kind) for e in walk_imports("phalanx.pkg", source, modules)}
    assert edges == {
        (ROOT, "module"),
        ("phalanx.pkg.b", "module"),
        ("phalanx.a", "type"),
        ("phalanx.pkg.b", "function"),
    }
    assert strongly_connected({"x": {"y"}, "y": {"x", "z"}, "z": set()}) == [["x", "y"], ["z"]]
