"""Where a rank's time between two reports went, besides waiting for data and checkpointing:
the seconds it waited in collectives, the steps it took, and (at the rounds that ask for it) a
checksum of its replicated state. Sent with the next ``report()``; no message of its own.

Two kinds of sources feed it:

- waits in the training thread (``phalanx.collective``'s barrier and broadcast, FSDP's
  synchronous collectives on CPU): ``collective_wait.add(seconds)``, summed per thread as
  ``data_wait`` is;
- the step clocks of the models ``prepare_model`` wrapped (``RankAnatomy.clocks``: for DDP,
  when the last gradient of a backward is ready and when DDP's all-reduces are done, host
  times or CUDA events; ``torch/_anatomy.py``), each with ``take() -> (collective seconds,
  steps)`` since its last take.

The driver (``controller/stragglers.py``) derives the rest: a rank's compute is its round's
time minus the data, collective and checkpoint seconds.

``RankAnatomy.replicas`` holds the replica checks of those models: ``payload(round, checkpointed)``
returns ``(group, checksum, optimizer steps)`` when the round is one to compare, else None
(``controller/agreement.py`` compares them before the round commits).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from phalanx._internal.worker.waits import WaitTotal

if TYPE_CHECKING:
    from phalanx._internal.worker.report_extras import ReportExtras

__all__ = ["RankAnatomy", "ReplicaCheck", "StepClock", "collective_wait"]

collective_wait = WaitTotal()


class StepClock(Protocol):
    def take(self) -> tuple[float, int]:
        """Seconds waited in collectives and steps taken since the last take."""
        ...


class ReplicaCheck(Protocol):
    def payload(self, round_index: int, checkpointed: bool) -> tuple[str, int, int] | None:
        """``(replica group, 64-bit checksum, optimizer steps)`` for a round to compare, else
        None."""
        ...


class RankAnatomy:
    """One rank's step clocks and replica checks (one per session: on the thread engine
    every rank is a thread of the driver)."""

    def __init__(self) -> None:
        self.clocks: list[StepClock] = []
        self.replicas: list[ReplicaCheck] = []

    def add_to(self, extras: ReportExtras, round_index: int, checkpointed: bool) -> None:
        """The report's anatomy items: ``collective_s``, ``steps``, ``replica`` (each only when
        there is something to say; a report without a prepared model pays one take)."""
        waited = collective_wait.take()
        steps = 0
        for clock in self.clocks:
            seconds, taken = clock.take()
            waited += seconds
            steps = max(steps, taken)
        if waited:
            extras["collective_s"] = waited
        if steps:
            extras["steps"] = steps
        for check in self.replicas:
            payload = check.payload(round_index, checkpointed)
            if payload is not None:
                extras["replica"] = payload
                return
