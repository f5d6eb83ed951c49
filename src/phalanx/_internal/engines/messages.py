"""The messages of the engine -> controller seam, and the worker -> driver wire they come from.

Workers send plain tuples whose first item names them (pickled by ``report()`` in the user's
training step, where a tuple is the cheapest thing to pickle, and readable by
``runtime.undecodable_error`` when the rest is not)::

    ("report", round, metrics, checkpoint_dir_name, time[, {"validation": spec,
                                                             "checkpoint_class": name,
                                                             "checkpoint_s": seconds,
                                                             "data_wait_s": seconds,
                                                             "started": time,
                                                             "collective_s": seconds,
                                                             "steps": count,
                                                             "replica": (group, sum, steps)}])
    ("preempting", time)          # the local worker got SIGTERM
    ("poll",)                     # wake the driver: a rank waits for a validation to finish
    ("poll", round)               # and: a rank waits until every round before `round` is processed
    ("ret", call_id, ok, value)   # a call's return value, or its RemoteException
    ("hello", pid, host)          # a local worker is ready
    ("out", stream, text)         # a Ray actor's output lines
    ("closed",)                   # a Ray actor's last message

The driver side of every engine turns each tuple into one of the types below with
:func:`decode`, at once, in the thread that reads it; nothing past the engine sees a tuple.
An engine puts each :data:`Event` into the ``events`` queue as ``(worker_index, event)``;
``Return``, ``Hello``, ``Output`` and ``Closed`` stay inside the engine.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Any, TypeAlias


@dataclass(frozen=True, slots=True)
class Report:
    """A rank called ``report()``: its ``round``-th report of this run."""

    round: int
    metrics: dict[str, Any]
    checkpoint_dir_name: str | None
    time: float
    # report(validation=...): what to validate this round's checkpoint with
    validation: object = None
    checkpoint_class: str | None = None  # "module:QualName" of a Checkpoint subclass reported
    # For the goodput breakdown: seconds report() was blocked saving the checkpoint, seconds the
    # rank waited for batches since its last report, when its training function started (first
    # report of an attempt only).
    checkpoint_s: float = 0.0
    data_wait_s: float = 0.0
    started: float | None = None
    # Each data stream's position after this report (``DataPositions.snapshot()``), or None
    data_position: dict[str, Any] | None = None
    # The step anatomy (worker/step_anatomy.py): seconds waited in collectives and steps taken
    # since the rank's last report; its replica checksum when the round is one to compare.
    collective_s: float = 0.0
    steps: int = 0
    replica: tuple[str, int, int] | None = None


@dataclass(frozen=True, slots=True)
class Preempting:
    """The worker got SIGTERM (a preemption notice) at ``time``; it keeps training."""

    time: float


@dataclass(frozen=True, slots=True)
class Exited:
    """The worker is gone: ``returncode`` (negative: killed by that signal), ``cause`` where the
    engine knows more (Ray: why the actor died)."""

    returncode: int
    cause: str | None = None


@dataclass(frozen=True, slots=True)
class CallDone:
    """A rank's training call resolved. Queued by the controller's done-callback on the call's
    future, not by the engine, so the poll loop wakes at once instead of at its next timeout."""


@dataclass(frozen=True, slots=True)
class Poll:
    """The driver should look at its run again: a rank waits in ``get_all_reported_checkpoints``
    for validations, which the driver collects when it polls (with ``num_workers=0`` it polls
    only when a message arrives), or, with ``round``, until every round before ``round`` is
    processed, which the driver then records in the snapshot even if no checkpoint came with
    them."""

    round: int | None = None


Event: TypeAlias = Report | Preempting | Exited | CallDone | Poll
Events: TypeAlias = "queue.Queue[tuple[int, Event]]"


@dataclass(frozen=True, slots=True)
class Return:
    """The outcome of call ``call_id``: its value (``ok``) or a ``RemoteException``."""

    call_id: int
    ok: bool
    value: Any


@dataclass(frozen=True, slots=True)
class Hello:
    pid: int
    host: str


@dataclass(frozen=True, slots=True)
class Output:
    stream: str  # "stdout" or "stderr"
    text: str


@dataclass(frozen=True, slots=True)
class Closed:
    """The worker sent its last message."""


Message: TypeAlias = Event | Return | Hello | Output | Closed


class UnknownMessage(ValueError):
    """A tuple of no shape above: a worker of another phalanx version, or a bug."""


def decode(wire: tuple[Any, ...]) -> Message:
    """The typed message for a tuple from a worker (see the module docstring).

    Runs once per message in the engine's reader thread, so it dispatches on the kind and the
    length with plain comparisons (a ``match`` with class patterns costs several times as much).
    """
    kind = wire[0] if type(wire) is tuple and wire else None
    size = len(wire) if kind is not None else 0
    if kind == "report" and size == 5:
        return Report(wire[1], wire[2], wire[3], wire[4])
    if kind == "report" and size == 6:
        extras = wire[5]
        return Report(
            wire[1],
            wire[2],
            wire[3],
            wire[4],
            extras.get("validation"),
            extras.get("checkpoint_class"),
            extras.get("checkpoint_s", 0.0),
            extras.get("data_wait_s", 0.0),
            extras.get("started"),
            extras.get("data_position"),
            extras.get("collective_s", 0.0),
            extras.get("steps", 0),
            extras.get("replica"),
        )
    if kind == "ret" and size == 4:
        return Return(wire[1], wire[2], wire[3])
    if kind == "out" and size == 3:
        return Output(wire[1], wire[2])
    if kind == "preempting" and size == 2:
        return Preempting(wire[1])
    if kind == "poll" and size == 1:
        return Poll()
    if kind == "poll" and size == 2:
        return Poll(wire[1])
    if kind == "hello" and size == 3:
        return Hello(wire[1], wire[2])
    if kind == "closed" and size == 1:
        return Closed()
    shown = kind if kind is not None else type(wire).__name__
    raise UnknownMessage(f"a worker sent a message phalanx does not know: {shown!r} ({size} items)")


def in_process_event(wire: tuple[Any, ...]) -> Event:
    """The event for a message sent by a rank that runs in the driver (thread, inline engines),
    with a copy of a report's metrics, as pickling makes one for a worker process: the rank may
    change its dict after ``report()``."""
    match decode(wire):
        case Report() as r:
            return Report(
                r.round,
                dict(r.metrics),
                r.checkpoint_dir_name,
                r.time,
                r.validation,
                r.checkpoint_class,
                r.checkpoint_s,
                r.data_wait_s,
                r.started,
                r.data_position,  # a new dict per report(): snapshot() builds it
                r.collective_s,
                r.steps,
                r.replica,
            )
        case Preempting() | Poll() as event:
            return event
        case other:
            raise UnknownMessage(f"a rank in the driver does not send {type(other).__name__}")
