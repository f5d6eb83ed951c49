"""The run's state machine: start an attempt, poll it, commit rounds, retry or finish.

Each state has one method that does its work and returns the next state::

    START -> RUNNING -> FINISHED
               |  ^
               v  |  (retry allowed)
             FAILED -> ERRORED
"""

from __future__ import annotations

import enum
import logging
import pickle
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from phalanx._internal.controller.failure_policy import FailureDecision, FailurePolicy
from phalanx._internal.controller.rounds import Report, ReportRounds, Round
from phalanx._internal.engines.base import Engine, WorkerGroupSpec
from phalanx._internal.storage.checkpoint_manager import CheckpointManager, TrackedCheckpoint
from phalanx._internal.storage.history import MetricsHistory
from phalanx._internal.storage.run_storage import ERROR_PICKLE_FILE, ERROR_TEXT_FILE, RunStorage
from phalanx._internal.worker.runtime import RemoteCallError
from phalanx._internal.worker.session import SessionSpec, init_session, run_train_fn
from phalanx._internal.worker_group.group import WorkerGroup
from phalanx.backend import BackendConfig
from phalanx.callbacks import Callback, TrainRunContext
from phalanx.checkpoint import Checkpoint
from phalanx.config import DataConfig, RunConfig, ScalingConfig
from phalanx.context import TrainContext
from phalanx.errors import (
    ConfigError,
    ControllerError,
    ReportMismatchError,
    TrainingFailedError,
    WorkerFailure,
    WorkerGroupError,
)
from phalanx.result import Result

logger = logging.getLogger(__name__)

POLL_TIMEOUT_S = 0.5
EXIT_STATUS_WAIT_S = 0.5
EXIT_DRAIN_S = 0.2


class State(enum.Enum):
    START = "start"
    RUNNING = "running"
    FAILED = "failed"
    FINISHED = "finished"
    ERRORED = "errored"


@dataclass(frozen=True)
class RunSpec:
    """Everything about the run that does not change between attempts."""

    train_fn_payload: bytes
    train_loop_config: dict[str, Any] | None
    backend_config: BackendConfig
    scaling_config: ScalingConfig
    run_config: RunConfig
    run_name: str
    metadata: dict[str, Any] = field(default_factory=dict)
    resume_from_checkpoint: Checkpoint | None = None
    datasets: dict[str, Any] = field(default_factory=dict)
    dataset_config: DataConfig = field(default_factory=DataConfig)
    start_timeout_s: float = 60.0


