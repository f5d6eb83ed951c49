"""What a trial's code sees of its sweep: ``get_context()`` (the trial's id, name and
directory), ``report`` and ``get_checkpoint`` for function trainables.

The trial running in this thread is a context variable set by the sweep when it starts the
trial's thread, so the trainable and every ``fit()`` it calls find it without arguments.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

from phalanx.errors import ConfigError

if TYPE_CHECKING:
    from phalanx.checkpoint import Checkpoint
    from phalanx.tune._trial import Trial

__all__ = ["TuneContext", "get_checkpoint", "get_context", "report"]

# the trial this thread runs, and the sweep that decides on its results
_active: contextvars.ContextVar[tuple[Trial, Any] | None] = contextvars.ContextVar(
    "phalanx_tune_trial", default=None
)


def active() -> tuple[Trial, Any] | None:
    return _active.get()


def set_active(trial: Trial, sweep: Any) -> None:
    _active.set((trial, sweep))


def _current() -> Trial | None:
    found = _active.get()
    return found[0] if found else None


class TuneContext:
    """The trial this code runs in (Ray Tune's ``TuneContext``); every getter returns None
    outside a sweep's trial.

    Example::

        name = f"train-{tune.get_context().get_trial_id()}"
    """

    def __init__(self, trial: Trial | None) -> None:
        self._trial = trial

    def get_trial_id(self) -> str | None:
        return self._trial.trial_id if self._trial else None

    def get_trial_name(self) -> str | None:
        return self._trial.trial_name if self._trial else None

    def get_trial_dir(self) -> str | None:
        return self._trial.run_path if self._trial else None

    def get_experiment_name(self) -> str | None:
        return self._trial.sweep_name if self._trial else None

    def get_trial_resources(self) -> dict[str, float] | None:
        return dict(self._trial.resources) if self._trial else None


def get_context() -> TuneContext:
    """The trial this code runs in.

    Example::

        trial_id = tune.get_context().get_trial_id()
    """
    return TuneContext(_current())


def report(metrics: dict[str, Any], *, checkpoint: Checkpoint | None = None) -> None:
    """A function trainable's result (and checkpoint): the sweep's scheduler decides on it at
    once, and a trial it stops ends here.

    Example::

        def trainable(config):
            for step in range(10):
                tune.report({"loss": (config["x"] - 3) ** 2 / (step + 1)})
    """
    found = _active.get()
    if found is None:
        raise ConfigError(
            "tune.report() was called outside a sweep's trial.\nHINT: pass the function to "
            "tune.Tuner(fn, ...).fit(); inside a Train run's workers use phalanx.report()."
        )
    if not isinstance(metrics, dict):
        raise ConfigError(f"tune.report({metrics!r}): metrics must be a dict.")
    trial, sweep = found
    sweep.function_report(trial, metrics, checkpoint)


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint a function trainable resumes from: its own latest (after a retry or
    ``Tuner.restore``) or the one ``PopulationBasedTraining`` gave it; None on a fresh trial.

    Example::

        if checkpoint := tune.get_checkpoint():
            step = load_step(checkpoint.path)
    """
    found = _active.get()
    if found is None:
        return None
    trial, sweep = found
    return sweep.trial_checkpoint(trial)
