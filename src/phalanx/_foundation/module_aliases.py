"""Old module paths of renamed modules, kept for pickles.

A preprocessor saved in a checkpoint, or a ``TorchCheckpoint`` a user pickled, names its class by
module path (``phalanx.preprocess.scalers.StandardScaler``). When an implementation module gains
a leading underscore, the old path must still import, or those pickles stop loading. The alias
lives in ``sys.modules`` only: ``import phalanx.preprocess.scalers`` and unpickling work, while
the package's attributes (and ``dir()``) show its API alone.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterable

__all__ = ["KEPT_PATHS", "MOVED_MODULES", "keep_moved_module_paths", "keep_old_module_paths"]

# Modules that moved to another folder whose objects an old run directory pickled: a
# ``trainer.pkl`` holds a ``DataConfig`` and with it its ``ExecutionOptions``.
MOVED_MODULES = {"phalanx._internal.execution_options": "phalanx._foundation.execution_options"}


# Every old path keep_old_module_paths kept so far -> its module now (its package imported)
KEPT_PATHS: dict[str, str] = {}


def keep_old_module_paths(package: str, names: Iterable[str]) -> None:
    """Make each ``<package>.<name>`` import the module ``<package>._<name>``."""
    for name in names:
        old, new = f"{package}.{name}", f"{package}._{name}"
        sys.modules.setdefault(old, importlib.import_module(new))
        KEPT_PATHS[old] = new


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Imports an old module path as the module that lives at the new one (on first import)."""

    def __init__(self, moved: dict[str, str]) -> None:
        self.moved = moved

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = self.moved.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: object) -> types.ModuleType:
        return importlib.import_module(self.new)

    def exec_module(self, module: object) -> None:
        pass  # the new module ran already


def keep_moved_module_paths(moved: dict[str, str] = MOVED_MODULES) -> None:
    """Make each old path of ``moved`` import its new module, lazily: nothing is imported until
    something (an unpickler) asks for the old path."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder(dict(moved)))
