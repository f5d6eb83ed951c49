"""The sweep's hold on resources: which running trials have their share, a function
trainable's own share while it runs, and a Train run's workers' share (of this machine, or of
the Ray cluster for a run on the Ray engine) in its place for the length of its ``fit()``."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator

from phalanx.tune._resources import ResourcePool, trainer_demand
from phalanx.tune._trainable import uses_ray
from phalanx.tune._trial import Trial

__all__ = ["Shares"]


class Shares:
    """The trials' shares; ``cond`` is the sweep's lock, notified as a trial gets its share."""

    def __init__(self, cond: threading.Condition) -> None:
        self._cond = cond
        self.pool = ResourcePool.local()
        self._ray_pool: ResourcePool | None = None  # the Ray cluster's, once a run uses Ray
        self._ray_pool_lock = threading.Lock()
        self._placed: set[str] = set()
        self._body_held: dict[str, dict[str, float]] = {}  # a function trainable's own share

    def room(self, live: dict[str, threading.Thread], limit: int | None) -> bool:
        """Another trial may start: every running one has its share and some CPU is free."""
        if limit is not None and len(live) >= limit:
            return False
        pools = [self.pool] if self._ray_pool is None else [self.pool, self._ray_pool]
        if any(p.waiting for p in pools) or any(t not in self._placed for t in live):
            return False  # a trial still waits for its share: no more room
        return not live or any(p.free().get("CPU", 0.0) > 0 for p in pools)

    @contextlib.contextmanager
    def body(self, trial: Trial, trainable: object) -> Iterator[None]:
        """A function trainable's share while it runs (a Trainer given to the Tuner takes its
        workers' share in fit())."""
        from phalanx.trainer import BaseTrainer

        if isinstance(trainable, BaseTrainer):
            self.mark_placed(trial)
            yield
            return
        with self._cond:
            self._placed.discard(trial.trial_id)
        with self.pool.hold(trial.resources, lambda: self.mark_placed(trial), _index(trial)):
            self._body_held[trial.trial_id] = trial.resources
            try:
                yield
            finally:
                self._body_held.pop(trial.trial_id, None)

    @contextlib.contextmanager
    def for_fit(self, trial: Trial, trainer: object) -> Iterator[None]:
        """The Train run's workers' share, in place of the trial's own while it runs."""
        into = self._ray_cluster_pool() if uses_ray(trainer) else None
        with self._cond:
            self._placed.discard(trial.trial_id)
        held = self._body_held.get(trial.trial_id, {})
        placed = functools.partial(self.mark_placed, trial)
        with self.pool.swap(held, trainer_demand(trainer), placed, _index(trial), into=into):
            yield

    def _ray_cluster_pool(self) -> ResourcePool:
        with self._ray_pool_lock:  # not under the sweep's lock: starting Ray takes seconds
            if self._ray_pool is None:
                pool = ResourcePool.ray_cluster()
                with self._cond:
                    self._ray_pool = pool
            return self._ray_pool

    def mark_placed(self, trial: Trial) -> None:
        with self._cond:
            self._placed.add(trial.trial_id)
            self._cond.notify_all()

    def ended(self, trial: Trial) -> None:
        """The trial holds nothing now (called under the sweep's lock)."""
        self._placed.discard(trial.trial_id)


def _index(trial: Trial) -> int:
    """The trial's place in the sweep (its id ends in it): older trials get resources first."""
    tail = trial.trial_id.rpartition("_")[2]
    return int(tail) if tail.isdigit() else 0
