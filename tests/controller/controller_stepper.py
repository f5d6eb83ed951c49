"""Step the controller's state machine by hand, over a scripted worker group (no processes).

``FakeEngine`` launches ``FakeWorker`` handles: calls that set a worker up succeed at once, and
the training call stays pending until the test says how the rank ends (``report``, ``finish``,
``raise_``, ``die``, ``preempt``). ``Stepper`` owns a real ``Controller`` over real storage in a
temporary directory and steps it one state at a time, so a test shows which transition broke.
The events a worker causes are built here, in one place, as the engines' typed messages.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from phalanx import Callback, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from phalanx._internal.controller.controller import Controller
from phalanx._internal.controller.spec import RunSpec
from phalanx._internal.controller.state import FINAL_STATES, State, Step
from phalanx._internal.engines.base import Engine, WorkerGroupSpec, WorkerHandle, WorkerMetadata
from phalanx._internal.engines.messages import Events, Preempting, Report
from phalanx._internal.storage.checkpoint_manager import CheckpointManager
from phalanx._internal.storage.run_storage import RunStorage
from phalanx._internal.worker.runtime import RemoteCallError, RemoteException
from phalanx._internal.worker.session import SessionSpec, init_session, run_train_fn
from phalanx.backend import BackendConfig
from phalanx.errors import WorkerStartupError
from phalanx.result import Result


class FakeWorker(WorkerHandle):
    """One scripted worker. Its training call resolves only when the test ends the rank."""

    def __init__(self, index: int, events: Events, setup_error: BaseException | None) -> None:
        self.index = index
        self.setup_error = setup_error  # raised by the worker's session setup
        self.metadata = WorkerMetadata(host="fake-host", node_id="fake-node", pid=None)
        self.events = events
        self.train: Future[Any] | None = None
        self.alive = True
        self.returncode: int | None = None
        self.calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.calls.append((fn, args))
        if fn is run_train_fn:
            self.train = future
        elif fn is init_session and self.setup_error is not None:
            future.set_exception(_remote(self.setup_error))
        else:  # setting the worker up (its session, the backend's hooks) succeeds at once
            future.set_result(None)
        return future

    def session(self) -> SessionSpec:
        """What the controller set this worker's session up with."""
        return next(args[0] for fn, args in self.calls if fn is init_session)

    def kill(self, force: bool = True) -> None:
        self.alive = False

    def is_alive(self) -> bool:
        return self.alive

    # -- the script ------------------------------------------------------------------------------

    def report(self, round_: int, metrics: dict[str, Any], dir_name: str | None = None) -> None:
        self.events.put((self.index, Report(round_, metrics, dir_name, time.time())))

    def finish(self, value: Any = None) -> None:
        self._train().set_result(value)

    def raise_(self, exc: BaseException) -> None:
        """The training function raised ``exc`` (the worker sends it back, as a worker does)."""
        self._train().set_exception(_remote(exc))

    def die(self, signal: int = 9) -> None:
        """The process was killed: the call's connection breaks, the exit status says how."""
        self.alive, self.returncode = False, -signal
        self._train().set_exception(ConnectionError("the worker's connection closed"))

    def preempt(self) -> None:
        """SIGTERM: the worker says it is preempting, then stops at the stop round."""
        self.events.put((self.index, Preempting(time.time())))
        self.stop_for_preemption()

    def stop_for_preemption(self) -> None:
        """The rank reached the stop round of a preemption notice and stopped."""
        remote = RemoteException("PreemptionStop", "stopped at the stop round", "", None)
        self._train().set_exception(RemoteCallError(remote))

    def _train(self) -> Future[Any]:
        assert self.train is not None, "the training call has not started"
        return self.train


def _remote(exc: BaseException) -> RemoteCallError:
    """``exc`` as a worker sends it back."""
    return RemoteCallError(
        RemoteException(type(exc).__name__, str(exc), "Traceback: (scripted)", exc)
    )


