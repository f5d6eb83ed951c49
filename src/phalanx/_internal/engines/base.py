"""The Engine contract: launch workers, run callables in them, watch and kill them.

An engine puts what happens to its workers into the ``events`` queue it is given, as
``(worker_index, event)``, each event one of the typed messages of
:mod:`phalanx._internal.engines.messages`: a ``Report``, ``Preempting`` or ``Poll`` a worker sent
(decoded from its wire tuple by the engine, in the thread that read it) and ``Exited`` when a
worker is gone (at most once per worker; for a worker that ``shutdown`` or ``kill`` stopped, an
engine may leave it out). A call's return value is not an event: it resolves the future
``WorkerHandle.execute`` returned. Every engine delivers the same types for the same training
function (``tests/ray/test_engine_messages.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from phalanx._internal.engines.messages import Events
from phalanx.config import ScalingConfig
from phalanx.context import RunLocation

T = TypeVar("T")


@dataclass(frozen=True)
class WorkerGroupSpec:
    """The blueprint of a worker group: what to start, not what was started."""

    num_workers: int
    scaling_config: ScalingConfig
    run_name: str
    log_dir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    start_timeout_s: float = 60.0
    attempt: int = 0
    preload_modules: tuple[str, ...] = ()
    storage: RunLocation | None = None  # workers on other nodes check they can reach it
    runtime_env: dict[str, Any] = field(default_factory=dict)  # RunConfig.worker_runtime_env
    # Elastic training (ScalingConfig(num_workers=(min, max))): the engine may start fewer than
    # num_workers, as many as it can place but at least this many. None: exactly num_workers.
    min_workers: int | None = None
    # In-place recovery: what leaves the framework's state in a worker whose training call
    # ended, so the next attempt can reuse the process (the backend's ``reset_worker``). None:
    # a failed attempt's workers are all replaced.
    reset_worker: Callable[[], None] | None = None
    # In-place recovery: what frees a worker whose training call waits in a collective with a
    # lost peer (the backend's ``abort_worker``: the framework's process group aborted), so the
    # call ends and the process is kept. None: such a worker is replaced.
    abort_worker: Callable[[], None] | None = None


@dataclass(frozen=True)
class WorkerMetadata:
    """What a started worker says about itself."""

    host: str
    node_id: str
    pid: int | None
    gpu_ids: tuple[int, ...] = ()


class WorkerHandle(ABC):
    """One started worker. ``index`` is its launch order; ranks are assigned later."""

    index: int
    metadata: WorkerMetadata

    @abstractmethod
    def execute(self, fn: Callable[..., T], *args: object, **kwargs: object) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` in the worker; the future holds its return value."""

    @abstractmethod
    def kill(self, force: bool = True) -> None:
        """SIGKILL the worker (``force``) or ask it to stop with SIGTERM."""

    @abstractmethod
    def is_alive(self) -> bool: ...

    def set_rank(self, rank: int) -> None:
        """Told once ranks are assigned (used to label the worker's output)."""


class Engine(ABC):
    """A substrate for workers: local processes, Ray actors, or threads (tests)."""

    name: str = "engine"  # for messages and the run's record only: ask the capabilities below
    in_process: ClassVar[bool] = False  # workers run in the driver's own thread (num_workers=0)
    # Each worker is a process of its own: per-process state (a torch process group, an
    # XGBoost/LightGBM network, os.environ, the working directory) is each rank's.
    process_per_worker: ClassVar[bool] = True
    # phalanx applies RunConfig(worker_runtime_env=...) itself (checks it on the driver, chdirs
    # each worker into its working_dir); False where the substrate does it (Ray's runtime_env)
    # or cannot (threads share one working directory).
    applies_runtime_env: ClassVar[bool] = False
    # Elastic num_workers=(min, max): the engine decides each attempt's size from what it can
    # place (WorkerGroupSpec.min_workers); False: the trainer fixes the size once at fit().
    sizes_elastic_groups: ClassVar[bool] = False

    def check(self, scaling_config: ScalingConfig) -> None:
        """Raise ConfigError now if this engine can never satisfy ``scaling_config``."""

    def free_worker_slots(self, scaling_config: ScalingConfig) -> int:
        """How many more workers of ``scaling_config``'s size could be placed now (elastic
        growth; engines that do not size groups never grow them)."""
        return 0

    @abstractmethod
    def launch(self, spec: WorkerGroupSpec, events: Events) -> list[WorkerHandle]:
        """Start ``spec.num_workers`` workers and wait until each has said hello."""

    @abstractmethod
    def shutdown(self, handles: list[WorkerHandle], grace_s: float) -> None:
        """Stop the given workers: ask nicely, then kill after ``grace_s``; wait until gone."""

    def park(self, handles: list[WorkerHandle]) -> None:
        """A failed attempt's workers: end their calls and keep those the next ``launch`` can
        reuse (engines that can), stop the others at once. By default all are stopped."""
        self.shutdown(handles, 0.0)

    def collect_stacks(self, handles: list[WorkerHandle], timeout_s: float) -> dict[int, str]:
        """Every thread's Python stack in each worker (by handle index); {} if not supported."""
        return {}

    def notify_preemption(self, handles: list[WorkerHandle], notice: dict[str, Any]) -> None:
        """Deliver a preemption notice (stop_round, preempted_ranks, deadline) to every worker,
        where ``phalanx.get_preemption_info()`` returns it."""

    def set_event_pump(self, pump: Callable[[], None] | None) -> None:
        """Engines that run the training function in the driver's thread call ``pump`` after
        each message, so the controller handles reports while the function runs."""

    def close(self) -> None:
        """Release everything the engine holds (called once, at the end of fit())."""
