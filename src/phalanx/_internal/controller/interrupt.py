"""Ctrl-C and SIGTERM to the driver: stop the run cleanly and say how to resume it.

During ``fit()`` (main thread only) SIGTERM raises ``KeyboardInterrupt``, as Ctrl-C does, so a
``kill`` of the driver stops every worker and keeps what was committed instead of behaving like
``kill -9``. The previous handler is restored when ``fit()`` returns. The ``KeyboardInterrupt``
that leaves ``fit()`` carries no traceback through phalanx's internals.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from phalanx.checkpoint import Checkpoint

logger = logging.getLogger(__name__)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"the driver got {signal.Signals(signum).name}")


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C inside the block (a no-op outside the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def resume_hint(checkpoints: int, latest: Checkpoint | None, run_uri: str, name: str) -> str:
    """The line printed after an interrupted run's workers are gone."""
    storage_path = run_uri.rsplit("/", 1)[0] if "/" in run_uri else "."
    kept = f"{checkpoints} checkpoint(s) kept in {run_uri}"
    if latest is not None:
        kept += f" (latest: {latest.path.rsplit('/', 1)[-1]})"
    return (
        f"Interrupted: every worker is stopped; {kept}. To resume, run fit() again with the same "
        f"RunConfig(name={name!r}, storage_path={storage_path!r})."
    )
