"""A worker's output as the user sees it: prefixed with its rank on the driver's terminal and
written, unprefixed, to ``rank_<r>.log``. Shared by the local and Ray engines."""

from __future__ import annotations

import logging
import os
import time
from typing import IO, Protocol

from phalanx._foundation.terminal import TERMINAL, LineState
from phalanx._internal.worker.runtime import RemoteCallError, RemoteException
from phalanx.errors import WorkerFailure

logger = logging.getLogger(__name__)


class RankedWorker(Protocol):
    """What RankOutput needs of a worker handle (local or Ray): its current rank."""

    rank: int


class RankOutput:
    """Writes a worker's output, prefixed with its rank, to the driver and to ``rank_<r>.log``.

    Text comes in pieces (whole lines, or a partial line after an idle time); the prefix goes at
    the start of every line and after every ``\\r``, so progress bars render in place. The log
    file gets the text as written, unprefixed.
    """

    def __init__(self, handle: RankedWorker, log_dir: str | None, attempt: int) -> None:
        self.handle = handle
        self.log_dir = log_dir
        self.attempt = attempt
        self._files: dict[int, IO[str] | None] = {}  # None: the log failed, terminal only
        self._states: dict[str, LineState] = {}

    def write(self, text: str, stream_name: str) -> None:
        rank = self.handle.rank
        state = self._states.get(stream_name)
        if state is None or state.prefix != f"[rank{rank}]: ":
            state = self._states[stream_name] = LineState(f"[rank{rank}]: ")
        TERMINAL.write(state, stream_name, text)
        try:
            log = self._log(rank)
            if log is not None:
                log.write(text)
                log.flush()
        except OSError as exc:  # a full disk must not stop the output, nor the driver's reader
            self._give_up(rank, exc)

    def _log(self, rank: int) -> IO[str] | None:
        if self.log_dir is None:
            return None
        if rank not in self._files:
            os.makedirs(self.log_dir, exist_ok=True)
            log = open(os.path.join(self.log_dir, f"rank_{rank}.log"), "a", buffering=1)
            self._files[rank] = log  # kept first: close() closes it even if the header fails
            # The file gathers every attempt (and every resumed run): say where each starts
            log.write(f"{attempt_header(self.attempt + 1)}\n")
        return self._files[rank]

    def _give_up(self, rank: int, exc: OSError) -> None:
        """Stop writing rank ``rank``'s log (said once); its output still reaches the terminal."""
        log = self._files.get(rank)
        self._files[rank] = None
        if log is not None:
            _close_quietly(log)
        logger.warning(
            "Could not write rank %d's output into %s: %s. Its output goes on to this terminal "
            "only.\nHINT: free space there or pick another RunConfig(storage_path=...).",
            rank,
            os.path.join(self.log_dir or "", f"rank_{rank}.log"),
            exc,
        )

    def close(self) -> None:
        for rank, f in self._files.items():
            if f is not None:
                try:
                    f.close()  # flushes: the disk may be full by now
                except OSError as exc:
                    logger.warning("Could not finish rank %d's log: %s", rank, exc)


def _close_quietly(log: IO[str]) -> None:
    try:
        log.close()
    except OSError:  # its last buffered text is lost with the disk space
        pass


def attempt_header(number: int, what: str = "") -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return f"===== attempt {number}{what} ({stamp}) ====="


def log_failures(log_dir: str | None, number: int, failures: dict[int, WorkerFailure]) -> None:
    """Write each failed rank's error and traceback into its own log, so that ``phalanx logs
    RUN --rank N`` shows why rank N failed (the driver's terminal shows the root cause only)."""
    if log_dir is None:
        return
    for failure in failures.values():
        if failure.rank < 0:
            continue
        text = failure.traceback.rstrip() or failure.summary()
        try:
            os.makedirs(log_dir, exist_ok=True)
            with open(os.path.join(log_dir, f"rank_{failure.rank}.log"), "a") as log:
                log.write(f"{attempt_header(number, ': this rank failed')}\n{text}\n")
        except OSError as exc:  # the run's own error is what the user must see
            logger.warning("Could not write rank %d's error into its log: %s", failure.rank, exc)


def reader_error(rank: int, exc: BaseException) -> RemoteCallError:
    """The failure of a worker whose messages the driver's reader thread could not handle."""
    return RemoteCallError(
        RemoteException(
            "ReaderError",
            f"the driver could not read the messages of rank {rank}: {type(exc).__name__}: {exc}",
            "",
            None,
        )
    )
