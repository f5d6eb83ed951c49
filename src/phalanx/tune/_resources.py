"""What a trial needs to run, and the sweep's share of this machine that it waits for.

A trial holds resources only while its workers exist: a Train run inside it (the V2 form, or a
Trainer given to the Tuner) holds its ScalingConfig's total (``num_workers`` x
``resources_per_worker``) for the length of its ``fit()``; a function trainable holds its
``with_resources`` share (1 CPU by default). The trial's driver thread holds nothing. A trial
that needs more than the machine has runs alone instead of waiting forever.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from phalanx.errors import ConfigError

__all__ = ["ResourcePool", "trainer_demand", "with_parameters", "with_resources"]

RESOURCES_ATTR = "_phalanx_tune_resources"
_RAY_BOOKKEEPING = ("memory", "object_store_memory")


class ResourcePool:
    """This machine's CPUs and GPUs, handed to trials as their runs start."""

    def __init__(self, capacity: dict[str, float]) -> None:
        self.capacity = {k: float(v) for k, v in capacity.items()}
        self._used: dict[str, float] = {}
        self._cond = threading.Condition()
        self.waiting = 0
        self._tickets = itertools.count()
        self._queue: list[tuple[int, int]] = []

    @classmethod
    def local(cls) -> ResourcePool:
        from phalanx._internal.engines.local.resources import visible_gpu_ids

        return cls({"CPU": float(os.cpu_count() or 1), "GPU": float(len(visible_gpu_ids()))})

    @classmethod
    def ray_cluster(cls) -> ResourcePool:
        """The Ray cluster's resources (its live nodes' CPUs, GPUs and custom resources, summed),
        for trials whose runs use the Ray engine; connects to Ray (or starts it) as the engine
        would. Sized once, when the first such trial starts."""
        from phalanx._internal.engines.ray.engine import alive_node_resources, ensure_ray

        ensure_ray()
        total: dict[str, float] = {}
        for node in alive_node_resources():
            for key, value in node.items():
                if key in _RAY_BOOKKEEPING or key.startswith("node:"):
                    continue
                total[key] = total.get(key, 0.0) + float(value)
        return cls(total)

    def _fits(self, demand: dict[str, float]) -> bool:
        return all(
            self._used.get(k, 0.0) + v <= self.capacity.get(k, 0.0) for k, v in demand.items()
        )

    def clip(self, demand: dict[str, float]) -> dict[str, float]:
        """The demand, each amount at most the machine's (such a trial runs alone)."""
        return {k: min(v, self.capacity.get(k, 0.0)) for k, v in demand.items() if v > 0}

    def acquire(
        self, demand: dict[str, float], on_placed: Callable[[], None], priority: int = 0
    ) -> None:
        """Waits until ``demand`` (clipped) fits and no waiter of a lower ``priority`` (an
        older trial) is left, then takes it."""
        demand = self.clip(demand)
        with self._cond:
            ticket = (priority, next(self._tickets))
            self._queue.append(ticket)
            self.waiting += 1
            try:  # the oldest trial first, whichever thread asked first
                self._cond.wait_for(lambda: min(self._queue) == ticket and self._fits(demand))
            finally:
                self.waiting -= 1
                self._queue.remove(ticket)
                self._cond.notify_all()
            self._take(demand)
        on_placed()

    def _take(self, demand: dict[str, float]) -> None:
        for k, v in demand.items():
            self._used[k] = self._used.get(k, 0.0) + v

    def release(self, demand: dict[str, float]) -> None:
        with self._cond:
            for k, v in self.clip(demand).items():
                self._used[k] -= v
            self._cond.notify_all()

    @contextmanager
    def hold(
        self, demand: dict[str, float], on_placed: Callable[[], None], priority: int = 0
    ) -> Iterator[None]:
        self.acquire(demand, on_placed, priority)
        try:
            yield
        finally:
            self.release(demand)

    @contextmanager
    def swap(
        self,
        held: dict[str, float],
        demand: dict[str, float],
        on_placed: Callable[[], None],
        priority: int = 0,
        into: ResourcePool | None = None,
    ) -> Iterator[None]:
        """``held`` given back for the block and ``demand`` taken instead (a trial's driver
        share while its Train run's workers hold theirs), from the pool ``into`` when given (the
        Ray cluster's, for a run on the Ray engine); ``held`` taken again after."""
        self.release(held)
        try:
            with (into or self).hold(demand, on_placed, priority):
                yield
        finally:
            with self._cond:  # at once, not behind the queue: the trial is about to end
                self._take(self.clip(held))

    def free(self) -> dict[str, float]:
        with self._cond:
            return {k: v - self._used.get(k, 0.0) for k, v in self.capacity.items()}


def trainer_demand(trainer: Any) -> dict[str, float]:
    """What a trainer's workers take: ``num_workers`` (the minimum when elastic) times each
    worker's resources; a run with ``num_workers=0`` runs in the driver and takes 1 CPU."""
    scaling = trainer.scaling_config
    workers = scaling.num_workers
    count = min(workers) if isinstance(workers, tuple) else workers
    if count == 0:
        return {"CPU": 1.0}
    per_worker = scaling._resources_per_worker_not_none
    return {
        k.upper() if k.lower() in ("cpu", "gpu") else k: float(v) * count
        for k, v in per_worker.items()
    }


def normalize_resources(resources: Any) -> dict[str, float]:
    if not isinstance(resources, dict):
        raise ConfigError(
            f"with_resources(..., {resources!r}) is invalid: resources must be a dict such as "
            "{'cpu': 2, 'gpu': 1}.\nHINT: placement group factories are not supported; a Train "
            "run inside the trial takes its ScalingConfig's resources by itself."
        )
    out = {}
    for key, value in resources.items():
        name = key.upper() if str(key).lower() in ("cpu", "gpu") else str(key)
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"with_resources: {key}={value!r} must be a number >= 0.")
        out[name] = float(value)
    return out


def with_resources(trainable: Any, resources: dict[str, float] | Any) -> Any:
    """The trainable, holding ``resources`` while each trial runs (Ray Tune's name).

    Example::

        tune.Tuner(tune.with_resources(trainable, {"cpu": 2}), param_space=...)
    """
    normalized = normalize_resources(resources)
    if not callable(trainable):
        raise ConfigError(f"with_resources({trainable!r}, ...): the trainable must be a function.")

    @functools.wraps(trainable)
    def wrapped(config: dict[str, Any]) -> Any:
        return trainable(config)

    setattr(wrapped, RESOURCES_ATTR, normalized)
    return wrapped


def with_parameters(trainable: Callable[..., Any], **kwargs: Any) -> Callable[..., Any]:
    """The trainable, called with ``kwargs`` besides its config (Ray Tune's name: large objects
    such as datasets, passed once rather than in the config).

    Example::

        tune.Tuner(tune.with_parameters(trainable, data=data), param_space=...)
    """
    if not callable(trainable):
        raise ConfigError(f"with_parameters({trainable!r}, ...): the trainable must be a function.")

    @functools.wraps(trainable)
    def wrapped(config: dict[str, Any]) -> Any:
        return trainable(config, **kwargs)

    if hasattr(trainable, RESOURCES_ATTR):
        setattr(wrapped, RESOURCES_ATTR, getattr(trainable, RESOURCES_ATTR))
    return wrapped
