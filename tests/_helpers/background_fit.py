"""fit() on a thread of the test process, so that the test can act while it runs: remove a node
under it, add one, free capacity, then read its Result."""

from __future__ import annotations

import queue
import threading
from typing import Any

from phalanx import Result


def fit_in_thread(trainer: Any) -> tuple[threading.Thread, queue.Queue]:
    """Start ``trainer.fit()`` on a thread; the queue gets its Result or the exception it raised.

    Example::

        runner, outcome = fit_in_thread(trainer)
        result = fit_result(runner, outcome, 120)
    """
    outcome: queue.Queue = queue.Queue()

    def run() -> None:
        try:
            outcome.put(trainer.fit())
        except BaseException as exc:  # handed to the test thread
            outcome.put(exc)

    runner = threading.Thread(target=run)
    runner.start()
    return runner, outcome


def fit_result(runner: threading.Thread, outcome: queue.Queue, timeout_s: float) -> Result:
    """The Result of the fit() that ``fit_in_thread`` started; fails the test if fit() has not
    ended within ``timeout_s`` or raised."""
    runner.join(timeout_s)
    assert not runner.is_alive(), "fit() did not end"
    result = outcome.get_nowait()
    assert not isinstance(result, BaseException), result
    return result
