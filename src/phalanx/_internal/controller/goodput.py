"""Goodput: where a run's wall time went, from events the controller already has.

Every second from ``fit()`` to its end lands in exactly one part, so the parts add up to the
wall time::

    fit()                 attempt 1                          attempt 2
    |-- start-up --|-- training ----------x-- failures --|-- failures --|-- training --|- other -|
                   ^ every rank's         ^ the last     ^ failed       ^ every rank's ^ every
                     first line             committed      (detected,     first line     rank
                                            checkpoint     torn down)     again          returned

- **start-up**: ``fit()`` until every rank's training function started (a rank's start comes
  with its first report; a rank that never reports counts from when its call was sent);
- **failures**: after a failure, the work rolled back (from the last checkpoint committed in
  the attempt, or its start, to the failure), detection, teardown, the wait before the retry
  and the restart up to every rank's first line again;
- inside training: **checkpoints** (per round, the longest a rank was blocked in ``report()``
  saving its checkpoint or waiting for its previous ASYNC upload, or in ``save_state``),
  **data** (per round, the longest a rank waited for batches: phalanx's datasets, Ray Data's;
  in a round with a straggler, the median of the other ranks' waits), **stragglers** (per
  round with a slow rank, as ``controller/anatomy.py`` tells it: how much longer the slowest
  rank's own time was than the median of the others', whatever its cause, all of which the
  other ranks spent waiting for it) and **productive**, the rest;
- **other**: the driver after the last rank returned (teardown, validations, the end of the run),
  and after an elastic resize the work since the last checkpoint.

Ranks are taken to step together, as collectives (DDP's all-reduce) and Ray's ``report()``
barrier make them; when the three waits exceed their span they are scaled to fit it.
All times are ``time.time()`` of the driver and of the workers (one clock per host).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from phalanx._foundation.fs.access import is_local
from phalanx._foundation.goodput_parts import PARTS, Goodput
from phalanx._internal.controller.anatomy import PARTS as STEP_PARTS
from phalanx._internal.controller.anatomy import RankParts, RoundAnatomy, slow_ranks
from phalanx._internal.controller.rounds import Round

__all__ = ["AttemptClock", "GoodputClock", "RunCounts", "tree_bytes"]

logger = logging.getLogger(__name__)

_WAITS = ("checkpoints", "data", "stragglers")  # inside training, besides productive


@dataclass
class AttemptClock:
    """One attempt's times and its rounds' waits."""

    begin: float  # the end of the previous attempt (or fit())
    after_failure: bool  # its start-up is lost to the previous attempt's failure
    world_size: int
    sent: float | None = None  # when the training calls were sent (a rank that never reports)
    started: dict[int, float] = field(default_factory=dict)  # rank -> its first line
    waits: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_WAITS, 0.0))
    kept: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_WAITS, 0.0))
    kept_at: float | None = None  # when the attempt's last checkpoint was committed
    # its rounds' parts per rank, checkpoint rounds too (their checkpoint time set apart)
    anatomy: RoundAnatomy = field(default_factory=lambda: RoundAnatomy(skip_checkpoints=False))
    end: float | None = None
    outcome: str | None = None  # "finished", "failed", "resized", "interrupted"

    def training_from(self, now: float) -> float:
        """When every rank was training (its first line), clamped to the attempt."""
        end = self.end if self.end is not None else now
        if len(self.started) >= self.world_size:
            at = max(self.started.values())
        else:
            at = max([*self.started.values(), self.sent if self.sent is not None else end])
        return min(max(at, self.begin), end)

    def parts(self, now: float) -> dict[str, float]:
        """This attempt's seconds per part, ``now`` closing it while it runs."""
        parts = dict.fromkeys(PARTS, 0.0)
        end = self.end if self.end is not None else now
        train_from = self.training_from(now)
        parts["failures" if self.after_failure else "startup"] += train_from - self.begin
        if self.outcome in ("failed", "resized"):  # the work since the last checkpoint is redone
            kept_until = min(max(self.kept_at or train_from, train_from), end)
            waits = self.kept
            parts["failures" if self.outcome == "failed" else "other"] += end - kept_until
        else:
            kept_until, waits = end, self.waits
        _split_training(parts, kept_until - train_from, waits)
        return parts


def _split_training(parts: dict[str, float], span: float, waits: dict[str, float]) -> None:
    span = max(span, 0.0)
    total = sum(waits.values())
    scale = 1.0 if total <= span or total == 0 else span / total
    for name, value in waits.items():
        parts[name] += value * scale
    parts["productive"] += span - total * scale


@dataclass
class RunCounts:
    """What the metrics endpoint exports besides the goodput parts (read when scraped)."""

    reports: int = 0
    rounds: int = 0
    commits: int = 0
    commit_s: float = 0.0  # committing checkpoints, in all
    bytes_written: int = 0  # the committed checkpoints' bytes, in all
    last_report: dict[int, float] = field(default_factory=dict)  # rank -> its last report
    step_s: dict[int, float] = field(default_factory=dict)  # rank -> between its last 2 reports
    last_to_report: dict[int, int] = field(default_factory=dict)  # rank -> rounds it was last
    # rank -> its last eligible round's step anatomy, seconds per step (or per round) by part
    step_parts: dict[int, dict[str, float]] = field(default_factory=dict)


