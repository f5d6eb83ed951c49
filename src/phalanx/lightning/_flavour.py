"""Which Lightning package phalanx.lightning binds to: ``lightning`` or ``pytorch_lightning``.

The two packages ship the same classes under two names, and a ``pytorch_lightning.Trainer``
refuses a strategy or plugin built from ``lightning.pytorch`` (and the reverse). Ray Train binds to
``lightning`` whenever it is installed, so with both installed (``lightning`` depends on
``pytorch_lightning``) a script that uses ``import pytorch_lightning as pl`` fails inside
``pl.Trainer(...)``. phalanx binds to the package the script already imported; only when it has
imported neither (or both) does it pick ``lightning`` first, as Ray does.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

__all__ = ["INSTALL_HINT", "import_lightning"]

INSTALL_HINT = 'HINT: pip install "phalanx[lightning]" (or pip install lightning).'


def import_lightning() -> ModuleType:
    """``lightning.pytorch`` or ``pytorch_lightning``, as the module docstring says."""
    for name in _preference(set(sys.modules)):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError(
        "phalanx.lightning needs PyTorch Lightning, which is not installed (neither "
        f"'lightning' nor 'pytorch_lightning' can be imported).\n{INSTALL_HINT}"
    )


def _preference(imported: set[str]) -> list[str]:
    """Import names to try, in order.

    >>> _preference({"pytorch_lightning"})
    ['pytorch_lightning', 'lightning.pytorch']
    >>> _preference(set())
    ['lightning.pytorch', 'pytorch_lightning']
    """
    if "pytorch_lightning" in imported and "lightning.pytorch" not in imported:
        return ["pytorch_lightning", "lightning.pytorch"]
    return ["lightning.pytorch", "pytorch_lightning"]
