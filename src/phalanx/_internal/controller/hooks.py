"""Telling the user's callbacks: a hook that raises fails the run with ControllerError (a
callback that hides its errors would hide the user's)."""

from __future__ import annotations

from typing import Any

from phalanx.callbacks import Callback
from phalanx.errors import ConfigError, ControllerError


def notify(callbacks: list[Callback], hook: str, *args: Any) -> None:
    for callback in callbacks:
        try:
            getattr(callback, hook)(*args)
        except (ConfigError, ControllerError):
            raise
        except Exception as exc:
            raise ControllerError(
                f"Callback {type(callback).__name__}.{hook} raised {type(exc).__name__}: {exc}"
            ) from exc
