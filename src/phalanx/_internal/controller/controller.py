"""The run's state machine: start an attempt, poll it, commit rounds, retry or finish.

Each state has one method that does its work and returns the next state::

    START -> RUNNING -> FINISHED
               |  ^
               v  |  (the failure budget allows a retry)
             FAILED -> ERRORED
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import Any

from phalanx._internal.controller.attempt import Attempt
from phalanx._internal.controller.failure_policy import FailureDecision, FailurePolicy, retry_line
from phalanx._internal.controller.interrupt import resume_hint
from phalanx._internal.controller.outcome import (
    failure_error,
    outcome_name,
    root_exception,
    save_error,
)
from phalanx._internal.controller.progress import RunWatcher
from phalanx._internal.controller.report_steps import ReportSteps
from phalanx._internal.controller.rounds import Report, ReportRounds, Round
from phalanx._internal.controller.spec import RunSpec
from phalanx._internal.controller.validation import Validations
from phalanx._internal.controller.watchdog import ProgressWatchdog, hang_error
from phalanx._internal.engines.base import Engine, WorkerGroupSpec
from phalanx._internal.storage.checkpoint_manager import CheckpointManager, TrackedCheckpoint
from phalanx._internal.storage.history import MetricsHistory
from phalanx._internal.storage.run_storage import RunStorage
from phalanx._internal.worker.session import SessionSpec, init_session, run_train_fn
from phalanx._internal.worker_group.group import WorkerGroup
from phalanx.callbacks import Callback, TrainRunContext
from phalanx.checkpoint import Checkpoint
from phalanx.context import TrainContext
from phalanx.errors import (
    ConfigError,
    ControllerError,
    StorageError,
    TrainingFailedError,
    WorkerGroupError,
    WorkerStartupError,
)
from phalanx.result import Result, attempt_errors

logger = logging.getLogger(__name__)

POLL_TIMEOUT_S = 0.5
Events = queue.Queue[tuple[int, tuple[Any, ...]]]


class State(enum.Enum):
    START = "start"
    RUNNING = "running"
    FAILED = "failed"
    FINISHED = "finished"
    ERRORED = "errored"


class Controller:
    def __init__(
        self, spec: RunSpec, engine: Engine, storage: RunStorage, manager: CheckpointManager
    ) -> None:
        self.spec = spec
        self.engine = engine
        self.storage = storage
        self.manager = manager
        self.history = MetricsHistory(storage)
        self.failure_config = spec.run_config.failure_config
        self.policy = FailurePolicy(self.failure_config)
        self.backend = spec.backend_config.backend_cls()
        self.callbacks: list[Callback] = list(spec.run_config.callbacks)
        self.run_context = TrainRunContext(
            spec.run_config,
            spec.train_loop_config,
            spec.scaling_config,
            spec.backend_config,
            storage.run_path,
            spec.run_name,
        )
        self.report_steps = ReportSteps(self.history, self.callbacks)
        self.attempt: Attempt | None = None
        self.attempts = 0
        self.error: BaseException | None = None
        # A resumed run starts with the metrics it ended with: a finished run re-run returns them
        self.last_metrics: dict[str, Any] | None = self.history.last_metrics()
        self._warned_silent = False
        self.return_value: Any = None
        self.validations = Validations(spec.validation_config)
        self._validation_requests: dict[int, Any] = {}  # round -> report(validation=...)
        self.watcher = RunWatcher(
            spec.run_name,
            max(1, spec.scaling_config.num_workers),
            spec.run_config.verbose,
            spec.total_rounds,
        )

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> Result:
        steps = {
            State.START: self._start_attempt,
            State.RUNNING: self._poll,
            State.FAILED: self._handle_failure,
        }
        self._notify("before_run", self.run_context)
        self.watcher.start(self.engine.name, self.storage.run_uri)
        self._resume_validations()
        state = State.START
        failed = True
        try:
            while state in steps:
                state = steps[state]()
            failed = False
        except BaseException as exc:  # Ctrl-C, a callback, storage: stop every worker first
            self._teardown(graceful=False)
            _quietly("record the end of the attempt", partial(self._end_attempt, exc))
            if isinstance(exc, KeyboardInterrupt):
                logger.warning(self._resume_hint())
            raise
        finally:
            self.watcher.stop()
            self.engine.close()
            self._close_storage(quiet=failed)
        return self._finish(state)

    def _close_storage(self, quiet: bool) -> None:
        """Flush the history, drop uncommitted parts, finish deletions. On the way out of a
        failure a broken storage is logged, so the error raised is the one that ended the run,
        and a checkpoint the failure cut off between its rename and its snapshot entry goes."""
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("write the metrics history", self.history.flush),
            ("remove uncommitted checkpoint parts", self.storage.remove_staging),
        ]
        if quiet:
            steps.append(("remove uncommitted checkpoints", self.manager.remove_orphans))
        steps.append(("finish deleting evicted checkpoints", self.manager.close))
        for action, step in steps:
            if quiet:
                _quietly(action, step)
            else:
                step()

    # -- START ----------------------------------------------------------------------------------

    def _start_attempt(self) -> State:
        self.attempts += 1
        self.manager.begin_attempt()
        self.history.attempt = self.manager.attempts
        # The training function restarts from the latest checkpoint, so the rounds do too: the
        # retry's rows take the training_iteration of the rows they supersede.
        self.manager.next_round = self.manager.resume_round()
        spec = self.spec
        n = max(1, spec.scaling_config.num_workers)  # 0: one worker in the driver's thread
        group = WorkerGroup(
            self.engine,
            WorkerGroupSpec(
                n,
                spec.scaling_config,
                spec.run_name,
                self.storage.local_log_dir(),
                start_timeout_s=spec.start_timeout_s,
                attempt=self.attempts - 1,
                preload_modules=spec.backend_config.preload_modules,
                storage=self.storage,
                env=dict((spec.run_config.worker_runtime_env or {}).get("env_vars") or {}),
                runtime_env=dict(spec.run_config.worker_runtime_env or {}),
            ),
        )
        attempt = Attempt(
            self.attempts,
            group,
            ReportRounds(n, self.manager.next_round),
            ProgressWatchdog(self.failure_config.hang_timeout_s, n),
        )
        self.attempt = attempt
        self.watcher.on_attempt(attempt)
        try:
            group.start()
            group.execute_per_rank(init_session, [(s,) for s in self._session_specs(group)])
            self._prepare_workers(group)
        except WorkerGroupError as exc:
            attempt.failures = exc.worker_failures
            if isinstance(exc, WorkerStartupError):  # its message says why nothing started
                attempt.error = exc
            return State.FAILED
        self.engine.set_event_pump(self._pump_events)
        in_process = self.engine.in_process
        attempt.train_futures = group.execute_async(
            run_train_fn,
            spec.train_fn if in_process and spec.train_fn is not None else spec.train_fn_payload,
            spec.train_loop_config,
            contextlib.nullcontext if in_process else spec.backend_config.train_func_context,
        )
        for worker, future in zip(group.workers, attempt.train_futures, strict=True):
            future.add_done_callback(_wake_on_done(group.events, worker.handle.index))
        attempt.watchdog.start()
        return State.RUNNING

    def _prepare_workers(self, group: WorkerGroup) -> None:
        """The framework's setup (a process group, ...) and the runtime env's working_dir; none
        for a function running in the driver's thread, which has no peers."""
        if self.engine.in_process:
            return
        working_dir = (self.spec.run_config.worker_runtime_env or {}).get("working_dir")
        if working_dir and self.engine.name == "local":  # Ray's runtime_env does it on Ray
            group.execute(os.chdir, os.path.abspath(working_dir))
        self.backend.on_start(group, self.spec.backend_config)
        self.backend.on_training_start(group, self.spec.backend_config)

    def _pump_events(self) -> None:
        """Handle reports as they are made, from inside report() (num_workers=0)."""
        attempt = self.attempt
        if attempt is None:
            return
        for index, message in _drain(attempt.group.events, None):
            self._on_event(attempt, attempt.group.rank_of(index), message)
        self._commit_complete_rounds(attempt, set())
        self.validations.collect(self.manager.update_validation)

    def _session_specs(self, group: WorkerGroup) -> list[SessionSpec]:
        checkpoint = self.manager.latest_checkpoint or self.spec.resume_from_checkpoint
        shards = self.spec.make_shards(len(group))
        specs = []
        for worker in group.workers:
            r = worker.ranks
            context = TrainContext(
                r.world_rank,
                len(group),
                r.local_rank,
                r.local_world_size,
                r.node_rank,
                self.spec.run_name,
                self.storage,
                self.spec.metadata,
                worker.metadata.gpu_ids,
                self.attempts - 1,
            )
            specs.append(
                SessionSpec(
                    context,
                    self.storage,
                    checkpoint,
                    self.manager.next_round,
                    self.attempts - 1,
                    shards[worker.world_rank],
                    has_validation=self.spec.validation_config is not None,
                )
            )
        return specs

    # -- RUNNING --------------------------------------------------------------------------------

    def _poll(self) -> State:
        attempt = self.attempt
        assert attempt is not None
        events = _drain(attempt.group.events, attempt.poll_timeout(POLL_TIMEOUT_S))
        # A rank's reports are queued before its training call resolves: snapshot which calls
        # are done, then drain again, and every report of those ranks is in hand.
        finished = attempt.finished_ranks()
        events += _drain(attempt.group.events, None)
        for index, message in events:
            self._on_event(attempt, attempt.group.rank_of(index), message)
        self._commit_complete_rounds(attempt, finished)
        self._warn_silent_ranks(attempt, finished)
        self.validations.collect(self.manager.update_validation)
        self.history.maybe_flush()
        attempt.record_failures(finished)
        if attempt.waiting_for_stop_round(finished):
            return State.RUNNING
        if attempt.awaiting_survivors(finished):  # the round the failed rank reached
            return State.RUNNING
        if attempt.failures:
            return State.FAILED
        hung = attempt.watchdog.hung_ranks(finished)
        if hung:
            self._declare_hang(attempt, hung)
            return State.FAILED
        if len(finished) == len(attempt.train_futures):
            self.return_value = attempt.train_futures[0].result()
            self._shutdown_backend()
            self._teardown(graceful=True)
            return State.FINISHED
        return State.RUNNING

    def _on_event(self, attempt: Attempt, rank: int, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "report":
            _, index, metrics, dir_name, at = message[:5]
            attempt.rounds.add(rank, Report(index, metrics, dir_name, at))
            self.history.add_rank_report(rank, index, metrics)  # every report, complete or not
            if len(message) > 5 and message[5].get("validation"):
                self._validation_requests.setdefault(index, message[5]["validation"])
            attempt.watchdog.progress(rank)
        elif kind == "done":
            attempt.watchdog.progress(rank)
        elif kind == "exited":
            attempt.on_exit(rank, message[1])
        elif kind == "preempting":
            self._on_preemption(attempt, rank)

    def _on_preemption(self, attempt: Attempt, rank: int) -> None:
        """A worker got SIGTERM: every rank stops after the same round, a little ahead of the
        furthest rank, so a checkpoint passed in that round is committed."""
        attempt.preempted_ranks.add(rank)
        if attempt.preemption_deadline is not None:
            return
        grace = self.failure_config.preemption_grace_s
        stop_round = attempt.rounds.start_round + max(attempt.rounds.counts) + 1
        attempt.preemption_deadline = time.monotonic() + grace
        logger.warning(
            "Rank %d was preempted (SIGTERM); every rank stops after round %d, then the run "
            "restarts from the latest checkpoint.",
            rank,
            stop_round,
        )
        attempt.group.notify_preemption(
            {
                "stop_round": stop_round,
                "preempted_ranks": sorted(attempt.preempted_ranks),
                "deadline": time.time() + grace,
            }
        )

    def _declare_hang(self, attempt: Attempt, hung: list[int]) -> None:
        timeout = self.failure_config.hang_timeout_s or 0.0
        stacks = attempt.group.collect_stacks()
        pids = {w.world_rank: w.metadata.pid for w in attempt.group.workers}
        idle = attempt.watchdog.idle_s()
        attempt.error = hang_error(hung, stacks, timeout, pids, idle)
        attempt.failures = attempt.error.worker_failures

    def _commit_complete_rounds(self, attempt: Attempt, finished: set[int]) -> None:
        for round_ in attempt.rounds.pop_complete(attempt.returned_ranks(finished)):
            self._commit_round(round_)

    def _warn_silent_ranks(self, attempt: Attempt, finished: set[int]) -> None:
        """Once per run: rounds wait for ranks that have not reported at all (rank-0-only)."""
        running = set(range(len(attempt.train_futures))) - finished
        lag = attempt.rounds.silent_ranks_warning(running)
        if lag is None or self._warned_silent:
            return
        self._warned_silent = True
        logger.warning(lag)

    def _commit_round(self, round_: Round) -> None:
        names = round_.checkpoint_dir_names
        if len(names) > 1:
            raise ControllerError(
                f"Ranks reported different checkpoint_dir_name values in round {round_.index}: "
                f"{sorted(names)}. HINT: pass the same checkpoint_dir_name on every rank."
            )
        dir_name = next(iter(names), None)
        metrics = round_.run_metrics
        self.last_metrics = metrics
        self.manager.next_round = round_.index + 1
        self.history.add_round(round_.index, metrics, dir_name)
        checkpoint = None
        if dir_name is not None:
            self.storage.commit(
                dir_name, self.attempts - 1, self.spec.metadata, self.spec.checkpoint_files
            )
            self.history.flush()
            validation = self._validation_requests.pop(round_.index, None)
            tracked = TrackedCheckpoint(dir_name, metrics, round_.index)
            self.manager.register(tracked, pending_validation=validation is not None)
            checkpoint = self.manager.latest_checkpoint
            if validation is not None and checkpoint is not None:
                self.validations.submit(dir_name, checkpoint, validation)
        self._notify("after_report", self.run_context, round_.metrics, checkpoint)
        info = self.report_steps.info(round_, self.attempts - 1, checkpoint)
        self._notify("on_report", self.run_context, info)
        self.watcher.on_report(info)

    # -- FAILED ---------------------------------------------------------------------------------

    def _handle_failure(self) -> State:
        attempt = self.attempt
        assert attempt is not None
        failures = attempt.failures
        self._teardown(graceful=False)
        self._drain_failed_attempt(attempt)  # before the staged parts are removed
        _quietly("remove uncommitted checkpoint parts", self.storage.remove_staging)
        _quietly("remove uncommitted checkpoints", self.manager.remove_orphans)
        error = self.error or attempt.error or failure_error(failures)
        self._end_attempt(error)
        exceptions = {r: f.exception or RuntimeError(f.summary()) for r, f in failures.items()}
        self._notify("after_exception", self.run_context, exceptions)
        if self.error is None:
            preempted = attempt.only_preempted()
            if self.policy.decide(preempted) is FailureDecision.RETRY:
                ran_for = time.time() - self.manager.attempt_history[-1]["started"]
                delay = self.policy.backoff_s(preempted, ran_for)
                logger.warning(self._retry_line(attempt, error, delay, preempted))
                time.sleep(delay)  # Ctrl-C still stops the run while it waits
                return State.START
            self.error = error
        logger.warning(self._retry_line(attempt, error, None, attempt.only_preempted()))
        return State.ERRORED

    def _drain_failed_attempt(self, attempt: Attempt) -> None:
        """Reports that arrived while the group was torn down: record them, and commit every
        round that is complete (a round every rank reported is never lost)."""
        for index, message in _drain(attempt.group.events, None):
            if message[0] == "report":
                self._on_event(attempt, attempt.group.rank_of(index), message)
        if attempt.train_futures:
            self._commit_complete_rounds(attempt, attempt.finished_ranks())
        self.history.flush()

    def _retry_line(
        self, attempt: Attempt, error: BaseException, delay: float | None, preempted: bool
    ) -> str:
        latest = self.manager.latest_checkpoint or self.spec.resume_from_checkpoint
        where = latest.path.rstrip("/").rsplit("/", 1)[-1] if latest is not None else None
        return retry_line(
            attempt.number,
            error,
            self.policy.budget(preempted),
            None if delay is None else (where, delay),
        )

    def _resume_hint(self) -> str:
        return resume_hint(
            len(self.manager.checkpoints),
            self.manager.latest_checkpoint,
            self.storage.run_uri,
            self.spec.run_name,
        )

    # -- the end --------------------------------------------------------------------------------

    def _shutdown_backend(self) -> None:
        assert self.attempt is not None
        if self.engine.in_process:
            return
        try:
            self.backend.on_shutdown(self.attempt.group, self.spec.backend_config)
        except Exception:
            logger.exception("Backend.on_shutdown failed; the workers are stopped anyway.")

    def _teardown(self, graceful: bool) -> None:
        attempt = self.attempt
        if attempt is not None and attempt.group.workers:
            attempt.group.shutdown(graceful=graceful)
            attempt.group.workers = []

    def _resume_validations(self) -> None:
        """Validations a previous run of this name left unfinished run again (with the
        trainer's default settings: a report's own fn_kwargs are not stored)."""
        for dir_name in self.manager.pending_validations():
            checkpoint = Checkpoint(self.storage.checkpoint_path(dir_name), self.storage.filesystem)
            if self.validations.config is not None:
                logger.warning("Validating %s again: its validation did not finish.", dir_name)
                self.validations.submit(dir_name, checkpoint, True)
            else:
                logger.warning(
                    "%s was never validated and this trainer has no validation_config.", dir_name
                )
                self.manager.update_validation(dir_name, {}, "VALIDATION_FAILED")

    def _collect_validations(self) -> None:
        self.validations.collect(self.manager.update_validation, wait=True)

    def _end_attempt(self, error: BaseException | None) -> None:
        self.manager.end_attempt(outcome_name(error), str(error)[:2000] if error else None)

    def _finish(self, state: State) -> Result:
        if state is State.FINISHED:
            self._end_attempt(None)
            self.validations.collect(self.manager.update_validation, wait=True)
            self.manager.save()
        else:  # the run's own error matters more than a storage too broken to record it
            _quietly("record the validations", self._collect_validations)
            _quietly("save the run's snapshot", self.manager.save)
        result = Result(
            metrics=self.last_metrics,
            checkpoint=self.manager.latest_checkpoint,
            error=self.error if state is State.ERRORED else None,
            path=self.storage.run_uri,
            best_checkpoints=self.manager.best_checkpoints(),
            return_value=self.return_value,
            attempts=self.manager.attempts,
            attempt_errors=attempt_errors(self.manager.attempt_history),
            _storage=self.storage,
        )
        if result.error is not None:
            save_error(self.storage, result.error)
        self.watcher.finish(result)
        self._notify("after_run", self.run_context, result)
        if isinstance(result.error, TrainingFailedError):
            result.error.result = result
            raise result.error from root_exception(result.error)
        return result

    def _notify(self, hook: str, *args: Any) -> None:
        for callback in self.callbacks:
            try:
                getattr(callback, hook)(*args)
            except (ConfigError, ControllerError):
                raise
            except Exception as exc:
                raise ControllerError(
                    f"Callback {type(callback).__name__}.{hook} raised {type(exc).__name__}: {exc}"
                ) from exc


def _quietly(action: str, step: Callable[[], Any]) -> None:
    try:
        step()
    except StorageError as exc:
        logger.error("Could not %s while the run was failing: %s", action, exc)


def _drain(events: Events, timeout_s: float | None) -> list[tuple[int, tuple[Any, ...]]]:
    """Everything queued; waits up to ``timeout_s`` for the first event (None: no wait)."""
    batch = []
    if timeout_s is not None:
        try:
            batch.append(events.get(timeout=timeout_s))
        except queue.Empty:
            return []
    while True:
        try:
            batch.append(events.get_nowait())
        except queue.Empty:
            return batch


def _wake_on_done(events: Events, index: int) -> Callable[[Future[Any]], None]:
    """Wake the poll loop as soon as a rank's training call resolves."""
    return lambda _future: events.put((index, ("done",)))
