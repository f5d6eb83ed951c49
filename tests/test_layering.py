"""The layers below the public API stay below it: the controller, the worker group, the engines,
the worker runtime and storage import only ``phalanx._internal.*`` and the plain definition
modules (configs, errors, checkpoints, contexts, results, callbacks, the backend hooks) — never
a feature package (``phalanx.data``, ``preprocess``, ``predict``), a framework package
(``phalanx.torch``, ...) or the trainer. Those are handed in by the trainer (``RunSpec``), so a
change to data loading or a framework cannot break the control loop, and no import cycle runs
through it. A function-level import counts: cycles hide there."""

from __future__ import annotations

import ast
from pathlib import Path

import phalanx

LOW_LAYERS = ("controller", "worker_group", "engines", "worker", "storage")
DEFINITIONS = {"backend", "callbacks", "checkpoint", "config", "context", "errors", "result"}
DEFINITIONS |= {"reported_checkpoint", "validation", "__version__", "_version"}
FRAMEWORKS = {"torch", "tensorflow", "jax", "xgboost", "lightgbm", "lightning", "transformers"}


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "phalanx":  # from phalanx import x: x is a module or a name in one
                names |= {f"phalanx.{alias.name}" for alias in node.names}
            else:
                names.add(node.module)
    return names


def test_the_low_layers_import_only_internals_and_definitions() -> None:
    root = Path(phalanx.__file__).parent / "_internal"
    wrong = []
    for layer in LOW_LAYERS:
        for path in sorted((root / layer).rglob("*.py")):
            for name in sorted(imported_modules(path)):
                top, _, rest = name.partition(".")
                first = rest.split(".")[0]
                if top in FRAMEWORKS or (
                    top == "phalanx" and first != "_internal" and first not in DEFINITIONS
                ):
                    wrong.append(f"{path.relative_to(root)} imports {name}")
    assert wrong == []