class FakeEngine(Engine):
    name = "fake"

    def __init__(self, startup_failures: int = 0, setup_failures: int = 0) -> None:
        self.startup_failures = startup_failures  # the first n launches fail
        self.setup_failures = setup_failures  # then rank 0's session setup fails n times
        self.groups: list[list[FakeWorker]] = []
        self.notices: list[dict[str, Any]] = []

    def launch(self, spec: WorkerGroupSpec, events: Events) -> list[WorkerHandle]:
        if self.startup_failures:
            self.startup_failures -= 1
            raise WorkerStartupError.of(
                list(range(spec.num_workers)), "no worker said hello", "scripted"
            )
        error = None
        if self.setup_failures:
            self.setup_failures -= 1
            error = RuntimeError("the session could not be set up")
        workers = [
            FakeWorker(i, events, error if i == 0 else None) for i in range(spec.num_workers)
        ]
        self.groups.append(workers)
        return list(workers)

    def notify_preemption(self, handles: list[WorkerHandle], notice: dict[str, Any]) -> None:
        self.notices.append(notice)

    def shutdown(self, handles: list[WorkerHandle], grace_s: float) -> None:
        for handle in handles:
            handle.kill()


class Stepper:
    """A controller over ``FakeEngine``, stepped by the test. The wait before a retry is
    recorded in ``waits`` instead of slept; a poll does not wait for events."""

    def __init__(
        self,
        tmp_path: Path,
        num_workers: int = 2,
        failure_config: FailureConfig | None = None,
        engine: FakeEngine | None = None,
        callbacks: list[Callback] | None = None,
        **spec_fields: Any,
    ) -> None:
        self.engine = engine or FakeEngine()
        self.storage = RunStorage.create(str(tmp_path / "runs"), "run")
        self.storage.prepare()
        run_config = RunConfig(
            name="run",
            storage_path=str(tmp_path / "runs"),
            failure_config=failure_config or FailureConfig(),
            callbacks=callbacks or [],
            verbose=0,
        )
        manager = CheckpointManager(self.storage, CheckpointConfig())
        manager.load()
        spec = RunSpec(
            train_fn_payload=b"",
            train_loop_config=None,
            backend_config=BackendConfig(),
            scaling_config=ScalingConfig(num_workers=num_workers),
            run_config=run_config,
            run_name="run",
            **spec_fields,
        )
        self.controller = Controller(spec, self.engine, self.storage, manager)
        self.controller.poll_timeout_s = 0.0
        self.waits: list[float] = []
        self.controller.sleep = self.waits.append
        self.state: Step = State.START
        self.controller.begin()

    @property
    def workers(self) -> list[FakeWorker]:
        """The current attempt's workers, by rank (one node: rank = launch index)."""
        return self.engine.groups[-1]

    def step(self) -> Step:
        self.state = self.controller.step(self.state)
        return self.state

    def poll_until_not_running(self, timeout_s: float = 5.0) -> Step:
        """Poll until the attempt ends; rules that wait on the clock (an exit's drain, a hang)
        get up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.step() is State.RUNNING:
            assert time.monotonic() < deadline, "the attempt did not end"
            time.sleep(0.01)
        return self.state

    def stage_checkpoint(self, dir_name: str) -> None:
        """What a rank's upload leaves before the commit: the checkpoint's staged files."""
        staged = Path(self.storage.staging_path(dir_name, self.controller.attempts - 1))
        staged.mkdir(parents=True)
        (staged / "model.txt").write_text("weights")

    def end(self) -> Result:
        """Close the run as ``fit()`` does; returns the Result or raises the run's error."""
        assert self.state in FINAL_STATES, f"the run is not over: {self.state}"
        self.controller.close(failed=False)
        return self.controller.finish(self.state)

    def abandon(self) -> None:
        """Stop a run a test left midway (its workers and threads go)."""
        self.controller._teardown(graceful=False)
        self.controller.close(failed=True)
