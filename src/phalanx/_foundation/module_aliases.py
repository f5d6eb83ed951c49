"""Old module paths of renamed modules, kept for pickles.

A preprocessor saved in a checkpoint, or a ``TorchCheckpoint`` a user pickled, names its class by
module path (``phalanx.preprocess.scalers.StandardScaler``). When an implementation module gains
a leading underscore, the old path must still import, or those pickles stop loading. The alias
lives in ``sys.modules`` only: ``import phalanx.preprocess.scalers`` and unpickling work, while
the package's attributes (and ``dir()``) show its API alone.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable

__all__ = ["keep_old_module_paths"]


def keep_old_module_paths(package: str, names: Iterable[str]) -> None:
    """Make each ``<package>.<name>`` import the module ``<package>._<name>``."""
    for name in names:
        sys.modules.setdefault(f"{package}.{name}", importlib.import_module(f"{package}._{name}"))
