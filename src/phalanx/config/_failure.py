"""FailureConfig: what happens when an attempt fails."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from phalanx._foundation.keywords import KeywordChecked
from phalanx.config._checks import _fail, _is_hang_timeout, _is_int, _is_number


@dataclass(frozen=True)
class FailureConfig(KeywordChecked):
    """What happens when an attempt fails: retry from the latest checkpoint, or raise.

    Two budgets, counted separately:

    - ``max_failures``: application failures, i.e. an exception in user code, a worker that
      died (killed by a signal, out of memory) or hung. ``-1`` retries forever.
    - ``max_preemption_failures``: infrastructure failures, i.e. a worker told to stop by
      SIGTERM (spot or node preemption). ``-1`` (the default) retries forever.

    ``hang_timeout_s``: ranks that make no progress (no ``report()``, no return) for this long
    are declared hung; the error names them, the rank that held the others up, and shows every
    rank's Python stack. ``"auto"`` (default) adapts to the run: the larger of a floor
    (``PHALANX_HANG_TIMEOUT_FLOOR_S``, 30 min) and 10x the slowest round seen so far; before
    any rank has reported, 4x the floor (compilation, data loading). ``None`` or ``0`` turns the
    watchdog off; a number of seconds fixes it (larger than your longest gap between reports).

    ``preemption_grace_s``: after a preemption notice, how long the ranks get to reach the stop
    round (and save a checkpoint) before they are killed.

    Accepted for Ray scripts, with nothing to configure in phalanx: ``controller_failure_limit``
    (the controller is your driver process: if it dies your script ends, and running it again
    resumes the run) and ``relax_collectives_on_preemption`` (``report()`` is never a barrier:
    surviving ranks always commit the stop round without the preempted ones).

    Example::

        FailureConfig(max_failures=2, hang_timeout_s=600)
    """

    max_failures: int = 0
    controller_failure_limit: int = -1
    max_preemption_failures: int = -1
    relax_collectives_on_preemption: bool = False
    preemption_grace_s: float = 30.0
    hang_timeout_s: float | Literal["auto"] | None = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.relax_collectives_on_preemption, bool):
            raise _fail(
                "FailureConfig",
                "relax_collectives_on_preemption",
                self.relax_collectives_on_preemption,
                "True or False",
            )
        for name in ("max_failures", "controller_failure_limit", "max_preemption_failures"):
            value = getattr(self, name)
            if not _is_int(value) or value < -1:
                raise _fail("FailureConfig", name, value, "an integer >= -1 (-1: retry forever)")
        hang = self.hang_timeout_s
        if not _is_hang_timeout(hang):
            raise _fail(
                "FailureConfig",
                "hang_timeout_s",
                hang,
                '"auto" (the default rule), None or 0 (no watchdog), or a finite number of '
                "seconds > 0",
            )
        grace = self.preemption_grace_s
        if not _is_number(grace) or not grace >= 0 or math.isinf(grace):
            raise _fail(
                "FailureConfig", "preemption_grace_s", grace, "a finite number of seconds >= 0"
            )
