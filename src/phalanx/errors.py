"""Every public exception phalanx raises.

The tree::

    Exception
    ├── ValueError
    │   └── ConfigError                  bad configuration, raised as early as possible
    │       └── UnknownArgumentError     a misspelt keyword argument (also a TypeError)
    ├── KeyError
    │   └── KeyNotFoundError             a name (a dataset, a metric) that is not there
    ├── RuntimeError
    │   ├── SessionMisuseError           a worker-only API called outside a worker
    │   ├── StorageError                 storage_path unreachable, not writable, or a commit failed
    │   ├── RayClusterUnresponsiveError  the Ray cluster's GCS did not answer within a bound
    │   └── TrainingFailedError          fit() failed; ``.result`` holds what was saved
    │       ├── WorkerGroupError         one or more ranks raised, died or hung
    │       │   ├── HangError            ranks made no progress for hang_timeout_s
    │       │   ├── PreemptionError      workers were preempted more often than allowed
    │       │   └── WorkerStartupError   workers could not be started (retried like a failure)
    │       └── ControllerError          the driver side failed (a callback raised, ...)
    └── (never wrapped) KeyboardInterrupt from the driver

Errors that cross process boundaries (``WorkerFailure``) pickle cleanly: they carry strings, not
live objects.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx.result import Result

__all__ = [
    "ConfigError",
    "ControllerError",
    "HangError",
    "KeyNotFoundError",
    "NCCLHangError",
    "PreemptionError",
    "RayClusterUnresponsiveError",
    "SessionMisuseError",
    "StorageError",
    "TrainingFailedError",
    "UnknownArgumentError",
    "WorkerFailure",
    "WorkerGroupError",
    "WorkerStartupError",
]


class ConfigError(ValueError):
    """A configuration value is invalid. The message names the field, the value and what is allowed."""


class UnknownArgumentError(ConfigError, TypeError):
    """A class got a keyword argument it does not take; the message suggests the closest name.
    Also a ``TypeError``, what Python raises for an unexpected keyword argument."""


class KeyNotFoundError(KeyError):
    """A name looked up is not there (a dataset, a metric). It is a ``KeyError``, so
    ``except KeyError`` works as in Ray, but prints its message as written: ``KeyError``'s own
    ``str()`` is the ``repr`` of its argument, which shows a HINT's newline as ``\\n``."""

    def __str__(self) -> str:
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class SessionMisuseError(RuntimeError):
    """A worker-side API (``report``, ``get_context``, ...) was called outside a training worker."""


class StorageError(RuntimeError):
    """The run's storage could not be used: not reachable, not writable, or a write failed."""


class RayClusterUnresponsiveError(RuntimeError):
    """The Ray cluster's control store (GCS) did not answer within ``PHALANX_RAY_GCS_TIMEOUT_S``."""


@dataclass(frozen=True)
class WorkerFailure:
    """What went wrong on one rank, in a form that pickles across processes.

    ``kind`` is ``"exception"`` (user code raised), ``"signal"`` (killed by a signal),
    ``"exit"`` (the process exited without finishing), ``"hang"`` (no progress),
    ``"preempted"`` (stopped by SIGTERM) or ``"startup"`` (the worker could not be started).

    Example::

        try:
            trainer.fit()
        except phalanx.WorkerGroupError as error:
            for rank, failure in error.worker_failures.items():
                print(rank, failure.kind, failure.type_name, failure.message)
    """

    rank: int
    kind: str
    type_name: str
    message: str
    traceback: str = ""
    pid: int | None = None
    host: str = ""
    exit_code: int | None = None
    signal: int | None = None
    exception: BaseException | None = field(default=None, compare=False)
    time: float = 0.0

    def summary(self) -> str:
        where = f"pid={self.pid}" if self.pid is not None else ""
        if self.kind == "signal":
            return f"killed by signal {self.signal} ({_signal_name(self.signal)}) {where}".strip()
        if self.kind == "exit" and self.exit_code is not None:
            return f"worker process exited with code {self.exit_code} {where}".strip()
        if self.kind == "hang":
            return f"hung: {self.message}"
        if self.kind == "preempted":
            return f"preempted: {self.message}"
        if self.kind == "startup":
            return f"did not start: {self.message}"
        return f"{self.type_name}: {self.message}"


def _signal_name(signum: int | None) -> str:
    import signal

    try:
        return signal.Signals(signum).name if signum is not None else "?"
    except ValueError:
        return "?"


