"""Report rounds: the k-th report of every rank forms round k."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Report:
    index: int
    metrics: dict[str, Any]
    checkpoint_dir_name: str | None
    time: float


@dataclass(frozen=True)
class Round:
    index: int
    reports: list[Report]  # indexed by rank

    @property
    def metrics(self) -> list[dict[str, Any]]:
        return [r.metrics for r in self.reports]

    @property
    def checkpoint_dir_names(self) -> set[str]:
        return {r.checkpoint_dir_name for r in self.reports if r.checkpoint_dir_name}


class ReportRounds:
    """Collects reports per rank and hands out rounds once every rank has reported."""

    def __init__(self, world_size: int, start_round: int) -> None:
        self._pending: list[deque[Report]] = [deque() for _ in range(world_size)]
        self.counts = [0] * world_size
        self.start_round = start_round
        self.next_round = start_round

    def add(self, rank: int, report: Report) -> None:
        self._pending[rank].append(report)
        self.counts[rank] += 1

    def pop_complete(self) -> list[Round]:
        rounds = []
        while all(self._pending):
            reports = [q.popleft() for q in self._pending]
            rounds.append(Round(self.next_round, reports))
            self.next_round += 1
        return rounds

    def mismatch(self, finished: set[int]) -> dict[int, int] | None:
        """Report counts per rank if ranks that finished can no longer match the others."""
        if not finished:
            return None
        done_counts = {self.counts[r] for r in finished}
        highest = max(self.counts)
        if len(done_counts) > 1 or any(c < highest for c in done_counts):
            return dict(enumerate(self.counts))
        if len(finished) == len(self.counts) and len(set(self.counts)) > 1:
            return dict(enumerate(self.counts))
        return None
