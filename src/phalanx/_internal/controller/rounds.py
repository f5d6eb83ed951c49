"""Report rounds: the k-th report of every rank forms round k.

A round is complete once every rank has reported it, except ranks whose training function
returned normally before reaching it: a rank that returned contributes nothing to later rounds,
so ``if rank == 0: report(...)`` commits every round (once the other ranks have returned). A rank
that failed is not "returned": rounds it did not report never complete, exactly as Ray's
``report()`` barrier would never have released them.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass
from typing import Any

from phalanx._internal.worker.data_position import Snapshot

# A rank this many rounds ahead of a running rank that has reported nothing at all is the
# rank-0-only pattern (or a rank that lost its way): say so once.
LAG_WARNING_ROUNDS = 3


@dataclass(frozen=True)
class Report:
    index: int
    metrics: dict[str, Any]
    checkpoint_dir_name: str | None
    time: float
    checkpoint_class: str | None = None  # a Checkpoint subclass's name, None for Checkpoint
    checkpoint_s: float = 0.0  # report() blocked saving the checkpoint (goodput)
    data_wait_s: float = 0.0  # waited for batches since the rank's previous report (goodput)
    data_position: dict[str, Any] | None = None  # the rank's data streams after this report
    collective_s: float = 0.0  # waited in collectives since the previous report (anatomy)
    steps: int = 0  # training steps since the previous report (0: not counted)
    replica: tuple[str, int, int] | None = None  # (group, checksum, optimizer steps) to compare


@dataclass(frozen=True)
class Round:
    index: int
    reports: list[Report | None]  # indexed by rank; None: the rank had returned before
    # Each rank's data position at this round (its last known one), for the checkpoint
    positions: list[dict[str, Any] | None] | None = None

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """Each rank's metrics (``{}`` for a rank that had returned), for callbacks."""
        return [r.metrics if r is not None else {} for r in self.reports]

    @property
    def run_metrics(self) -> dict[str, Any]:
        """The run's metrics for this round: rank 0's, or the lowest rank's that reported."""
        return next(r.metrics for r in self.reports if r is not None)

    @property
    def checkpoint_dir_names(self) -> set[str]:
        return {r.checkpoint_dir_name for r in self.reports if r and r.checkpoint_dir_name}

    @property
    def checkpoint_class(self) -> str | None:
        """The class of the round's checkpoint: the lowest rank's that reported one."""
        return next((r.checkpoint_class for r in self.reports if r and r.checkpoint_class), None)


class ReportRounds:
    """Collects reports per rank and hands out rounds once they are complete.

    ``previous``: the failed attempt's rounds, when this attempt follows one. Its ranks may
    continue a later round than the one after the checkpoint (they recovered to the failed step
    from the survivors' state, ``phalanx.torch._peer``): this attempt's rounds are numbered from
    their first report's, and the failed attempt's rounds before it that only a lost rank had
    not reported are handed out first, with the survivors' reports (every rank completed their
    steps: the ranks resumed after them), without their checkpoint (a part is missing).
    """

    def __init__(
        self, world_size: int, start_round: int, previous: ReportRounds | None = None
    ) -> None:
        self._pending: list[deque[Report]] = [deque() for _ in range(world_size)]
        self.counts = [0] * world_size
        self.start_round = start_round
        self.next_round = start_round
        # Each rank's data position as of the last round handed out: a rank that reported none
        # in a round (or had returned) keeps its last known one
        self.positions: list[dict[str, Any] | None] = [None] * world_size
        self._previous = previous if previous and len(previous._pending) == world_size else None
        self._carried: list[Round] = []  # the failed attempt's rounds, handed out first

    def add(self, rank: int, report: Report) -> None:
        if not any(self.counts) and report.index > self.start_round:
            self._continue_at(report.index)
        self._previous = None  # only the first report tells where the ranks continue
        self._pending[rank].append(report)
        self.counts[rank] += 1

    def pop_complete(self, returned: set[int]) -> list[Round]:
        """Complete rounds, oldest first. ``returned``: ranks whose training call returned
        normally (every report of theirs is already added)."""
        rounds, self._carried = self._carried, []
        while True:
            if any(not q and rank not in returned for rank, q in enumerate(self._pending)):
                return rounds
            if not any(self._pending):
                return rounds
            reports = [q.popleft() if q else None for q in self._pending]
            for rank, report in enumerate(reports):
                if report is not None and report.data_position is not None:
                    self.positions[rank] = report.data_position
            rounds.append(Round(self.next_round, reports, list(self.positions)))
            self.next_round += 1

    def _continue_at(self, index: int) -> None:
        """The ranks' first report is round ``index``: number from it; the failed attempt's
        rounds between its last complete one and ``index`` go out first (see the class)."""
        previous = self._previous
        if previous is not None:
            self.positions = list(previous.positions)
            for carried in range(previous.next_round, index):
                reports = [_survivors_report(q, carried) for q in previous._pending]
                if any(r is not None for r in reports):
                    for rank, report in enumerate(reports):
                        if report is not None and report.data_position is not None:
                            self.positions[rank] = report.data_position
                    self._carried.append(Round(carried, reports, list(self.positions)))
        self.start_round = self.next_round = index

    def previous_complete(self) -> tuple[int, list[Snapshot | None]] | None:
        """The failed attempt's last complete round (every rank completed its step) and each
        rank's data position at it; None: no failed attempt of this size, or none complete."""
        previous = self._previous
        if previous is None or previous.next_round == previous.start_round:
            return None
        return previous.next_round - 1, list(previous.positions)

    def reported_through(self, rank: int) -> int:
        """How many rounds of this attempt ``rank`` has reported."""
        return self.counts[rank]

    def silent_ranks_warning(self, running: set[int]) -> str | None:
        """A warning when the lead rank is LAG_WARNING_ROUNDS ahead of running ranks that have
        reported nothing yet (the rank-0-only pattern), else None.

        The lead rank is the lowest one still running or that has reported (rank 0, whose
        metrics the run reports): only it leads this pattern. A running rank 0 that has not
        reported yet while others have is behind, not silent: its first report is the slow one
        (a big checkpoint being written) while ranks that report metrics only, and share no
        collective with it, run ahead. Naming it would tell a user who does call report() on
        every rank to do so.
        """
        leader = next((r for r, n in enumerate(self.counts) if n or r in running), None)
        if leader is None:
            return None
        silent = sorted(r for r in running if self.counts[r] == 0)
        if not silent or self.counts[leader] < LAG_WARNING_ROUNDS:
            return None
        return (
            f"Rank {leader} has reported {self.counts[leader]} rounds but rank(s) "
            f"{', '.join(map(str, silent))} have not reported yet. A round (its metrics and "
            "checkpoint) is committed only once every rank still running has reported it, or has "
            "returned; until then its checkpoint waits in staging and is lost if the attempt "
            "fails.\nHINT: call phalanx.report() on every rank, passing the checkpoint from rank 0 "
            "only: report(metrics, checkpoint=ckpt if rank == 0 else None)."
        )


def _survivors_report(queue: deque[Report], index: int) -> Report | None:
    """A rank's report of round ``index`` in a failed attempt's queue, as a carried round keeps
    it: its metrics, time, position and replica checksum; not its checkpoint (the round never
    committed, its staged parts are gone) nor its waits (counted with the failed attempt)."""
    report = next((r for r in queue if r.index == index), None)
    if report is None:
        return None
    return dataclasses.replace(
        report,
        checkpoint_dir_name=None,
        checkpoint_class=None,
        checkpoint_s=0.0,
        data_wait_s=0.0,
        collective_s=0.0,
        steps=0,
    )
