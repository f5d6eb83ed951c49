"""WorkerGroup: started workers in rank order, over an Engine. What Backend hooks receive: it
implements the public ``phalanx.backend.WorkerGroup`` protocol (mypy checks it below)."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from phalanx._internal.engines.base import Engine, WorkerGroupSpec, WorkerHandle, WorkerMetadata
from phalanx._internal.engines.messages import Events
from phalanx._internal.worker.runtime import RemoteCallError
from phalanx._internal.worker_group.ranks import RankInfo, assign_ranks
from phalanx.config import ScalingConfig
from phalanx.errors import WorkerFailure, WorkerGroupError

if TYPE_CHECKING:
    import phalanx.backend as backend

T = TypeVar("T")


@dataclass(frozen=True)
class Worker:
    handle: WorkerHandle
    ranks: RankInfo

    @property
    def metadata(self) -> WorkerMetadata:
        return self.handle.metadata

    @property
    def world_rank(self) -> int:
        return self.ranks.world_rank

    @property
    def local_rank(self) -> int:
        return self.ranks.local_rank

    @property
    def node_rank(self) -> int:
        return self.ranks.node_rank

    @property
    def local_world_size(self) -> int:
        return self.ranks.local_world_size

    @property
    def host(self) -> str:
        return self.handle.metadata.host

    @property
    def node_id(self) -> str:
        return self.handle.metadata.node_id

    @property
    def pid(self) -> int | None:
        return self.handle.metadata.pid

    @property
    def gpu_ids(self) -> tuple[int, ...]:
        return self.handle.metadata.gpu_ids


class WorkerGroup:
    """Workers of one attempt, indexed by world rank.

    Backends use what ``phalanx.backend.WorkerGroup`` documents; the rest (``events``,
    ``rank_of``, ``gather``, ``failure``, ``shutdown``, ...) is the controller's.
    """

    def __init__(self, engine: Engine, spec: WorkerGroupSpec) -> None:
        self.engine = engine
        self.spec = spec
        self.events: Events = queue.Queue()
        self.workers: list[Worker] = []
        self._rank_of_index: dict[int, int] = {}

    def start(self) -> None:
        handles = self.engine.launch(self.spec, self.events)
        ranks = assign_ranks([h.metadata for h in handles])
        workers = sorted(
            (Worker(h, r) for h, r in zip(handles, ranks, strict=True)),
            key=lambda w: w.world_rank,
        )
        for worker in workers:
            worker.handle.set_rank(worker.world_rank)
            self._rank_of_index[worker.handle.index] = worker.world_rank
        self.workers = workers

    def __len__(self) -> int:
        return len(self.workers)

    def rank_of(self, worker_index: int) -> int:
        return self._rank_of_index[worker_index]

    @property
    def scaling_config(self) -> ScalingConfig:
        return self.spec.scaling_config

    @property
    def process_per_worker(self) -> bool:
        return self.engine.process_per_worker

    def get_resources_per_worker(self) -> dict[str, float]:
        return self.spec.scaling_config._resources_per_worker_not_none

    def execute_async(
        self, fn: Callable[..., T], *args: object, **kwargs: object
    ) -> list[Future[T]]:
        return [w.handle.execute(fn, *args, **kwargs) for w in self.workers]

    def execute(
        self,
        fn: Callable[..., T],
        *args: object,
        timeout_s: float | None = None,
        **kwargs: object,
    ) -> list[T]:
        """Run ``fn`` on every rank; raise WorkerGroupError naming the ranks that failed."""
        return self.gather(self.execute_async(fn, *args, **kwargs), timeout_s)

    def execute_single_async(
        self, rank: int, fn: Callable[..., T], *args: object, **kwargs: object
    ) -> Future[T]:
        return self.workers[rank].handle.execute(fn, *args, **kwargs)

    def execute_single(
        self,
        rank: int,
        fn: Callable[..., T],
        *args: object,
        timeout_s: float | None = None,
        **kwargs: object,
    ) -> T:
        """Run ``fn`` on one rank; raise WorkerGroupError if it fails or does not answer."""
        future = self.workers[rank].handle.execute(fn, *args, **kwargs)
        return self._gather({rank: future}, timeout_s)[rank]

    def execute_per_rank(
        self,
        fn: Callable[..., T],
        args_per_rank: Sequence[tuple[object, ...]],
        timeout_s: float | None = None,
    ) -> list[T]:
        """Run ``fn(*args_per_rank[r])`` on each rank ``r``; results in rank order."""
        futures = [
            w.handle.execute(fn, *args) for w, args in zip(self.workers, args_per_rank, strict=True)
        ]
        return self.gather(futures, timeout_s)

    def gather(self, futures: Sequence[Future[T]], timeout_s: float | None = None) -> list[T]:
        """The results of one call per rank, in rank order."""
        results = self._gather(dict(enumerate(futures)), timeout_s)
        return [results[rank] for rank in range(len(futures))]

    def _gather(self, futures: dict[int, Future[T]], timeout_s: float | None) -> dict[int, T]:
        """The results by rank; raise WorkerGroupError naming each rank that failed or did not
        answer within ``timeout_s``."""
        done, pending = wait_futures(futures.values(), timeout=timeout_s)
        failures = {
            rank: self.failure(rank, f.exception())
            for rank, f in futures.items()
            if f in done and f.exception() is not None
        }
        for rank, f in futures.items():
            if f in pending:
                failures[rank] = WorkerFailure(
                    rank,
                    "hang",
                    "TimeoutError",
                    f"no answer within {timeout_s} s",
                    pid=self.workers[rank].metadata.pid,
                    time=time.time(),
                )
        if failures:
            raise WorkerGroupError(failures)
        return {rank: f.result() for rank, f in futures.items()}

    def failure(
        self, rank: int, exc: BaseException | None, returncode: int | None = None
    ) -> WorkerFailure:
        """Describe what happened to ``rank`` from a call's exception or an exit code."""
        meta = self.workers[rank].metadata
        common: dict[str, Any] = {"pid": meta.pid, "host": meta.host, "time": time.time()}
        if isinstance(exc, RemoteCallError):
            r = exc.remote
            kind = "preempted" if r.type_name == "PreemptionStop" else "exception"
            return WorkerFailure(
                rank, kind, r.type_name, r.message, r.traceback, exception=r.exception, **common
            )
        if returncode is not None and returncode < 0:
            return WorkerFailure(
                rank,
                "signal",
                "WorkerKilled",
                f"signal {-returncode}",
                signal=-returncode,
                **common,
            )
        if returncode is not None:
            return WorkerFailure(
                rank,
                "exit",
                "WorkerExited",
                f"exit code {returncode}",
                exit_code=returncode,
                **common,
            )
        return WorkerFailure(rank, "exit", type(exc).__name__, str(exc), **common)

    def shutdown(self, graceful: bool, grace_s: float = 2.0, reuse: bool = False) -> None:
        """Stop every worker: ``graceful`` lets them exit on their own first; ``reuse`` (a
        failed attempt) lets the engine keep the live ones for the next attempt."""
        handles = [w.handle for w in self.workers]
        if reuse:
            self.engine.park(handles)
        else:
            self.engine.shutdown(handles, grace_s if graceful else 0.0)

    def collect_stacks(self, timeout_s: float = 2.0) -> dict[int, str]:
        """Every rank's Python stacks, by rank (ranks the engine cannot reach are missing)."""
        by_index = self.engine.collect_stacks([w.handle for w in self.workers], timeout_s)
        return {self.rank_of(i): text for i, text in by_index.items()}

    def notify_preemption(self, notice: dict[str, Any]) -> None:
        self.engine.notify_preemption([w.handle for w in self.workers], notice)


if TYPE_CHECKING:

    def _implements_the_public_protocol(group: WorkerGroup) -> backend.WorkerGroup:
        return group  # mypy: WorkerGroup offers everything phalanx.backend.WorkerGroup promises