class GoodputClock:
    """Collects the controller's events into a :class:`Goodput`; cheap enough for every round.

    ``now`` is the driver's clock (``time.time``), settable in tests.
    """

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self.now = now
        self.began = now()
        self.attempts: list[AttemptClock] = []
        self.ended: float | None = None
        self.counts = RunCounts()

    @property
    def current(self) -> AttemptClock | None:
        return self.attempts[-1] if self.attempts else None

    def attempt_started(self, world_size: int) -> None:
        last = self.current
        begin = last.end if last is not None and last.end is not None else self.began
        after_failure = last is not None and last.outcome == "failed"
        self.attempts.append(AttemptClock(begin, after_failure, world_size))

    def resized(self, world_size: int) -> None:
        if self.current is not None:
            self.current.world_size = world_size

    def training_sent(self) -> None:
        if self.current is not None:
            self.current.sent = self.now()

    def report(self, rank: int, at: float, started: float | None) -> None:
        """A rank's report made at ``at`` (its clock); ``started``: its first line, if sent."""
        self.counts.reports += 1
        previous = self.counts.last_report.get(rank)
        if previous is not None:
            self.counts.step_s[rank] = at - previous
        self.counts.last_report[rank] = at
        if started is not None and self.current is not None:
            self.current.started.setdefault(rank, started)

    def round_committed(self, round_: Round, commit_s: float | None) -> None:
        """A round committed; ``commit_s``: how long committing its checkpoint took (None:
        the round had none). One pass over the reports: this runs for every round."""
        self.counts.rounds += 1
        attempt = self.current
        if attempt is None:
            return
        checkpoint_s = data_s = 0.0
        first = last = -1.0
        slowest = -1
        for rank, report in enumerate(round_.reports):
            if report is None:
                continue
            checkpoint_s = max(checkpoint_s, report.checkpoint_s)
            data_s = max(data_s, report.data_wait_s)
            if first < 0 or report.time < first:
                first = report.time
            if report.time > last:
                last, slowest = report.time, rank
        if slowest < 0:
            return
        if last > first:
            self.counts.last_to_report[slowest] = self.counts.last_to_report.get(slowest, 0) + 1
        waits = attempt.waits
        waits["checkpoints"] += checkpoint_s
        parts = attempt.anatomy.parts(round_)
        if parts is not None and len(parts) > 1:
            self._note_parts(parts)
            straggled, data_s = _straggled(parts, data_s)
            waits["stragglers"] += straggled
        waits["data"] += data_s
        if commit_s is not None:
            self.counts.commits += 1
            self.counts.commit_s += commit_s
            attempt.kept = dict(waits)
            attempt.kept_at = self.now()

    def _note_parts(self, parts: list[RankParts]) -> None:
        for rank, rank_parts in enumerate(parts):
            per = max(rank_parts.steps, 1)
            self.counts.step_parts[rank] = {n: rank_parts.part(n) / per for n in STEP_PARTS}

    def checkpoint_committed(self, filesystem: object, path: str) -> None:
        """The checkpoint at ``path`` was committed: count its bytes (after the commit, so
        the commit latency does not include the count)."""
        self.counts.bytes_written += tree_bytes(filesystem, path)

    def attempt_ended(self, outcome: str) -> None:
        attempt = self.current
        if attempt is not None and attempt.end is None:
            attempt.end = self.now()
            attempt.outcome = outcome
            self.counts.last_report.clear()  # a new attempt's first step is not a step time

    @property
    def failures(self) -> int:
        return sum(1 for a in self.attempts if a.outcome == "failed")

    def finish(self) -> Goodput:
        self.ended = self.now()
        return self.snapshot()

    def snapshot(self) -> Goodput:
        """The breakdown so far (the running attempt counted up to now)."""
        now = self.ended if self.ended is not None else self.now()
        per_attempt = [a.parts(now) for a in self.attempts]
        total = dict.fromkeys(PARTS, 0.0)
        for parts in per_attempt:
            for name, value in parts.items():
                total[name] += value
        last_end = self.current.end if self.current is not None else None
        tail = max(0.0, now - (last_end if last_end is not None else now))
        total["other"] += tail
        if per_attempt:
            per_attempt[-1]["other"] += tail
        else:
            total["startup"] += now - self.began
        return Goodput(now - self.began, total, tuple(per_attempt), self.counts.bytes_written)


def _straggled(parts: list[RankParts], data_s: float) -> tuple[float, float]:
    """A round's straggler seconds (the slowest slow rank's excess over the others) and its
    data seconds: with a straggler, the other ranks' median wait (the straggler's own extra
    wait for data is in its excess: counted once); else the longest wait."""
    slow = slow_ranks(parts)
    if not slow:
        return 0.0, data_s
    rank = max(slow, key=lambda r: slow[r].excess_s)
    others = [p.data for r, p in enumerate(parts) if r != rank]
    others.sort()
    middle = len(others) // 2
    median = others[middle] if len(others) % 2 else (others[middle - 1] + others[middle]) / 2
    return slow[rank].excess_s, median


def tree_bytes(filesystem: Any, path: str) -> int:
    """The bytes of the files under ``path``: a walk of a local tree (its entries are in the
    page cache: the commit just fsynced them), one listing on an object store. 0 when it cannot
    be read: the count is a metric, never a reason to fail the run."""
    try:
        if is_local(filesystem):
            total = 0
            for root, _dirs, files in os.walk(path):
                for name in files:
                    total += os.lstat(os.path.join(root, name)).st_size
            return total
        return int(filesystem.du(path, total=True))
    except (OSError, ValueError, TypeError):
        logger.debug("Counting the bytes of checkpoint %r failed", path, exc_info=True)
        return 0
