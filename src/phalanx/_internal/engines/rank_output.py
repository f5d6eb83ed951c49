"""A worker's output as the user sees it: prefixed with its rank on the driver's terminal and
written, unprefixed, to ``rank_<r>.log``. Shared by the local and Ray engines."""

from __future__ import annotations

import os
from typing import IO, Protocol

from phalanx._internal.terminal import TERMINAL, LineState
from phalanx._internal.worker.runtime import RemoteCallError, RemoteException


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
        self._files: dict[int, IO[str]] = {}
        self._states: dict[str, LineState] = {}

    def write(self, text: str, stream_name: str) -> None:
        rank = self.handle.rank
        state = self._states.get(stream_name)
        if state is None or state.prefix != f"[rank{rank}]: ":
            state = self._states[stream_name] = LineState(f"[rank{rank}]: ")
        TERMINAL.write(state, stream_name, text)
        log = self._log(rank)
        if log is not None:
            log.write(text)
            log.flush()

    def _log(self, rank: int) -> IO[str] | None:
        if self.log_dir is None:
            return None
        if rank not in self._files:
            os.makedirs(self.log_dir, exist_ok=True)
            self._files[rank] = open(
                os.path.join(self.log_dir, f"rank_{rank}.log"), "a", buffering=1
            )
        return self._files[rank]

    def close(self) -> None:
        for f in self._files.values():
            f.close()


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
