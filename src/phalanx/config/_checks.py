"""What every config's validation shares: the error it raises and the value tests."""

from __future__ import annotations

import math
from typing import TypeGuard

from phalanx.errors import ConfigError


def _fail(cls: str, name: str, value: object, allowed: str, hint: str = "") -> ConfigError:
    message = f"{cls}({name}={value!r}) is invalid: {name} must be {allowed}."
    return ConfigError(message + (f"\nHINT: {hint}" if hint else ""))


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    """int or float, not bool: ``hang_timeout_s=True`` is a mistake, not one second."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_hang_timeout(value: object) -> bool:
    """``"auto"``, None, or a finite number of seconds >= 0 (0: off, as None)."""
    if value is None or (isinstance(value, str) and value == "auto"):
        return True
    return _is_number(value) and value >= 0 and not math.isinf(value)
