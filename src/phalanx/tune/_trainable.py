"""What a sweep does with its trainable: a Trainer copied for one trial (Ray's AIR form), its
name, the engine its runs use, and the modules its workers would each import imported once in
the sweep's driver."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import logging
import threading
from typing import Any

from phalanx.errors import ConfigError

__all__ = ["air_trainer", "import_worker_modules", "trainable_name", "uses_ray"]

logger = logging.getLogger(__name__)

_imports_lock = threading.Lock()
_imported: set[str] = set()


def import_worker_modules(trainer: Any) -> None:
    """Import in the sweep's driver what the trial's workers would each import again: the
    backend's ``preload_modules`` (``torch._dynamo`` for a TorchTrainer: over a second of CPU
    in every new worker, as the first optimizer or DDP() imports it). The local engine forks
    its workers from a copy of the driver, so every trial's workers start with them: a sweep
    pays the import once instead of once per worker of every trial. Nothing for the Ray engine
    (its workers are actors) or a run in the driver (``num_workers=0``).

    Every local trial's ``fit()`` passes the lock, also once the import is done: a fork while
    another thread is inside an import would leave that module's import lock held for good in
    the copy (its workers hang at their first use of it)."""
    from phalanx._internal.engines.choose import engine_name

    if trainer.scaling_config.num_workers == 0:
        return
    try:
        if engine_name(trainer.scaling_config) != "local":
            return
    except ConfigError:  # fit() says so itself
        return
    backend = getattr(trainer, "backend_config", None)
    modules = tuple(getattr(backend, "preload_modules", ()) or ())
    with _imports_lock:  # one thread imports; no trial forks meanwhile (they wait here)
        for module in modules:
            if module in _imported:
                continue
            _imported.add(module)
            try:
                importlib.import_module(module)
            except Exception as exc:  # the workers would import it themselves, and say why
                logger.debug("Could not import %s for the trials' workers: %s", module, exc)


def air_trainer(trainer: Any, config: dict[str, Any]) -> Any:
    """A copy of the Tuner's Trainer for one trial (``param_space={"train_loop_config": ...}``,
    Ray's AIR form): ``train_loop_config`` merged into the trainer's, other keys set."""
    copied = copy.copy(trainer)
    # each trial is its own run in the sweep's directory, whatever the trainer's name was
    copied.run_config = dataclasses.replace(trainer.run_config, name=None, storage_path=None)
    for key, value in config.items():
        if key == "train_loop_config":
            copied.train_loop_config = {**(trainer.train_loop_config or {}), **value}
        elif hasattr(trainer, key):
            setattr(copied, key, value)
        else:
            raise ConfigError(
                f"param_space key {key!r} is no argument of {type(trainer).__name__}.\nHINT: "
                'put the training function\'s hyperparameters under "train_loop_config".'
            )
    return copied


def trainable_name(trainable: object) -> str:
    if isinstance(trainable, type):
        return trainable.__name__
    name = getattr(trainable, "__name__", None) or type(trainable).__name__
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in name)


def uses_ray(trainer: Any) -> bool:
    """The trainer's run has workers on the Ray engine."""
    from phalanx._internal.engines.choose import engine_name

    if trainer.scaling_config.num_workers == 0:
        return False
    try:
        return engine_name(trainer.scaling_config) == "ray"
    except ConfigError:  # fit() says so itself
        return False
