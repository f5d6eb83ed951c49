"""Straggler detection: the rank whose rounds take clearly longer than everybody else's.

A rank's round time is the time between two of its reports, read on the rank's own clock (hosts'
clocks are never compared). In an eligible round a rank is slow when its round took at least
SLOWDOWN x the median of the other ranks' (and MIN_EXCESS_S more); CONSECUTIVE slow eligible
rounds in a row make it a straggler: one WARNING naming it, and a period that lasts until it is
not slow for CONSECUTIVE eligible rounds in a row. Not eligible, so never a false alarm: a rank's
first round (compilation, data loading), a round with a checkpoint and the round after it (a
rank writing the checkpoint is slow for a good reason), a round a rank did not report (it had
returned). A uniform slowdown (every rank slow together) keeps every ratio near 1.

What this cannot see: ranks that wait for each other in a collective every step (DDP) report at
the same pace, the straggler's delay spread over everybody; the hang roll call names such a rank
once it stops the others outright.

Example::

    detector = StragglerDetector(workers, attempt=1)
    for round_ in complete_rounds:
        for period in detector.observe(round_):
            logger.warning(describe(period))
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from typing import Any

from phalanx._internal.controller.rounds import Round
from phalanx._internal.engines.base import WorkerMetadata

logger = logging.getLogger(__name__)

SLOWDOWN = 1.3  # round time >= this x the median of the other ranks' is slow
CONSECUTIVE = 5  # slow eligible rounds in a row to flag a rank (and fast ones to clear it)
MIN_EXCESS_S = 0.01  # and at least this much slower: sub-millisecond rounds jitter by 30 %


@dataclass
class _RankState:
    slow_run: int = 0  # slow eligible rounds in a row
    fast_run: int = 0  # not-slow eligible rounds in a row (ends an open period)
    ratios: list[float] = field(default_factory=list)  # of the current run / period
    first_round: int = 0  # of the current run of slow rounds
    started: float = 0.0  # the rank's report time in that round
    period: dict[str, Any] | None = None  # open period


def slow_ranks(durations: list[float]) -> dict[int, float]:
    """``{rank: its round time / the median of the others'}`` for the slow ranks of a round."""
    slow = {}
    for rank, took in enumerate(durations):
        others = statistics.median(durations[:rank] + durations[rank + 1 :])
        if took >= SLOWDOWN * others and took - others >= MIN_EXCESS_S:
            slow[rank] = took / others if others > 0 else float("inf")
    return slow


class StragglerDetector:
    """Fed every committed round of one attempt; returns the stragglers it newly flags.

    ``periods`` lists every period of this attempt (open ones with ``last_round`` so far),
    as plain data: rank, host, node_id, gpu_ids, slowdown (median ratio), first/last round,
    started/ended (the rank's report times, seconds since 1970), attempt."""

    def __init__(self, workers: list[WorkerMetadata], attempt: int) -> None:
        self.workers = workers
        self.attempt = attempt
        self.periods: list[dict[str, Any]] = []
        self._states = [_RankState() for _ in workers]
        self._previous: list[float] | None = None  # each rank's last report time
        self._after_checkpoint = False

    def observe(self, round_: Round) -> list[dict[str, Any]]:
        reports = round_.reports
        if len(reports) < 2 or len(reports) != len(self._states):
            return []
        if any(r is None for r in reports):  # a rank had returned: the group is winding down
            self._previous = None
            return []
        times = [r.time for r in reports if r is not None]
        previous, self._previous = self._previous, times
        checkpointed = any(r.checkpoint_dir_name for r in reports if r is not None)
        after_checkpoint, self._after_checkpoint = self._after_checkpoint, checkpointed
        if previous is None or checkpointed or after_checkpoint:
            return []
        slow = slow_ranks([now - before for now, before in zip(times, previous, strict=True)])
        flagged = []
        for rank, state in enumerate(self._states):
            if self._update(rank, state, slow.get(rank), round_.index, times[rank]):
                flagged.append(state.period)
        return [p for p in flagged if p is not None]

    def _update(
        self, rank: int, state: _RankState, ratio: float | None, index: int, at: float
    ) -> bool:
        """One eligible round of ``rank``; True when it just became a straggler."""
        if ratio is None:
            state.slow_run, state.fast_run = 0, state.fast_run + 1
            if state.period is None:
                state.ratios = []
            elif state.fast_run >= CONSECUTIVE:
                state.period = None
                state.ratios = []
            return False
        if state.slow_run == 0 and state.period is None:
            state.first_round, state.started = index, at
        state.slow_run, state.fast_run = state.slow_run + 1, 0
        state.ratios.append(ratio)
        if state.period is not None:
            state.period.update(
                last_round=index, ended=at, slowdown=round(statistics.median(state.ratios), 2)
            )
            return False
        if state.slow_run < CONSECUTIVE:
            return False
        worker = self.workers[rank]
        state.period = {
            "rank": rank,
            "host": worker.host,
            "node_id": worker.node_id,
            "gpu_ids": list(worker.gpu_ids),
            "slowdown": round(statistics.median(state.ratios), 2),
            "first_round": state.first_round,
            "last_round": index,
            "started": state.started,
            "ended": at,
            "attempt": self.attempt,
        }
        self.periods.append(state.period)
        return True

    def straggling(self) -> dict[int, float]:
        """``{rank: slowdown}`` of the ranks flagged now (for the progress view)."""
        return {
            rank: state.period["slowdown"]
            for rank, state in enumerate(self._states)
            if state.period is not None
        }


class StragglerWatch:
    """The run's stragglers across its attempts: a detector per attempt (its group), every
    period in ``periods`` (for ``Result.stragglers`` and run.json). ``enabled=False``
    (``PHALANX_STRAGGLER_DETECTION=0``) watches nothing."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.periods: list[dict[str, Any]] = []
        self._detector: StragglerDetector | None = None

    def on_attempt(self, workers: list[WorkerMetadata], attempt: int) -> None:
        """A group started; ``workers`` in rank order."""
        self._detector = StragglerDetector(workers, attempt) if self.enabled else None

    def on_round(self, round_: Round) -> None:
        if self._detector is None:
            return
        for period in self._detector.observe(round_):
            self.periods.append(period)
            logger.warning(describe(period))

    def straggling(self) -> dict[int, float]:
        return self._detector.straggling() if self._detector is not None else {}


def describe(period: dict[str, Any]) -> str:
    """The WARNING for a rank just flagged."""
    gpus = period["gpu_ids"]
    where = f"host {period['host']}, node {period['node_id']}" + (
        f", GPU {', '.join(map(str, gpus))}" if gpus else ""
    )
    return (
        f"Straggler: rank {period['rank']} ({where}) took {period['slowdown']:.2f}x the median "
        f"round time of the other ranks for {CONSECUTIVE} rounds in a row (rounds "
        f"{period['first_round']}-{period['last_round']}). A slow rank slows every rank that "
        "waits for it in a collective.\nHINT: check that node (a throttled or failing GPU, a "
        "noisy neighbour, an uneven data shard); PHALANX_STRAGGLER_DETECTION=0 silences this "
        "check."
    )
