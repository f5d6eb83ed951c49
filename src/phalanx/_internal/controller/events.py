"""Reading the engine's event queue: what is queued now (waiting a little for the first event)
and a rank's report as the round bookkeeping takes it."""

from __future__ import annotations

import queue

from phalanx._internal.controller.rounds import Report
from phalanx._internal.engines import messages
from phalanx._internal.engines.messages import Events


def drain(events: Events, timeout_s: float | None) -> list[tuple[int, messages.Event]]:
    """Everything queued; waits up to ``timeout_s`` for the first event (None: no wait)."""
    batch = []
    if timeout_s is not None:
        try:
            batch.append(events.get(timeout=timeout_s))
        except queue.Empty:
            return []
    while True:
        try:
            batch.append(events.get_nowait())
        except queue.Empty:
            return batch


def round_report(event: messages.Report) -> Report:
    """The part of a rank's report its round keeps."""
    return Report(
        event.round,
        event.metrics,
        event.checkpoint_dir_name,
        event.time,
        event.checkpoint_class,
        event.checkpoint_s,
        event.data_wait_s,
        event.data_position,
        event.collective_s,
        event.steps,
        event.replica,
    )
