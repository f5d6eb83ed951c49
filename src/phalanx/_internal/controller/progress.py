"""What the user sees of a run besides their own output: the progress view and lifecycle lines.

On a terminal (the driver's stderr is a tty) a status line sits under the workers' output::

    exp · attempt 1 · 4/4 workers · round 12 · loss=0.231 acc=0.91 · 3 checkpoints · train epoch 1 42% · 0:01:07

Elsewhere (a log file, CI) the same line is logged every ``PHALANX_PROGRESS_INTERVAL_S`` (30 s).
``RunConfig(verbose=0)`` turns both off. Everything here runs in the driver, fed by the rounds the
controller commits: ``report()`` on a worker does no more work with the view on than off.
"""

from __future__ import annotations

import logging
import shutil
import sys
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from phalanx._foundation import env
from phalanx._foundation.terminal import TERMINAL
from phalanx._internal.controller.anatomy import short

if TYPE_CHECKING:
    from collections.abc import Callable

    from phalanx._internal.controller.attempt import Attempt
    from phalanx._internal.controller.goodput import Goodput
    from phalanx._internal.controller.stragglers import StragglerPeriod
    from phalanx.callbacks import ReportInfo
    from phalanx.result import Result

logger = logging.getLogger(__name__)

REFRESH_S = 0.5  # how often the status line redraws (its elapsed time moves)
MIN_REDRAW_S = 0.05  # at most this often on new rounds: the terminal is slower than report()
MAX_METRICS = 6


class RunWatcher:
    """The progress view and the lifecycle log lines of one ``fit()``."""

    def __init__(
        self,
        run_name: str,
        num_workers: int,
        verbose: int,
        total_rounds: int | None = None,
        goodput: Callable[[], Goodput] | None = None,
    ) -> None:
        self.run_name = run_name
        self.goodput = goodput  # the breakdown so far, for the running figure
        self.num_workers = num_workers
        self.verbose = verbose
        self.total_rounds = total_rounds
        self.started = time.monotonic()
        self.attempt: Attempt | None = None
        self.round: int | None = None
        self.metrics: dict[str, Any] = {}
        self.checkpoints = 0
        self.data = ""  # where the latest committed checkpoint's datasets are ("train epoch 1 42%")
        self.straggling: dict[int, StragglerPeriod] = {}  # rank -> its period (the controller)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tty = False
        self._drawn = 0.0

    # -- the controller's hooks -----------------------------------------------------------------

    def start(self, engine: str, storage_uri: str) -> None:
        logger.info(
            "Run %r started: engine %s, %d worker%s, storage %s",
            self.run_name,
            engine,
            self.num_workers,
            "" if self.num_workers == 1 else "s",
            storage_uri,
        )
        if self.verbose == 0:
            return
        self._tty = _isatty(sys.stderr) and TERMINAL.attach_status(self.status_line)
        self._thread = threading.Thread(target=self._run, name="phalanx-progress", daemon=True)
        self._thread.start()

    def on_attempt(self, attempt: Attempt) -> None:
        self.attempt = attempt

    def on_report(self, info: ReportInfo) -> None:
        self.round = info.training_iteration
        self.metrics = info.run_metrics
        if info.checkpoint is not None:
            self.checkpoints += 1
            logger.debug(
                "Checkpoint %s committed (round %d)",
                info.checkpoint.path.rstrip("/").rsplit("/", 1)[-1],
                info.training_iteration,
            )
        now = time.monotonic()
        if self._tty and now - self._drawn >= MIN_REDRAW_S:  # hundreds of rounds a second
            self._drawn = now
            TERMINAL.refresh()

    def stop(self) -> None:
        """Idempotent; the view is gone when it returns."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._tty:
            TERMINAL.detach_status()
            self._tty = False

    def finish(self, result: Result) -> None:
        self.stop()
        took = _duration(time.monotonic() - self.started)
        if result.error is not None:
            logger.info("Run %r failed after %s: %s", self.run_name, took, result.error)
            return
        best = result.best_checkpoints[-1][0] if result.best_checkpoints else result.checkpoint
        where = best.path.rstrip("/").rsplit("/", 1)[-1] if best is not None else "none"
        logger.info("Run %r finished in %s; best checkpoint: %s", self.run_name, took, where)
        if result.goodput is not None:
            logger.info("Run %r: %s", self.run_name, result.goodput.summary())

    # -- the view -------------------------------------------------------------------------------

    def status_line(self) -> str:
        parts = [self.run_name]
        if self.attempt is not None:
            parts.append(f"attempt {self.attempt.number}")
            parts.append(f"{_alive(self.attempt)}/{self.num_workers} workers")
        if self.round is not None:
            total = f"/{self.total_rounds}" if self.total_rounds else ""
            word = "boosting round" if self.total_rounds else "round"
            parts.append(f"{word} {self.round}{total}")
        shown = _format_metrics(self.metrics)
        if shown:
            parts.append(shown)
        parts.append(f"{self.checkpoints} checkpoint{'' if self.checkpoints == 1 else 's'}")
        if self.data:
            parts.append(self.data)
        if self.straggling:
            slow = ", ".join(
                f"rank {r} {p['slowdown']:.2f}x ({short(p)})"
                for r, p in sorted(self.straggling.items())
            )
            parts.append(f"straggler: {slow}")
        if self.goodput is not None and self.round is not None:
            parts.append(f"goodput {self.goodput().goodput * 100:.0f} %")
        parts.append(_duration(time.monotonic() - self.started))
        line = " · ".join(parts)
        if self._tty:
            width = shutil.get_terminal_size().columns - 1
            line = line if len(line) <= width else line[: max(0, width - 1)] + "…"
        return line

    def _run(self) -> None:
        interval = REFRESH_S if self._tty else env.progress_interval_s()
        while not self._stop.wait(interval):
            if self._tty:
                TERMINAL.refresh()
            else:
                logger.info("%s", self.status_line())


def _alive(attempt: Attempt) -> int:
    futures = list(attempt.train_futures)
    if not futures:  # still starting
        return len(attempt.group.workers)
    gone = set(attempt.exited) | set(attempt.failures)
    return sum(1 for r, f in enumerate(futures) if not f.done() and r not in gone)


def _format_metrics(metrics: Mapping[str, object]) -> str:
    shown = []
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        shown.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
        if len(shown) == MAX_METRICS:
            break
    return " ".join(shown)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
