"""The run's state machine: start an attempt, poll it, commit rounds, retry or finish.

Each state has one method that does its work and returns the next state (``step``)::

    START -> RUNNING -> FINISHED
       |       |
       v       v
      Failure(error, preempted) -> START    (the failure budget allows a retry)
                                -> ERRORED  (it does not)

Starting an attempt is in ``launch``, reading the engine's events in ``events``, what each event
does (and committing the rounds they complete) in ``intake``, what a complete round writes
(history, checkpoint, data positions) in ``commit``, the failure budget's
decision in ``retry`` (over ``failure_policy``), the elastic growth check in ``growth``, the end
of the run in ``outcome``; ``tests/controller/`` steps this machine over a scripted worker group.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from phalanx._foundation import env
from phalanx._foundation.goodput_parts import Goodput
from phalanx._internal.controller.agreement import ReplicaAgreement
from phalanx._internal.controller.attempt import Attempt
from phalanx._internal.controller.commit import RoundCommitter
from phalanx._internal.controller.events import drain
from phalanx._internal.controller.goodput import GoodputClock
from phalanx._internal.controller.growth import GrowthCheck
from phalanx._internal.controller.hooks import notify, notify_goodput
from phalanx._internal.controller.intake import EventIntake
from phalanx._internal.controller.launch import (
    group_spec,
    peer_record,
    prepare_workers,
    session_specs,
    start_training,
)
from phalanx._internal.controller.metrics_endpoint import MetricsEndpoint, start_endpoint
from phalanx._internal.controller.outcome import (
    close_storage,
    end_attempt,
    failure_error,
    quietly,
    record_end,
    root_exception,
    run_result,
    save_error,
)
from phalanx._internal.controller.progress import RunWatcher
from phalanx._internal.controller.retry import Retries
from phalanx._internal.controller.rounds import ReportRounds
from phalanx._internal.controller.spec import RunSpec, run_context
from phalanx._internal.controller.state import FINAL_STATES, Failure, State, Step
from phalanx._internal.controller.stragglers import StragglerWatch
from phalanx._internal.controller.validation import Validations, resume_unfinished
from phalanx._internal.controller.watchdog import ProgressWatchdog, hang_error
from phalanx._internal.engines.base import Engine
from phalanx._internal.engines.rank_output import log_failures
from phalanx._internal.storage.checkpoint_manager import CheckpointManager
from phalanx._internal.storage.history import MetricsHistory
from phalanx._internal.storage.run_storage import RunStorage
from phalanx._internal.worker.profiling import write_workers
from phalanx._internal.worker.session import init_session
from phalanx._internal.worker_group.group import WorkerGroup
from phalanx.callbacks import Callback
from phalanx.errors import TrainingFailedError, WorkerGroupError, WorkerStartupError
from phalanx.result import Result

logger = logging.getLogger(__name__)

POLL_TIMEOUT_S = 0.5


class Controller:
    """Runs one ``fit()``: ``run()`` is ``begin()``, ``step()`` until a final state, ``close()``
    and ``finish()``. Tests call those one at a time (``tests/controller/controller_stepper.py``);
    they also shorten ``poll_timeout_s`` and record the waits before retries via ``sleep``."""

    def __init__(
        self, spec: RunSpec, engine: Engine, storage: RunStorage, manager: CheckpointManager
    ) -> None:
        self.goodput = GoodputClock()  # the trainer sets .began to when fit() started
        self.record: dict[str, Any] | None = None  # run.json's: the goodput goes there at the end
        self.spec = spec
        self.engine = engine
        self.storage = storage
        self.manager = manager
        self.history = MetricsHistory(storage)
        self.failure_config = spec.run_config.failure_config
        self.retries = Retries(spec, storage, manager)
        self.backend = spec.backend_config.backend_cls()
        self.callbacks: list[Callback] = list(spec.run_config.callbacks)
        self.run_context = run_context(spec, storage)
        self.attempt: Attempt | None = None
        self.attempts = 0
        self.error: TrainingFailedError | None = None  # the error the run ends with (ERRORED)
        self._warned_silent = False
        self.return_value: object = None
        self.validations = Validations(spec.validation_config)
        self.watcher = RunWatcher(
            spec.run_name,
            max(1, spec.scaling_config.max_workers),
            spec.run_config.verbose,
            spec.total_rounds,
            self.goodput.snapshot,
        )
        self.commits = RoundCommitter(
            spec, storage, manager, self.history, self.goodput, self.validations, self.watcher
        )
        self.endpoint: MetricsEndpoint | None = None
        self.poll_timeout_s = POLL_TIMEOUT_S
        self.sleep: Callable[[float], None] = time.sleep  # the wait before a retry
        self.growth = GrowthCheck(spec.scaling_config, engine)
        self.stragglers = StragglerWatch(env.straggler_detection())
        self.agreement = ReplicaAgreement()  # replicas compared before a round commits
        self.intake = EventIntake(
            self.commits,
            self.history,
            self.goodput,
            self.agreement,
            self.stragglers,
            self.watcher,
            self.callbacks,
            self.run_context,
            self.failure_config.preemption_grace_s,
        )

    @property
    def last_metrics(self) -> dict[str, Any] | None:
        """The metrics of the last committed round (a resumed run: those it ended with)."""
        return self.intake.last_metrics

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> Result:
        self.begin()
        state: Step = State.START
        failed = True
        try:
            while state not in FINAL_STATES:
                state = self.step(state)
            failed = False
        except BaseException as exc:  # Ctrl-C, a callback, storage: stop every worker first
            self._teardown(graceful=False)
            self.goodput.attempt_ended("interrupted")
            quietly("record the end of the attempt", partial(end_attempt, self.manager, exc))
            if isinstance(exc, KeyboardInterrupt):
                logger.warning(self.retries.resume_hint())
            raise
        finally:
            self.close(failed)
        return self.finish(state)

    def begin(self) -> None:
        """Before the first attempt: callbacks, the progress view, unfinished validations."""
        self._notify("before_run", self.run_context)
        self.endpoint = start_endpoint(self.spec.run_name, self.goodput, self.stragglers)
        self.watcher.start(self.engine.name, self.storage.run_uri)
        resume_unfinished(self.validations, self.manager, self.storage)

    def step(self, state: Step) -> Step:
        """Do the work of ``state`` and return the next state."""
        match state:
            case State.START:
                return self._start_attempt()
            case State.RUNNING:
                return self._poll()
            case Failure():
                return self._handle_failure(state)
        raise ValueError(f"{state} is a final state: nothing to step")

    def close(self, failed: bool) -> None:
        """After the last step, whatever happened: the engine and the run's storage."""
        self.watcher.stop()
        if self.endpoint is not None:
            self.endpoint.close()
        self.engine.close()
        close_storage(self.history, self.storage, self.manager, quiet=failed)

    # -- START ----------------------------------------------------------------------------------

    def _start_attempt(self) -> Step:
        attempt = self._new_attempt()
        group = attempt.group
        try:
            group.start()
            if len(group) != group.spec.num_workers:  # elastic: fewer than max_workers placed
                self._resize_attempt(attempt, len(group))
            checkpoint = self.manager.latest_checkpoint or self.spec.resume_from_checkpoint
            record = self.commits.resume_record(checkpoint)
            peer = peer_record(self.spec, attempt.rounds)  # before the new attempt's shards
            specs = session_specs(
                self.spec,
                self.storage,
                group,
                checkpoint,
                self.manager.next_round,
                attempt.index,
                record,
                peer,
            )
            group.execute_per_rank(init_session, [(s,) for s in specs])
            prepare_workers(self.engine, group, self.spec, self.backend)
            ranked = sorted(group.workers, key=lambda w: w.world_rank)
            self.stragglers.on_attempt([w.metadata for w in ranked], attempt.number)
            self.agreement.on_attempt([w.metadata for w in ranked])
            write_workers(self.storage.local_path, attempt.number, [w.metadata for w in ranked])
        except WorkerGroupError as exc:
            attempt.failures = exc.worker_failures
            if isinstance(exc, WorkerStartupError):  # its message says why nothing started
                return Failure.of(exc)
            return Failure.of(failure_error(exc.worker_failures))
        self.engine.set_event_pump(self._pump_events)
        attempt.train_futures = start_training(self.engine, group, self.spec)
        self.goodput.training_sent()
        attempt.watchdog.start()
        return State.RUNNING

    def _new_attempt(self) -> Attempt:
        self.attempts += 1
        # Fencing: from now on, parts and commits of earlier attempts are refused
        self.storage.begin_attempt(self.attempts - 1)
        # The training function restarts from the latest checkpoint, so the rounds do too: the
        # retry's rows take the training_iteration of the rows they supersede. Set before the
        # snapshot is written: ranks read there which rounds of theirs are processed.
        self.manager.next_round = self.manager.resume_round()
        self.commits.awaited_rounds.clear()
        self.manager.begin_attempt()
        self.history.attempt = self.manager.attempts
        group = WorkerGroup(self.engine, group_spec(self.spec, self.storage, self.attempts - 1))
        n = group.spec.num_workers
        previous = self.attempt.rounds if self.attempt is not None else None  # see ReportRounds
        self.attempt = Attempt(
            self.attempts,
            group,
            ReportRounds(n, self.manager.next_round, previous),
            ProgressWatchdog(self.failure_config.hang_timeout_s, n),
        )
        self.watcher.on_attempt(self.attempt)
        self.goodput.attempt_started(n)
        return self.attempt

    def _resize_attempt(self, attempt: Attempt, size: int) -> None:
        """The attempt's round and progress bookkeeping for the group the engine started."""
        attempt.rounds = ReportRounds(size, self.manager.next_round)
        attempt.watchdog = ProgressWatchdog(self.failure_config.hang_timeout_s, size)
        self.watcher.num_workers = size
        self.goodput.resized(size)

    def _pump_events(self) -> None:
        """Handle reports as they are made, from inside report() (num_workers=0)."""
        attempt = self.attempt
        if attempt is None:
            return
        self.intake.take(attempt, drain(attempt.group.events, None), set())
        self.validations.collect(self.manager.update_validation)

    # -- RUNNING --------------------------------------------------------------------------------

    def _poll(self) -> Step:
        attempt = self.attempt
        assert attempt is not None
        events = drain(attempt.group.events, attempt.poll_timeout(self.poll_timeout_s))
        # A rank's reports are queued before its training call resolves: snapshot which calls
        # are done, then drain again, and every report of those ranks is in hand.
        finished = attempt.finished_ranks()
        events += drain(attempt.group.events, None)
        self.intake.take(attempt, events, finished)
        self._warn_silent_ranks(attempt, finished)
        self.validations.collect(self.manager.update_validation)
        self.history.maybe_flush()
        attempt.record_failures(finished)
        if attempt.waiting_for_stop_round(finished):
            return State.RUNNING
        if attempt.awaiting_survivors(finished):  # the round the failed rank reached
            return State.RUNNING
        if attempt.failures:
            return Failure.of(failure_error(attempt.failures))
        hung = attempt.watchdog.hung_ranks(finished)
        if hung:
            return self._declare_hang(attempt, hung)
        if not finished and self.growth.can_grow(attempt):
            return self._grow(attempt)
        if len(finished) == len(attempt.train_futures):
            self.return_value = attempt.train_futures[0].result()
            self.goodput.attempt_ended("finished")
            self._shutdown_backend()
            self._teardown(graceful=True)
            return State.FINISHED
        return State.RUNNING

    def _grow(self, attempt: Attempt) -> Step:
        """Restart the group larger from the latest checkpoint, as Ray Train does; not a
        failure, so it does not count against max_failures."""
        size = len(attempt.group)
        logger.warning(self.growth.grow_line(size))
        self._shutdown_backend()
        self._teardown(graceful=True)
        self.intake.drain_failed_attempt(attempt)  # complete rounds are committed, never lost
        self.goodput.attempt_ended("resized")
        self._report_goodput()
        self.commits.discard_uncommitted()
        self.manager.end_attempt("resized", f"grown from {size} workers")
        return State.START

    def _declare_hang(self, attempt: Attempt, hung: list[int]) -> Failure:
        stacks = attempt.group.collect_stacks()
        pids = {w.world_rank: w.metadata.pid for w in attempt.group.workers}
        error = hang_error(hung, stacks, attempt.watchdog.rule(), pids, attempt.watchdog.idle_s())
        attempt.failures = error.worker_failures
        return Failure.of(error)

    def _warn_silent_ranks(self, attempt: Attempt, finished: set[int]) -> None:
        """Once per run: rounds wait for ranks that have not reported at all (rank-0-only)."""
        running = set(range(len(attempt.train_futures))) - finished
        lag = attempt.rounds.silent_ranks_warning(running)
        if lag is None or self._warned_silent:
            return
        self._warned_silent = True
        logger.warning(lag)

    # -- FAILED ---------------------------------------------------------------------------------

    def _handle_failure(self, failure: Failure) -> Step:
        """Clean up the failed attempt, then let the failure budget decide: retry or give up."""
        attempt = self.attempt
        assert attempt is not None
        # A retry follows: the engine may keep the survivors for it (Ray's in-place recovery)
        self._teardown(graceful=False, reuse=self.retries.may_retry(failure))
        self.intake.drain_failed_attempt(attempt)  # before the staged parts are removed
        self.commits.discard_uncommitted()
        self.goodput.attempt_ended("failed")
        self._report_goodput()
        end_attempt(self.manager, failure.error)
        failed_ranks = getattr(failure.error, "worker_failures", {})
        log_failures(self.storage.local_log_dir(), attempt.number, failed_ranks)
        self._notify("after_exception", self.run_context, failure.exceptions())
        delay, line = self.retries.decide(attempt.number, failure)
        logger.warning(line)
        if delay is None:
            self.error = failure.error
            return State.ERRORED
        self.sleep(delay)  # Ctrl-C still stops the run while it waits
        return State.START

    # -- the end --------------------------------------------------------------------------------

    def _shutdown_backend(self) -> None:
        assert self.attempt is not None
        if self.engine.in_process:
            return
        try:
            self.backend.on_shutdown(self.attempt.group, self.spec.backend_config)
        except Exception:
            logger.exception("Backend.on_shutdown failed; the workers are stopped anyway.")

    def _teardown(self, graceful: bool, reuse: bool = False) -> None:
        attempt = self.attempt
        if attempt is not None and attempt.group.workers:
            attempt.group.shutdown(graceful=graceful, reuse=reuse)
            attempt.group.workers = []

    def finish(self, state: Step) -> Result:
        """The run's Result; raises its error (with the Result attached) when it ERRORED."""
        record_end(self.manager, self.validations, finished=state is State.FINISHED)
        error = self.error if state is State.ERRORED else None
        goodput = self.goodput.finish()
        result = run_result(
            self.manager,
            self.storage,
            self.last_metrics,
            error,
            self.return_value,
            self.stragglers.periods,
            goodput,
        )
        if self.record is not None:
            self.record["goodput"] = goodput.to_dict()  # run.json, once the run ends
        if state is State.FINISHED:  # else reported on failing
            self._report_goodput(goodput)
        if result.error is not None:
            save_error(self.storage, result.error)
        self.watcher.finish(result)
        self._notify("after_run", self.run_context, result)
        if isinstance(result.error, TrainingFailedError):
            result.error.result = result
            raise result.error from root_exception(result.error)
        return result

    def _notify(self, hook: str, *args: object) -> None:
        notify(self.callbacks, hook, *args)

    def _report_goodput(self, goodput: Goodput | None = None) -> None:
        """The goodput so far (``goodput``: the run's, once it ends) to the callbacks."""
        snapshot = self.goodput.snapshot() if goodput is None else goodput
        notify_goodput(self.callbacks, self.run_context, self.attempts, snapshot)
