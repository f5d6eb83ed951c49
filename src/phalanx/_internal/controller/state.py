"""The controller's states. FAILED is not a flag but a value: a ``Failure`` says why the attempt
failed and which budget it counts against, so the failure handler needs nothing else.

A step returns the next state: ``State.START``, ``State.RUNNING``, a ``Failure`` (the FAILED
state with its payload), or one of the final states ``State.FINISHED`` and ``State.ERRORED``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from phalanx.errors import WorkerGroupError


class State(enum.Enum):
    START = "start"
    RUNNING = "running"
    FINISHED = "finished"
    ERRORED = "errored"


FINAL_STATES = (State.FINISHED, State.ERRORED)


@dataclass(frozen=True)
class Failure:
    """The FAILED state: the error the attempt failed with (ranks that raised or died, a hang,
    workers that did not start), and whether every failed rank was preempted, which charges
    ``max_preemption_failures`` instead of ``max_failures``."""

    error: WorkerGroupError
    preempted: bool

    @classmethod
    def of(cls, error: WorkerGroupError) -> Failure:
        failures = error.worker_failures.values()
        return cls(error, bool(failures) and all(f.kind == "preempted" for f in failures))

    def exceptions(self) -> dict[int, BaseException]:
        """Each failed rank's exception (or a stand-in), for ``Callback.after_exception``."""
        return {
            rank: f.exception or RuntimeError(f.summary())
            for rank, f in self.error.worker_failures.items()
        }


Step = State | Failure
