"""``TuneReportCallback``: a Train run's reports become its trial's results."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from phalanx.callbacks import Callback, TrainRunContext
from phalanx.tune._session import active

if TYPE_CHECKING:
    from phalanx.checkpoint import Checkpoint

__all__ = ["TuneReportCallback"]

logger = logging.getLogger(__name__)

ALL_RANKS_KEY = "all_ranks"


class TuneReportCallback(Callback):
    """Sends each committed round of a Train run to the sweep: rank 0's metrics at the top level
    of the trial's result (as Ray does) and every rank's under ``"all_ranks"`` (rank r's dict at
    index r); the round's committed checkpoint becomes the trial's latest.

    The sweep's scheduler decides at that round: a trial it stops ends its Train run there,
    with this round's checkpoint committed and every worker stopped. Outside a sweep the
    callback does nothing.

    Example::

        from phalanx.tune.integration.ray_train import TuneReportCallback
        RunConfig(callbacks=[TuneReportCallback()])
    """

    def __init__(self) -> None:
        self._warned = False

    def after_report(
        self,
        run_context: TrainRunContext,
        metrics: list[dict[str, Any]],
        checkpoint: Checkpoint | None,
    ) -> None:
        found = active()
        if found is None:
            if not self._warned:
                logger.warning("TuneReportCallback outside a sweep's trial: it does nothing.")
                self._warned = True
            return
        trial, sweep = found
        top = next((m for m in metrics if m), {})
        result = {**top, ALL_RANKS_KEY: [dict(m) for m in metrics]}
        sweep.on_result(trial, result, checkpoint)
