"""The optional part of a report message: the keys a rank may add to ``("report", ...)``.

The driver's ``engines.messages.decode`` reads each key with a default, so a rank sends only
the ones it has something to say about.
"""

from __future__ import annotations

from typing import TypedDict

__all__ = ["ReportExtras", "Wire", "plus_checkpoint_s"]

Wire = tuple[object, ...]
"""A message as a worker sends it to the driver: a plain tuple (``engines.messages.decode``)."""


class ReportExtras(TypedDict, total=False):
    validation: object  # True or a ValidationTaskConfig: validate the round's checkpoint
    checkpoint_class: str  # the Checkpoint subclass the driver rebuilds result.checkpoint as
    data_wait_s: float  # seconds this rank waited for batches since its last report
    checkpoint_s: float  # seconds spent saving the checkpoint (and save_state's hold)
    started: float  # when the training function started (the first report of an attempt)
    data_position: dict[str, dict[str, object]]  # each data stream's position after the round
    collective_s: float  # seconds in collectives since the last report
    steps: int  # optimizer steps since the last report
    replica: tuple[str, int, int]  # (replica group, checksum, optimizer steps) to compare


def plus_checkpoint_s(extras: ReportExtras, seconds: float) -> ReportExtras:
    """``extras`` with ``seconds`` more of ``checkpoint_s`` (saving the checkpoint, or waiting
    for the previous upload: the goodput's checkpoint part)."""
    return {**extras, "checkpoint_s": extras.get("checkpoint_s", 0.0) + seconds}
