"""Backend / BackendConfig: how a framework sets itself up on the workers.

A framework package (``phalanx.torch``, ``phalanx.xgboost``, ...) subclasses both; so can a
third-party package: this module is the extension point. The hooks run on the driver and reach
the workers through the :class:`WorkerGroup` they receive (``execute(fn, *args)`` runs ``fn`` on
every rank and returns results in rank order; ``execute_single(rank, fn, ...)``;
``len(worker_group)``; ``workers[rank]`` says where each rank runs). Inside those functions
``phalanx.get_context()`` already works. Type your hooks with :class:`WorkerGroup`, and mypy
checks what they use against what every engine offers.

Order within one attempt: workers start, ranks are assigned, sessions are set up, then
``on_start``, ``on_training_start``, the training function on every rank, and ``on_shutdown``
(also after a failure; its errors are logged, not raised).

Example::

    def set_flag(value):  # a function: a bound method of os.environ would pickle a copy
        os.environ["MY_FLAG"] = value

    class EchoBackend(Backend):
        def on_start(self, worker_group, backend_config):
            worker_group.execute(set_flag, "1")

    @dataclass
    class EchoConfig(BackendConfig):
        @property
        def backend_cls(self):
            return EchoBackend
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, is_dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from phalanx._foundation.keywords import KeywordChecked

if TYPE_CHECKING:
    from phalanx.config import ScalingConfig

__all__ = ["Backend", "BackendConfig", "WorkerGroup", "WorkerInfo"]

_R = TypeVar("_R")  # what a function run on the workers returns


class WorkerInfo(Protocol):
    """One started worker: ``worker_group.workers[rank]``. Ranks are assigned as torchrun does:
    workers grouped by node, nodes in the order their first worker started.

    Example::

        def on_start(self, worker_group, backend_config):
            for worker in worker_group.workers:
                print(worker.world_rank, worker.local_rank, worker.node_rank, worker.host)
    """

    @property
    def world_rank(self) -> int: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def node_rank(self) -> int: ...
    @property
    def local_world_size(self) -> int: ...
    @property
    def host(self) -> str:
        """The address other workers reach this one at (the node's IP on Ray)."""

    @property
    def node_id(self) -> str:
        """Equal for workers on the same machine (``"local"`` on the local engine)."""

    @property
    def pid(self) -> int | None: ...
    @property
    def gpu_ids(self) -> tuple[int, ...]:
        """The GPUs assigned to this worker (its ``CUDA_VISIBLE_DEVICES``); () without GPUs."""


class WorkerGroup(Protocol):
    """The workers of one attempt, in rank order, as every engine gives them to a Backend.

    A function given to ``execute*`` runs in the worker (pickled by cloudpickle on process
    engines); the calls raise ``phalanx.WorkerGroupError`` naming the ranks that failed or did
    not answer within ``timeout_s``.

    Example::

        class MyBackend(Backend):
            def on_start(self, worker_group: WorkerGroup, backend_config: BackendConfig) -> None:
                hosts = [worker.host for worker in worker_group.workers]
                worker_group.execute(os.environ.__setitem__, "MY_HOSTS", ",".join(hosts))

        @dataclass
        class MyConfig(BackendConfig):
            @property
            def backend_cls(self):
                return MyBackend

        DataParallelTrainer(train_func, backend_config=MyConfig(), ...).fit()
    """

    @property
    def workers(self) -> Sequence[WorkerInfo]: ...
    @property
    def scaling_config(self) -> ScalingConfig: ...
    @property
    def process_per_worker(self) -> bool:
        """Each rank is a process of its own. False on the thread engine (ranks are threads of
        the driver and share per-process state: a backend that keeps such state, like a
        process group, must refuse it) and for ``num_workers=0``."""

    def __len__(self) -> int: ...
    def get_resources_per_worker(self) -> dict[str, float]:
        """What each worker holds, e.g. ``{"CPU": 1}`` (as Ray Train's worker group says)."""

    def execute(
        self, fn: Callable[..., _R], *args: object, timeout_s: float | None = None, **kwargs: object
    ) -> list[_R]:
        """``fn(*args, **kwargs)`` on every rank; the results in rank order."""

    def execute_async(
        self, fn: Callable[..., _R], *args: object, **kwargs: object
    ) -> list[Future[_R]]:
        """``execute`` without waiting: a future per rank (a failure is a ``RemoteCallError``)."""

    def execute_single(
        self,
        rank: int,
        fn: Callable[..., _R],
        *args: object,
        timeout_s: float | None = None,
        **kwargs: object,
    ) -> _R:
        """``fn(*args, **kwargs)`` on one rank; its result."""

    def execute_single_async(
        self, rank: int, fn: Callable[..., _R], *args: object, **kwargs: object
    ) -> Future[_R]: ...
    def execute_per_rank(
        self,
        fn: Callable[..., _R],
        args_per_rank: Sequence[tuple[object, ...]],
        timeout_s: float | None = None,
    ) -> list[_R]:
        """``fn(*args_per_rank[r])`` on each rank ``r``; the results in rank order."""


class Backend:
    """Framework set-up hooks; all default to doing nothing.

    Example::

        class MyBackend(Backend):
            def on_start(self, worker_group: WorkerGroup, backend_config: BackendConfig) -> None:
                hosts = [worker.host for worker in worker_group.workers]
                worker_group.execute(os.environ.__setitem__, "MY_HOSTS", ",".join(hosts))

        @dataclass
        class MyConfig(BackendConfig):
            @property
            def backend_cls(self):
                return MyBackend

        DataParallelTrainer(train_func, backend_config=MyConfig(), ...).fit()
    """

    share_cuda_visible_devices: bool = False
    # In-place recovery (Ray engine): run in each surviving worker once its training call ended,
    # so the next attempt can reuse the process (e.g. leave the process group). None: this
    # framework's state cannot be reset in a live process, so every worker is replaced.
    reset_worker: Callable[[], None] | None = None

    def on_start(self, worker_group: WorkerGroup, backend_config: BackendConfig) -> None:
        """After the workers started and their sessions exist, before training."""

    def on_training_start(self, worker_group: WorkerGroup, backend_config: BackendConfig) -> None:
        """Right before the training function starts on every worker."""

    def on_shutdown(self, worker_group: WorkerGroup, backend_config: BackendConfig) -> None:
        """After the training function returned on every rank, before the workers stop (also
        before an elastic group restarts larger). Not called after a failure: a failed attempt's
        workers are killed at once (a rank stuck in a collective answers nothing), and the
        framework's state ends with their processes. Not called on the in-process engines
        (thread, inline). An exception here is logged; the workers are stopped anyway."""


@dataclass
class BackendConfig(KeywordChecked):
    """Configuration of a framework's backend; ``backend_cls`` names the Backend to use.

    Example::

        class MyBackend(Backend):
            def on_start(self, worker_group: WorkerGroup, backend_config: BackendConfig) -> None:
                hosts = [worker.host for worker in worker_group.workers]
                worker_group.execute(os.environ.__setitem__, "MY_HOSTS", ",".join(hosts))

        @dataclass
        class MyConfig(BackendConfig):
            @property
            def backend_cls(self):
                return MyBackend

        DataParallelTrainer(train_func, backend_config=MyConfig(), ...).fit()
    """

    @property
    def backend_cls(self) -> type[Backend]:
        return Backend

    @property
    def train_func_context(self) -> Callable[[], contextlib.AbstractContextManager[object]]:
        """A context manager factory wrapped around the training function on every worker."""
        return contextlib.nullcontext

    @property
    def preload_modules(self) -> tuple[str, ...]:
        """Modules the local engine's fork server imports while the first workers run, so that
        workers restarted after a failure start with them (e.g. ``torch._dynamo``: seconds).
        Imported only when the run may restart after a failure (``FailureConfig.max_failures``
        not 0)."""
        return ()

    @property
    def framework(self) -> str | None:
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) if is_dataclass(self) else {}