class Controller:
    def __init__(
        self,
        spec: RunSpec,
        engine: Engine,
        storage: RunStorage,
        manager: CheckpointManager,
    ) -> None:
        self.spec = spec
        self.engine = engine
        self.storage = storage
        self.manager = manager
        self.history = MetricsHistory(storage)
        self.policy = FailurePolicy(spec.run_config.failure_config)
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
        self.group: WorkerGroup | None = None
        self.rounds: ReportRounds | None = None
        self.train_futures: list[Future[Any]] = []
        self.failures: dict[int, WorkerFailure] = {}
        self.exited: dict[int, tuple[float, int]] = {}
        self.error: BaseException | None = None
        self.last_metrics: dict[str, Any] | None = None
        self.return_value: Any = None
        self.attempts = 0

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> Result:
        steps = {
            State.START: self._start_attempt,
            State.RUNNING: self._poll,
            State.FAILED: self._handle_failure,
        }
        self._notify("before_run", self.run_context)
        state = State.START
        try:
            while state in steps:
                state = steps[state]()
        except BaseException as exc:  # Ctrl-C, a callback, storage: stop every worker first
            self._teardown(graceful=False)
            self.error = exc
            raise
        finally:
            self.engine.close()
            self.history.flush()
            self.storage.remove_staging()
        return self._finish(state)

    # -- START ----------------------------------------------------------------------------------

    def _start_attempt(self) -> State:
        self.attempts += 1
        self.manager.attempts += 1
        self.manager.save()
        self.failures = {}
        self.exited = {}
        spec = self.spec
        group = WorkerGroup(
            self.engine,
            WorkerGroupSpec(
                spec.scaling_config.num_workers,
                spec.scaling_config,
                spec.run_name,
                self.storage.local_log_dir(),
                start_timeout_s=spec.start_timeout_s,
            ),
        )
        self.group = group
        try:
            group.start()
            group.execute_per_rank(init_session, [(s,) for s in self._session_specs(group)])
            self.backend.on_start(group, spec.backend_config)
            self.backend.on_training_start(group, spec.backend_config)
        except WorkerGroupError as exc:
            self.failures = exc.worker_failures
            return State.FAILED
        self.rounds = ReportRounds(len(group), self.manager.next_round)
        self.train_futures = group.execute_async(
            run_train_fn,
            spec.train_fn_payload,
            spec.train_loop_config,
            spec.backend_config.train_func_context,
        )
        for worker, future in zip(group.workers, self.train_futures, strict=True):
            future.add_done_callback(_wake_on_done(group, worker.handle.index))
        return State.RUNNING

    def _session_specs(self, group: WorkerGroup) -> list[SessionSpec]:
        checkpoint = self.manager.latest_checkpoint or self.spec.resume_from_checkpoint
        shards = self._dataset_shards(len(group))
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
                    context, self.storage, checkpoint, self.manager.next_round, self.attempts - 1,
                    shards[worker.world_rank],
                )
            )
        return specs

    def _dataset_shards(self, world_size: int) -> list[dict[str, Any]]:
        """Each rank's dataset shards, built anew for every attempt (factories re-evaluated)."""
        if not self.spec.datasets:
            return [{} for _ in range(world_size)]
        from phalanx.data import shard_datasets

        return shard_datasets(self.spec.datasets, self.spec.dataset_config, world_size)

    # -- RUNNING --------------------------------------------------------------------------------

    def _poll(self) -> State:
        assert self.group is not None and self.rounds is not None
        events = self._drain(self.group.events, self._poll_timeout())
        # A rank's reports are queued before its training call resolves: snapshot which calls
        # are done, then drain again, and every report of those ranks is in hand.
        finished = {r for r, f in enumerate(self.train_futures) if f.done()}
        events += self._drain(self.group.events, None)
        for index, message in events:
            self._on_event(self.group.rank_of(index), message)
        for round_ in self.rounds.pop_complete():
            self._commit_round(round_)
        self.history.maybe_flush()
        self._check_futures(finished)
        if self.failures:
            return State.FAILED
        counts = self.rounds.mismatch(finished)
        if counts is not None:
            self._report_mismatch(counts)
            return State.FAILED
        if len(finished) == len(self.train_futures) and not self.failures:
            self.return_value = self.train_futures[0].result()
            self._shutdown_backend()
            self._teardown(graceful=True)
            return State.FINISHED
        return State.RUNNING

    @staticmethod
    def _drain(
        events: queue.Queue[tuple[int, tuple[Any, ...]]], timeout_s: float | None
    ) -> list[tuple[int, tuple[Any, ...]]]:
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

    def _on_event(self, rank: int, message: tuple[Any, ...]) -> None:
        assert self.rounds is not None and self.group is not None
        kind = message[0]
        if kind == "report":
            _, index, metrics, dir_name, at = message
            self.rounds.add(rank, Report(index, metrics, dir_name, at))
        elif kind == "exited" and not self.train_futures[rank].done():
            # The exit status can overtake the last messages still in the worker's socket;
            # it becomes a failure once they had time to drain (see _check_futures).
            self.exited[rank] = (time.monotonic(), message[1])

    def _poll_timeout(self) -> float:
        return EXIT_DRAIN_S / 4 if self.exited else POLL_TIMEOUT_S

    def _check_futures(self, finished: set[int]) -> None:
        """Record failures of ranks whose call resolved before the last drain, or that exited."""
        assert self.group is not None
        now = time.monotonic()
        for rank, (at, code) in self.exited.items():
            if rank not in finished and rank not in self.failures and now - at > EXIT_DRAIN_S:
                self.failures[rank] = self.group.failure(rank, None, returncode=code)
        for rank in finished:
            future = self.train_futures[rank]
            if rank in self.failures or future.exception() is None:
                continue
            exc = future.exception()
            returncode = None
            if not isinstance(exc, RemoteCallError):  # the process died: learn how
                returncode = self._wait_exit_status(rank)
            self.failures[rank] = self.group.failure(rank, exc, returncode)

    def _wait_exit_status(self, rank: int) -> int | None:
        assert self.group is not None
        handle = self.group.workers[rank].handle
        deadline = time.monotonic() + EXIT_STATUS_WAIT_S
        while handle.is_alive() and time.monotonic() < deadline:
            time.sleep(0.002)
        return getattr(handle, "returncode", None)

    def _report_mismatch(self, counts: dict[int, int]) -> None:
        detail = ", ".join(f"rank {r}: {c}" for r, c in counts.items())
        message = (
            f"Ranks called report() a different number of times ({detail}).\n"
            "Every rank must call phalanx.report() the same number of times: the k-th report of "
            "each rank forms round k.\nHINT: call report() on every rank (pass metrics from all "
            "ranks, or an empty dict), not only on rank 0."
        )
        self.error = ReportMismatchError({}, message=message)

    def _commit_round(self, round_: Round) -> None:
        names = round_.checkpoint_dir_names
        if len(names) > 1:
            raise ControllerError(
                f"Ranks reported different checkpoint_dir_name values in round {round_.index}: "
                f"{sorted(names)}. HINT: pass the same checkpoint_dir_name on every rank."
            )
        dir_name = next(iter(names), None)
        rank0 = round_.reports[0].metrics
        self.last_metrics = rank0
        self.manager.next_round = round_.index + 1
        self.history.add_round(round_.index, rank0, dir_name)
        for rank, report in enumerate(round_.reports):
            self.history.add_rank_report(rank, round_.index, report.metrics)
        checkpoint = None
        if dir_name is not None:
            self.storage.commit(dir_name, self.attempts - 1, self.spec.metadata)
            self.history.flush()
            self.manager.register(TrackedCheckpoint(dir_name, rank0, round_.index))
            checkpoint = self.manager.latest_checkpoint
        self._notify("after_report", self.run_context, round_.metrics, checkpoint)

    # -- FAILED ---------------------------------------------------------------------------------

    def _handle_failure(self) -> State:
        failures = self.failures
        self._teardown(graceful=False)
        exceptions = {r: f.exception or RuntimeError(f.summary()) for r, f in failures.items()}
        self._notify("after_exception", self.run_context, exceptions)
        if self.error is None and self.policy.decide() is FailureDecision.RETRY:
            logger.warning(
                "Attempt %d failed; retrying from the latest checkpoint (%s).",
                self.attempts,
                self.manager.latest_checkpoint,
            )
            return State.START
        if self.error is None:
            self.error = WorkerGroupError(failures)
        return State.ERRORED

    # -- the end --------------------------------------------------------------------------------

    def _shutdown_backend(self) -> None:
        try:
            self.backend.on_shutdown(self.group, self.spec.backend_config)
        except Exception:
            logger.exception("Backend.on_shutdown failed; the workers are stopped anyway.")

    def _teardown(self, graceful: bool) -> None:
        if self.group is not None:
            group, self.group = self.group, None
            group.shutdown(graceful=graceful)

    def _finish(self, state: State) -> Result:
        self.manager.save()
        result = Result(
            metrics=self.last_metrics,
            checkpoint=self.manager.latest_checkpoint,
            error=self.error if state is State.ERRORED else None,
            path=self.storage.run_path,
            best_checkpoints=self.manager.best_checkpoints(),
            return_value=self.return_value,
            attempts=self.attempts,
            _storage=self.storage,
        )
        if result.error is not None:
            self._save_error(result.error)
        self._notify("after_run", self.run_context, result)
        if isinstance(result.error, TrainingFailedError):
            result.error.result = result
            root = _root_exception(result.error)
            raise result.error from root
        return result

    def _save_error(self, error: BaseException) -> None:
        self.storage.write_atomic(ERROR_TEXT_FILE, str(error).encode())
        try:
            self.storage.write_atomic(ERROR_PICKLE_FILE, pickle.dumps(error))
        except Exception:
            logger.debug("The error does not pickle; only error.txt is saved.", exc_info=True)

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


def _wake_on_done(group: WorkerGroup, index: int) -> Callable[[Future[Any]], None]:
    """Wake the poll loop as soon as a rank's training call resolves."""
    return lambda _future: group.events.put((index, ("done",)))


def _root_exception(error: TrainingFailedError) -> BaseException | None:
    if isinstance(error, WorkerGroupError) and error.worker_failures:
        root = min(error.worker_failures.values(), key=lambda f: (f.time, f.rank))
        return root.exception
    return None
