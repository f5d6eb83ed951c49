"""The run-wide step handed to ``Callback.on_report``: one per committed round, never repeated.

A retry restarts the training function from the latest checkpoint and a resumed run continues a
run directory, so ``training_iteration`` can come back to a value a tracker already saw; trackers
refuse or garble that (W&B drops rows whose step goes backwards, TensorBoard draws zig-zags). The
step instead counts committed rounds over the run's whole life. It needs no file of its own: every
committed round is one row of ``metrics.jsonl``, so a resumed run starts from that file's length
(a row cut by a crash counted too: a gap in steps is harmless, a repeat is not).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from phalanx.callbacks import Callback, ReportInfo

if TYPE_CHECKING:
    from phalanx._internal.controller.rounds import Round
    from phalanx._internal.storage.history import MetricsHistory
    from phalanx.checkpoint import Checkpoint


class ReportSteps:
    def __init__(self, history: MetricsHistory, callbacks: list[Callback]) -> None:
        self.history = history
        self.last_step = history.rows_at_start()
        # With a tracker watching, a round's history row reaches the disk before the tracker
        # sees its step, so even a driver killed right after cannot hand that step out again.
        # Only on a store that appends: elsewhere every flush writes one more object.
        self._flush_first = history.storage.appends and any(_watches(c) for c in callbacks)

    def info(self, round_: Round, attempt: int, checkpoint: Checkpoint | None) -> ReportInfo:
        self.last_step += 1
        if self._flush_first:
            self.history.flush()
        return ReportInfo(
            step=self.last_step,
            training_iteration=round_.index + 1,
            attempt=attempt,
            metrics=list(round_.metrics),
            checkpoint=checkpoint,
            timestamp=time.time(),
        )


def _watches(callback: Callback) -> bool:
    return type(callback).on_report is not Callback.on_report
