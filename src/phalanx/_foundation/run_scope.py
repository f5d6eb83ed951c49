"""The seam between a run and what runs it as one part of something larger (a sweep's trial).

``phalanx.tune`` runs each trial's ``fit()`` in a thread of the sweep's driver. Two things cross
from the sweep into that ``fit()``, and both go through this module so that the trainer and the
controller never import ``phalanx.tune``:

- a :class:`RunScope`, set for the trial's thread (a context variable): ``fit()`` enters it
  first, and the scope fills in the run's defaults (the run directory inside the sweep's) and
  holds the run back until the sweep has the resources its workers need;
- :class:`RunStopped`, which a driver-side callback hook raises to end the run at once (a
  scheduler stopped the trial): every worker is stopped as for Ctrl-C, what was committed stays,
  the run is recorded as ``stopped`` and ``fit()`` raises it to its caller.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Protocol

__all__ = ["RunScope", "RunStopped", "current", "fit_scope", "set_current"]


class RunStopped(BaseException):
    """Ends a run from the driver side: raised by a callback hook (``after_report``,
    ``on_report``) or, with ``num_workers=0``, from the training function's ``report()``.

    A BaseException, as ``KeyboardInterrupt``: a training loop's ``except Exception`` does not
    swallow it, and the controller stops every worker before it leaves ``fit()``.
    """


class RunScope(Protocol):
    """What a sweep's trial does around each ``fit()`` in its thread."""

    def enter_fit(self, trainer: object) -> contextlib.AbstractContextManager[None]:
        """Set the trainer's run defaults, wait for the resources its workers need, and give
        them back when the block ends."""


_current: contextvars.ContextVar[RunScope | None] = contextvars.ContextVar(
    "phalanx_run_scope", default=None
)


def current() -> RunScope | None:
    """The scope of this thread's runs (None outside a sweep's trial)."""
    return _current.get()


def set_current(scope: RunScope | None) -> contextvars.Token[RunScope | None]:
    return _current.set(scope)


@contextlib.contextmanager
def fit_scope(trainer: object) -> Iterator[None]:
    """What ``fit()`` enters first: its scope's ``enter_fit``, or nothing outside a sweep."""
    scope = _current.get()
    if scope is None:
        yield
        return
    with scope.enter_fit(trainer):
        yield
