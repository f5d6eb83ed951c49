"""phalanx's console logging for the length of one ``fit()``.

A script that configured no logging still sees phalanx's lifecycle lines (run started, resumed,
attempt failed, finished): the ``phalanx`` logger gets a console handler at INFO. A script that
configured logging (the root logger has handlers) keeps its own setup untouched, apart from
``LoggingConfig(log_level=...)``, which sets the ``phalanx`` logger's level as in Ray.
``RunConfig(verbose=0)`` keeps phalanx quiet: warnings and errors only.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from phalanx.config import RunConfig

LOGGER = "phalanx"


class _CurrentStderr:
    """``sys.stderr`` as it is at each write: while the progress view is shown, that is the view's
    stream, which prints above the status line instead of into it."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


@contextlib.contextmanager
def console_logging(run_config: RunConfig) -> Iterator[None]:
    """Configure the ``phalanx`` logger for one fit(), and restore it afterwards."""
    phalanx = logging.getLogger(LOGGER)
    level_before = phalanx.level
    handler: logging.Handler | None = None
    if run_config.logging_config is not None:
        phalanx.setLevel(run_config.logging_config.log_level)
    elif run_config.verbose == 0:
        phalanx.setLevel(logging.WARNING)
    elif phalanx.level == logging.NOTSET:
        phalanx.setLevel(logging.INFO)
    if run_config.verbose > 0 and not logging.getLogger().handlers and not phalanx.handlers:
        handler = logging.StreamHandler(_CurrentStderr())  # type: ignore[arg-type]
        handler.setFormatter(logging.Formatter("[phalanx] %(message)s"))
        phalanx.addHandler(handler)
    try:
        yield
    finally:
        if handler is not None:
            phalanx.removeHandler(handler)
        phalanx.setLevel(level_before)
