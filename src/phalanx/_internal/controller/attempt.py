"""One attempt's live state: its workers, their training calls, reports, failures, preemption."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from phalanx._internal.controller.rounds import ReportRounds
from phalanx._internal.controller.watchdog import ProgressWatchdog
from phalanx._internal.worker_group.group import WorkerGroup
from phalanx.errors import WorkerFailure

logger = logging.getLogger(__name__)

# The exit status reaches the driver on the fork server's socket and can overtake the last
# messages still in the worker's own socket; an exit becomes a failure after this long.
EXIT_DRAIN_S = 0.2
# A rank whose call failed as its process died: how long its exit code is waited for (one bound
# for every rank failing at once).
EXIT_STATUS_WAIT_S = 0.5

# Ray's report() is a barrier: a rank that fails right after its report of round k does so
# only once every rank has reported round k. phalanx has no barrier, so after a failure the
# ranks still running get this long to catch up with the round the failed rank(s) reached
# (a rank writing that round's checkpoint) before the group is torn down.
FAILURE_REPORT_GRACE_S = 5.0


@dataclass
class Attempt:
    number: int  # 1-based
    group: WorkerGroup
    rounds: ReportRounds
    watchdog: ProgressWatchdog
    train_futures: list[Future[object]] = field(default_factory=list)
    failures: dict[int, WorkerFailure] = field(default_factory=dict)
    exited: dict[int, tuple[float, int]] = field(default_factory=dict)
    preempted_ranks: set[int] = field(default_factory=set)
    preemption_deadline: float | None = None  # time.monotonic()
    failure_grace_deadline: float | None = None  # time.monotonic()
    started: float = field(default_factory=time.monotonic)  # elastic growth is checked from here

    @property
    def index(self) -> int:
        """0-based, as ``TrainContext.get_attempt_index()`` and checkpoints count attempts."""
        return self.number - 1

    def returned_ranks(self, finished: set[int]) -> set[int]:
        """Ranks (among ``finished``) whose training function returned normally."""
        return {r for r in finished if self.train_futures[r].exception() is None}

    def finished_ranks(self) -> set[int]:
        return {rank for rank, f in enumerate(self.train_futures) if f.done()}

    def on_exit(self, rank: int, returncode: int) -> None:
        if not self.train_futures[rank].done():
            self.exited[rank] = (time.monotonic(), returncode)

    def record_failures(self, finished: set[int]) -> None:
        """Failures of ranks whose call resolved before the last drain, or that exited."""
        now = time.monotonic()
        for rank, (at, code) in self.exited.items():
            if rank not in finished and rank not in self.failures and now - at > EXIT_DRAIN_S:
                self.failures[rank] = self.group.failure(rank, None, returncode=code)
        # one bound for all: ranks whose processes died together are not waited for in turn
        exit_deadline = now + EXIT_STATUS_WAIT_S
        for rank in finished:
            future = self.train_futures[rank]
            if rank in self.failures or future.exception() is None:
                continue
            exc = future.exception()
            returncode = None
            if type(exc).__name__ != "RemoteCallError":  # the process died: learn how
                returncode = self._wait_exit_status(rank, exit_deadline)
            self.failures[rank] = self.group.failure(rank, exc, returncode)
        if self.preemption_deadline is not None and now > self.preemption_deadline:
            for rank in set(range(len(self.train_futures))) - finished - set(self.failures):
                self.failures[rank] = WorkerFailure(
                    rank,
                    "preempted",
                    "PreemptionTimeout",
                    "did not reach the stop round before the preemption deadline",
                    pid=self.group.workers[rank].metadata.pid,
                    time=time.time(),
                )

    def _wait_exit_status(self, rank: int, deadline: float) -> int | None:
        handle = self.group.workers[rank].handle
        while handle.is_alive() and time.monotonic() < deadline:
            time.sleep(0.002)
        return getattr(handle, "returncode", None)

    def only_preempted(self) -> bool:
        return bool(self.failures) and all(f.kind == "preempted" for f in self.failures.values())

    def waiting_for_stop_round(self, finished: set[int]) -> bool:
        """After a preemption notice, ranks stop one by one at the stop round; wait for all of
        them (their last round may carry the checkpoint), unless something else failed."""
        return (
            self.preemption_deadline is not None
            and self.only_preempted()
            and len(finished | set(self.failures)) < len(self.train_futures)
        )

    def awaiting_survivors(self, finished: set[int]) -> bool:
        """After a failure, whether the ranks still running are catching up with the last round
        every failed rank reported (bounded by FAILURE_REPORT_GRACE_S). A hang is declared only
        when no rank failed, and fails the attempt at once: hung ranks will not catch up."""
        if not self.failures or self.only_preempted():
            return False
        target = min(self.rounds.reported_through(r) for r in self.failures)
        behind = [
            r
            for r in range(len(self.train_futures))
            if r not in finished
            and r not in self.failures
            and self.rounds.reported_through(r) < target
        ]
        if not behind:
            return False
        now = time.monotonic()
        if self.failure_grace_deadline is None:
            self.failure_grace_deadline = now + FAILURE_REPORT_GRACE_S
        return now < self.failure_grace_deadline

    def on_preemption(self, rank: int, grace_s: float) -> None:
        """A worker got SIGTERM: every rank stops after the same round, a little ahead of the
        furthest rank, so a checkpoint passed in that round is committed."""
        self.preempted_ranks.add(rank)
        if self.preemption_deadline is not None:
            return
        stop_round = self.rounds.start_round + max(self.rounds.counts) + 1
        self.preemption_deadline = time.monotonic() + grace_s
        logger.warning(
            "Rank %d was preempted (SIGTERM); every rank stops after round %d, then the run "
            "restarts from the latest checkpoint.",
            rank,
            stop_round,
        )
        self.group.notify_preemption(
            {
                "stop_round": stop_round,
                "preempted_ranks": sorted(self.preempted_ranks),
                "deadline": time.time() + grace_s,
            }
        )

    def poll_timeout(self, default_s: float) -> float:
        if self.exited:
            return EXIT_DRAIN_S / 4
        if self.failure_grace_deadline is not None:
            return max(0.0, min(default_s, self.failure_grace_deadline - time.monotonic()))
        return default_s