class TrainingFailedError(RuntimeError):
    """``fit()`` failed. ``.result`` is the Result of what was committed before the failure."""

    def __init__(self, message: str, result: Result | None = None) -> None:
        super().__init__(message)
        self.result = result

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.result))


class WorkerGroupError(TrainingFailedError):
    """One or more ranks failed. ``worker_failures`` maps rank to its :class:`WorkerFailure`.

    The message groups ranks that failed the same way (``[rank 0, 2] ValueError: ...``) and names
    the earliest failure as the root cause; its traceback follows.
    """

    def __init__(
        self,
        worker_failures: dict[int, WorkerFailure],
        result: Result | None = None,
        message: str | None = None,
    ) -> None:
        self.worker_failures = dict(sorted(worker_failures.items()))
        super().__init__(message or format_failures(self.worker_failures), result)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.worker_failures, self.result, str(self)))


class HangError(WorkerGroupError):
    """Ranks made no progress for ``FailureConfig.hang_timeout_s``; the message has their stacks."""


NCCLHangError = HangError  # Ray's name: phalanx detects a hang in any collective, not only NCCL's


class PreemptionError(WorkerGroupError):
    """Workers were preempted more often than ``FailureConfig.max_preemption_failures`` allows."""


class WorkerStartupError(WorkerGroupError):
    """The engine could not start the workers of an attempt: the fork server died, a worker never
    said hello, or a Ray actor could not be created. It goes through the failure policy like any
    other failure (``FailureConfig.max_failures``); ``worker_failures`` names the workers."""

    @classmethod
    def of(cls, workers: list[int], why: str, hint: str) -> WorkerStartupError:
        """``workers`` (launch indices) could not be started because ``why``."""
        import time

        now = time.time()
        failures = {
            w: WorkerFailure(w, "startup", "WorkerStartupError", why, time=now) for w in workers
        }
        label = ", ".join(map(str, workers))
        return cls(failures, message=f"Worker(s) {label} could not be started: {why}\nHINT: {hint}")


class ControllerError(TrainingFailedError):
    """The driver side of the run failed (for example a callback raised)."""


def _normalise(text: str) -> str:
    return re.sub(r"\d+", "N", text)


def failure_groups(failures: dict[int, WorkerFailure]) -> list[str]:
    """One line per way ranks failed: ``[rank 0, 2] ValueError: ...``."""
    groups: dict[str, list[int]] = {}
    for rank, failure in failures.items():
        groups.setdefault(_normalise(failure.summary()), []).append(rank)
    return [
        f"[rank {', '.join(str(r) for r in ranks)}] {failures[ranks[0]].summary()}"
        for ranks in groups.values()
    ]


# What a rank raises when a peer's process went away: the message of a consequence, not a cause.
_LOST_PEER = re.compile(
    r"(connection|socket) (was )?(reset|closed|aborted|refused)|reset by peer|closed by peer"
    r"|broken pipe|remote process exited|peer (process )?(died|exited|closed|disconnected)",
    re.IGNORECASE,
)
# How much later than it was seen a lost-peer error ranks for the root cause. A rank killed by a
# signal is seen when its parent reaps it; its peers' errors may reach the driver first.
LOST_PEER_GRACE_S = 2.0


def root_failure(failures: dict[int, WorkerFailure]) -> WorkerFailure:
    """The failure that most likely caused the others: the earliest, where an exception saying
    a peer's connection went away ranks ``LOST_PEER_GRACE_S`` later than it was seen, so the
    peer that died (seen a moment later, when its process was reaped) is named instead."""

    def when(f: WorkerFailure) -> tuple[float, int]:
        lost_peer = f.kind == "exception" and _LOST_PEER.search(f.message) is not None
        return (f.time + (LOST_PEER_GRACE_S if lost_peer else 0.0), f.rank)

    return min(failures.values(), key=when)


def format_failures(failures: dict[int, WorkerFailure], limit: int = 4000) -> str:
    """Group identical failures across ranks; the root cause's traceback comes first."""
    if not failures:
        return "Training failed."
    root = root_failure(failures)
    lines = [f"Training failed on {len(failures)} rank(s):"]
    lines.extend(f"  {line}" for line in failure_groups(failures))
    lines.append(f"Root cause (earliest failure), rank {root.rank}:")
    lines.append(root.traceback.rstrip() or f"  {root.summary()}")
    if root.kind == "signal":
        lines.append(
            "HINT: a signal usually means the process was killed from outside, often by the "
            "out-of-memory killer (check `dmesg`); set FailureConfig(max_failures=...) to retry."
        )
    text = "\n".join(lines)
    return text if len(text) <= limit else text[: limit - 20] + "\n... (truncated)"
