"""Telling the user's callbacks: a hook that raises fails the run with ControllerError (a
callback that hides its errors would hide the user's)."""

from __future__ import annotations

from phalanx._foundation.goodput_parts import Goodput
from phalanx.callbacks import Callback, TrainRunContext
from phalanx.errors import ConfigError, ControllerError


def notify(callbacks: list[Callback], hook: str, *args: object) -> None:
    for callback in callbacks:
        try:
            getattr(callback, hook)(*args)
        except (ConfigError, ControllerError):
            raise
        except Exception as exc:
            raise ControllerError(
                f"Callback {type(callback).__name__}.{hook} raised {type(exc).__name__}: {exc}"
            ) from exc


def notify_goodput(
    callbacks: list[Callback], context: TrainRunContext, attempts: int, goodput: Goodput
) -> None:
    """At the end of each attempt, the breakdown so far to the callbacks that take it (the
    trackers' ``on_goodput``; not a hook of Ray's Callback)."""
    takers = [c for c in callbacks if callable(getattr(c, "on_goodput", None))]
    notify(takers, "on_goodput", context, attempts, goodput)
