"""``Trainer.restore(path)`` / ``can_restore(path)``: Ray's V1 names for resuming a run.

phalanx resumes any run started again with the same ``storage_path`` and ``name``; these map a
run directory to that pair. As in Ray V1, ``fit()`` saves the trainer's arguments in the run
directory (``trainer.pkl``, datasets by key only), so ``restore(path, datasets=...)`` rebuilds
the trainer without the training function being passed again.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import pickle
import warnings
from typing import TYPE_CHECKING, Any

from phalanx._internal.storage.run_storage import SNAPSHOT_FILE, RunStorage
from phalanx.config import RunConfig
from phalanx.errors import ConfigError, StorageError

if TYPE_CHECKING:
    from phalanx.trainer import BaseTrainer

logger = logging.getLogger(__name__)

TRAINER_FILE = "trainer.pkl"  # Ray V1's name: (trainer class, constructor arguments)


def split_run_path(path: str | os.PathLike[str]) -> tuple[str, str]:
    """``<storage_path>/<name>`` -> ``(storage_path, name)``."""
    text = os.fspath(path).rstrip("/")
    if "/" not in text:
        text = os.path.join(os.getcwd(), text)
    parent, name = text.rsplit("/", 1)
    if not name or not parent or parent.endswith(":/"):
        raise ConfigError(
            f"restore(path={os.fspath(path)!r}) is invalid: it must be a run directory, "
            "<storage_path>/<name>.\nHINT: pass result.path of the run."
        )
    return parent, name


def can_restore(path: str | os.PathLike[str], storage_filesystem: object = None) -> bool:
    storage_path, name = split_run_path(path)
    storage = RunStorage.create(storage_path, name, storage_filesystem)
    return storage.read(SNAPSHOT_FILE) is not None


def init_arguments(
    cls: type, args: tuple[object, ...], kwargs: dict[str, object]
) -> dict[str, object] | None:
    """The arguments of ``cls(*args, **kwargs)`` by name, as given (defaults left out); None
    when they cannot be named (a ``*args`` signature, or a call ``__init__`` will reject)."""
    signature = _init_signature(cls)
    if signature is None:
        return None
    try:
        bound = signature.bind_partial(None, *args, **kwargs)
    except TypeError:
        return None
    arguments = dict(bound.arguments)
    arguments.pop(next(iter(signature.parameters)), None)  # self
    for name, parameter in signature.parameters.items():
        if name not in arguments:
            continue
        if parameter.kind is parameter.VAR_POSITIONAL:
            return None
        if parameter.kind is parameter.VAR_KEYWORD:
            arguments.update(arguments.pop(name))
    return arguments


@functools.cache
def _init_signature(cls: type) -> inspect.Signature | None:
    try:
        return inspect.signature(cls.__init__)  # type: ignore[misc]
    except (TypeError, ValueError):
        return None


def save_trainer(storage: RunStorage, trainer: BaseTrainer) -> None:
    """Write ``trainer.pkl``: the trainer's class and arguments, datasets by key only (data is
    never copied into the run directory). Arguments that do not pickle are logged, not fatal:
    ``restore`` then needs them passed again."""
    import cloudpickle

    arguments = getattr(trainer, "_init_arguments", None)
    if arguments is None:
        return
    saved = dict(arguments)
    saved["datasets"] = list(saved.get("datasets") or {})
    try:
        payload = cloudpickle.dumps((type(trainer), saved))
    except Exception as exc:
        logger.warning(
            "%s's arguments could not be saved in %s (%s: %s): %s.restore(path) will need "
            "them passed again.",
            type(trainer).__name__,
            storage.path(TRAINER_FILE),
            type(exc).__name__,
            exc,
            type(trainer).__name__,
        )
        return
    storage.write_atomic(TRAINER_FILE, payload)


def restore_kwargs(trainer: type, path: str | os.PathLike[str], kwargs: dict[str, Any]) -> dict:
    """The arguments to build ``trainer`` with: those saved by the run's ``fit()`` (if any),
    overridden by the ones given again, with a RunConfig that points at the run in ``path``."""
    owner = trainer.__name__
    given_run_config = kwargs.pop("run_config", None)
    filesystem = kwargs.pop("storage_filesystem", None) or (
        given_run_config.storage_filesystem if given_run_config is not None else None
    )
    if not can_restore(path, filesystem):
        raise ConfigError(
            f"{owner}.restore({os.fspath(path)!r}): there is no phalanx run there (no "
            f"{SNAPSHOT_FILE}).\nHINT: check {owner}.can_restore(path) first, or pass "
            "result.path of an earlier run."
        )
    storage_path, name = split_run_path(path)
    saved = _load_trainer(RunStorage.create(storage_path, name, filesystem))
    if saved is None:
        arguments = dict(kwargs)
        _check_required(trainer, arguments)
    else:
        arguments = _merged(trainer, saved, kwargs)
    run_config = given_run_config or arguments.pop("run_config", None) or RunConfig()
    arguments["run_config"] = dataclasses.replace(
        run_config, name=name, storage_path=storage_path, storage_filesystem=filesystem
    )
    return arguments


def _load_trainer(storage: RunStorage) -> tuple[type, dict[str, Any]] | None:
    """``trainer.pkl``, unpickled: restoring a run runs the code saved with it (as in Ray)."""
    raw = storage.read(TRAINER_FILE)
    if raw is None:
        return None
    try:
        cls, arguments = pickle.loads(raw)
    except Exception as exc:
        raise StorageError(
            f"{storage.path(TRAINER_FILE)!r} could not be unpickled: {type(exc).__name__}: "
            f"{exc}. Likely cause: a package the trainer's arguments need is missing or of "
            "another version.\nHINT: install it, or remove that file and pass the trainer's "
            "arguments to restore() again."
        ) from exc
    return cls, dict(arguments)


def _merged(
    trainer: type, saved: tuple[type, dict[str, Any]], kwargs: dict[str, Any]
) -> dict[str, Any]:
    saved_cls, arguments = saved
    if saved_cls is not trainer:
        warnings.warn(
            f"The run was started by {saved_cls.__name__}, and is restored with "
            f"{trainer.__name__}.restore, which most likely fails. HINT: use "
            f"{saved_cls.__name__}.restore(path) instead.",
            UserWarning,
            stacklevel=4,
        )
    expected = list(arguments.pop("datasets", None) or [])
    _check_datasets(trainer.__name__, expected, kwargs.get("datasets"))
    arguments.update({key: value for key, value in kwargs.items() if value is not None})
    return arguments


def _check_datasets(owner: str, expected: list[str], given: dict[str, Any] | None) -> None:
    """Datasets are not saved: every one the run was trained on must be passed again."""
    if expected and not given:
        raise ConfigError(
            f"{owner}.restore(path): the run was trained on the datasets {expected}, which are "
            f"not saved in the run directory.\nHINT: pass them again: {owner}.restore(path, "
            f"datasets={{...}}) with the keys {expected}."
        )
    if given is not None and set(given) != set(expected):
        raise ConfigError(
            f"{owner}.restore(path, datasets=...) got the keys {sorted(given)}, but the run was "
            f"trained on {expected}.\nHINT: pass the same datasets as the original trainer, "
            "under the same keys."
        )


def _check_required(trainer: type, arguments: dict[str, Any]) -> None:
    signature = _init_signature(trainer)
    if signature is None:
        return
    missing = [
        name
        for name, p in list(signature.parameters.items())[1:]
        if p.default is p.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and name not in arguments
    ]
    if missing:
        owner = trainer.__name__
        raise ConfigError(
            f"{owner}.restore(path) needs {missing}: the run directory holds no saved trainer "
            f"({TRAINER_FILE}; a run started before phalanx saved it, or whose arguments did "
            f"not pickle).\nHINT: pass them again, e.g. {owner}.restore(path, "
            f"{missing[0]}=..., ...)."
        )
