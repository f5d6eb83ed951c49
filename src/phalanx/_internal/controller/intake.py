"""What the controller does with an attempt's events, and with the rounds they complete.

Each report goes into its round (and the metrics history, the goodput clock, the watchdog);
exits and preemptions go to the attempt. A round every rank reported is compared across the
replicas (``agreement``), committed (``commit``: history, checkpoint, data positions), told to the
callbacks and shown in the progress view; a round whose replicas differ fails the attempt and
never commits, nor does any later one.
"""

from __future__ import annotations

from phalanx._internal.controller.agreement import ReplicaAgreement
from phalanx._internal.controller.attempt import Attempt
from phalanx._internal.controller.commit import RoundCommitter
from phalanx._internal.controller.events import drain, round_report
from phalanx._internal.controller.goodput import GoodputClock
from phalanx._internal.controller.hooks import notify
from phalanx._internal.controller.progress import RunWatcher
from phalanx._internal.controller.report_steps import ReportSteps
from phalanx._internal.controller.rounds import Round
from phalanx._internal.controller.stragglers import StragglerWatch
from phalanx._internal.engines import messages
from phalanx._internal.storage.history import MetricsHistory
from phalanx.callbacks import Callback, TrainRunContext


class EventIntake:
    """Takes the events of the current attempt; ``last_metrics``: the last committed round's
    (a resumed run starts with the metrics it ended with: a finished run re-run returns them)."""

    def __init__(
        self,
        commits: RoundCommitter,
        history: MetricsHistory,
        goodput: GoodputClock,
        agreement: ReplicaAgreement,
        stragglers: StragglerWatch,
        watcher: RunWatcher,
        callbacks: list[Callback],
        run_context: TrainRunContext,
        preemption_grace_s: float,
    ) -> None:
        self.commits = commits
        self.history = history
        self.goodput = goodput
        self.agreement = agreement
        self.stragglers = stragglers
        self.watcher = watcher
        self.callbacks = callbacks
        self.run_context = run_context
        self.report_steps = ReportSteps(history, callbacks)
        self.preemption_grace_s = preemption_grace_s
        self.last_metrics = history.last_metrics()

    def take(
        self, attempt: Attempt, events: list[tuple[int, messages.Event]], finished: set[int]
    ) -> None:
        """Record the events, then commit every round they completed."""
        for index, message in events:
            self.on_event(attempt, attempt.group.rank_of(index), message)
        self.commit_complete_rounds(attempt, finished)
        self.commits.record_awaited_rounds()

    def on_event(self, attempt: Attempt, rank: int, event: messages.Event) -> None:
        match event:
            case messages.Report(round=index, metrics=metrics, validation=validation):
                if not any(attempt.rounds.counts):  # the shards of the round the ranks resumed
                    self.commits.spec.dataset_positions.first_report(index)
                attempt.rounds.add(rank, round_report(event))
                self.goodput.report(rank, event.time, event.started)
                self.history.add_rank_report(rank, index, metrics)  # every report, complete or not
                if validation:
                    self.commits.validation_requests.setdefault(index, validation)
                attempt.watchdog.progress(rank)
            case messages.CallDone():
                attempt.watchdog.progress(rank)
            case messages.Exited(returncode=returncode):
                attempt.on_exit(rank, returncode)
            case messages.Preempting():
                attempt.on_preemption(rank, self.preemption_grace_s)
            case messages.Poll(round=awaited):
                if awaited is not None:  # else it woke the poll loop: that was all it was for
                    self.commits.awaited_rounds.add(awaited)
            case _:  # a bug (an engine that queues something else): never ignore it silently
                raise TypeError(f"not an engine event: {event!r}")

    def drain_failed_attempt(self, attempt: Attempt) -> None:
        """Reports that arrived while the group was torn down: record them, and commit every
        round that is complete (a round every rank reported is never lost)."""
        for index, event in drain(attempt.group.events, None):
            match event:
                case messages.Report():
                    self.on_event(attempt, attempt.group.rank_of(index), event)
                case _:
                    pass  # the attempt failed already: exits and preemptions change nothing
        if attempt.train_futures:
            self.commit_complete_rounds(attempt, attempt.finished_ranks())
        self.history.flush()

    def commit_complete_rounds(self, attempt: Attempt, finished: set[int]) -> None:
        for round_ in attempt.rounds.pop_complete(attempt.returned_ranks(finished)):
            diverged = self.agreement.check(round_)
            if diverged is not None:  # replicas differ: this round and later ones never commit
                attempt.failures.update(diverged)
                continue
            self._commit_round(attempt, round_)

    def _commit_round(self, attempt: Attempt, round_: Round) -> None:
        dir_name = self.commits.check(round_)  # a config error commits nothing
        self.last_metrics = round_.run_metrics
        checkpoint = self.commits.commit(round_, dir_name, attempt.index)
        notify(self.callbacks, "after_report", self.run_context, round_.metrics, checkpoint)
        info = self.report_steps.info(round_, attempt.index, checkpoint)
        notify(self.callbacks, "on_report", self.run_context, info)
        self.stragglers.on_round(round_)
        self.watcher.straggling = self.stragglers.straggling()
        self.watcher.on_report(info)
