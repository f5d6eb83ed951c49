"""The class of a reported checkpoint, by name: a rank reports a ``TorchCheckpoint`` and
``result.checkpoint`` (also after ``Result.from_path``) is one again, as in Ray Train.

The name travels in the report message and is kept in the run's snapshot. Reading it back never
imports a module a snapshot names, other than phalanx's own: a class from elsewhere is used only
when its module is imported already, otherwise the checkpoint is a plain ``Checkpoint``.
"""

from __future__ import annotations

import importlib
import logging
import sys

from phalanx.checkpoint import Checkpoint

logger = logging.getLogger(__name__)


def class_name(checkpoint: Checkpoint) -> str | None:
    """``"module:QualName"`` of a checkpoint's class; None for a plain ``Checkpoint``."""
    cls = type(checkpoint)
    return None if cls is Checkpoint else f"{cls.__module__}:{cls.__qualname__}"


def checkpoint_class(name: str | None) -> type[Checkpoint]:
    """The class ``name`` (from :func:`class_name`) stands for; ``Checkpoint`` when None or when
    it cannot be found without importing a module from outside phalanx."""
    if name is None:
        return Checkpoint
    module_name, _, qualname = name.partition(":")
    module = sys.modules.get(module_name)
    if module is None and (module_name == "phalanx" or module_name.startswith("phalanx.")):
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # e.g. phalanx.torch without torch installed
            logger.debug("checkpoint class %s not importable: %s", name, exc)
    found: object = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if isinstance(found, type) and issubclass(found, Checkpoint):
        return found
    logger.debug("checkpoint class %s not found: the checkpoint is a plain Checkpoint", name)
    return Checkpoint
