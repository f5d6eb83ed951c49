"""Resolve a Ray dotted name (``ray.train.torch.TorchTrainer``) through the rule table.

A name resolves to one of three things: ``MAPPED`` (a phalanx expression replaces the first
``consumed`` parts), ``UNSUPPORTED`` (left as it is and listed, with advice) or ``CORE`` (Ray
Core, ``ray.remote`` and the like: left as it is, Ray stays imported).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import logging
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from phalanx.migrate._rules import MODULES, NAMES, PARTIAL, UNSUPPORTED

__all__ = ["Resolution", "phalanx_module_of", "resolve"]

logger = logging.getLogger(__name__)

_PHALANX_MODULES = frozenset({"phalanx", *MODULES.values(), *PARTIAL.values()})


@dataclass(frozen=True)
class Resolution:
    """What a Ray name becomes: ``target`` replaces ``parts[:consumed]`` when ``MAPPED``."""

    kind: Literal["MAPPED", "UNSUPPORTED", "CORE"]
    target: str = ""
    consumed: int = 0
    advice: str = ""

    @property
    def importable(self) -> bool:
        """Whether ``target`` is a dotted name (an import can bind it), not an expression."""
        return self.kind == "MAPPED" and "(" not in self.target


_CORE = Resolution("CORE")


def resolve(parts: list[str]) -> Resolution:
    """Resolve ``parts`` (``["ray", "train", "report"]``), longest known prefix first."""
    for end in range(len(parts), 1, -1):
        dotted = ".".join(parts[:end])
        if end < len(parts) and dotted in PARTIAL and f"{dotted}.{parts[end]}" not in NAMES:
            return _unsupported(dotted, parts[end])
        if dotted in NAMES:
            return Resolution("MAPPED", NAMES[dotted], end)
        if dotted in PARTIAL and end == len(parts):  # the module itself: `import ray.data as rd`
            return Resolution("MAPPED", PARTIAL[dotted], end)
        if dotted in MODULES:
            if end == len(parts):
                return Resolution("MAPPED", MODULES[dotted], end)
            return _in_module(MODULES[dotted], parts, end)
    for end in range(len(parts), 1, -1):
        dotted = ".".join(parts[:end])
        if dotted in UNSUPPORTED:
            name = ".".join(parts[: end + 1])
            return Resolution("UNSUPPORTED", advice=UNSUPPORTED[dotted].format(name=name))
    return _CORE


def _in_module(target: str, parts: list[str], end: int) -> Resolution:
    """A name of a ``MODULES`` row: ``parts[end]``, or ``parts[end + 1]`` of a submodule."""
    names = exports(target)
    name = parts[end]
    # ray.train.torch.torch_trainer.TorchTrainer: a submodule's name is the package's.
    if end + 1 < len(parts) and name.islower():
        inner = parts[end + 1]
        if names is None or inner in names:
            return Resolution("MAPPED", f"{target}.{inner}", end + 2)
    if names is None or name in names:
        return Resolution("MAPPED", f"{target}.{name}", end + 1)
    return Resolution(
        "UNSUPPORTED",
        advice=f"{'.'.join(parts[: end + 1])}: {target} has no {name}; "
        "see docs/ray_differences.md for what to use",
    )


def _unsupported(module: str, name: str) -> Resolution:
    advice = UNSUPPORTED.get(module, "{name} has no phalanx equivalent")
    return Resolution("UNSUPPORTED", advice=advice.format(name=f"{module}.{name}"))


@functools.cache
def exports(module: str) -> frozenset[str] | None:
    """The public names of a phalanx module: its ``__all__`` and its public submodules, read
    from the source without importing it (importing would import torch, TensorFlow, ...).
    None when it cannot be read: then the table alone decides."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        logger.debug("cannot find %s to check names; trusting the table", module)
        return None
    names = _static_all(Path(spec.origin).read_text(encoding="utf-8"))
    if names is None:
        return None
    if spec.submodule_search_locations:
        found = pkgutil.iter_modules(list(spec.submodule_search_locations))
        names |= {info.name for info in found if not info.name.startswith("_")}
    return frozenset(names)


def _static_all(source: str) -> set[str] | None:
    """The strings of a module's ``__all__ = [...]``, or None when it has no literal one."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign):
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        named_all = isinstance(target, ast.Name) and target.id == "__all__"
        if named_all and isinstance(value, ast.List | ast.Tuple):
            return {
                elt.value
                for elt in value.elts
                if isinstance(elt, ast.Constant) and isinstance(elt.value, str)
            }
    return None


def phalanx_module_of(target: str) -> str:
    """The phalanx module an expression needs imported: ``phalanx.torch.TorchTrainer`` ->
    ``phalanx.torch``; ``phalanx.session.get_context().get_world_rank`` -> ``phalanx.session``."""
    dotted = target.split("(")[0].rstrip(".")
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in _PHALANX_MODULES:
            return candidate
    return "phalanx"
