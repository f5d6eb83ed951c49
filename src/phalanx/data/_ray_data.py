"""``ray.data.Dataset`` objects passed as ``datasets=``: split per worker, as Ray Train does.

A Ray dataset is split with ``streaming_split(world_size, equal=True)``: each rank gets an
iterator over its part of one shared, streaming execution, coordinated by a Ray actor. So it
needs the Ray engine (workers are Ray actors in the same cluster), and every rank must iterate
each epoch: ranks that stop early stall the others, as in Ray Train.

Nothing here imports ``ray`` on import: :func:`is_ray_dataset` only looks at an already imported
``ray.data``, and the other functions receive Ray objects from the caller.

Example (on the driver, with Ray initialised)::

    shards = split_ray_dataset(ray.data.range(1000), world_size=2)
    for batch in shards[0].iter_batches(batch_size=100):  # inside rank 0
        ...
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from phalanx._internal.worker import data_wait
from phalanx.data._iterator import Passes

if TYPE_CHECKING:
    import pandas as pd
    import ray.data

T = TypeVar("T")

__all__ = [
    "RayDataShard",
    "is_ray_dataset",
    "ray_dataset_iterator",
    "split_ray_dataset",
    "with_execution_options",
]


def is_ray_dataset(obj: object) -> bool:
    """True if ``obj`` is a ``ray.data.Dataset`` (False whenever Ray Data was never imported)."""
    ray_data = sys.modules.get("ray.data")
    dataset_cls = getattr(ray_data, "Dataset", None)
    return isinstance(dataset_cls, type) and isinstance(obj, dataset_cls)


def with_execution_options(ds: ray.data.Dataset, options: object) -> ray.data.Dataset:
    """A copy of ``ds`` that runs with ``options`` (``DataConfig(execution_options=...)``;
    None: Ray's ingest defaults), as Ray Train's ``DataConfig.configure`` does."""
    from phalanx._foundation.execution_options import as_ray_options

    copied = type(ds).copy(ds)
    copied.context.execution_options = as_ray_options(options)
    return copied


def split_ray_dataset(ds: ray.data.Dataset, world_size: int) -> list[RayDataShard]:
    """One :class:`RayDataShard` per rank, from ``ds.streaming_split(world_size, equal=True)``."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return [RayDataShard(it) for it in ds.streaming_split(world_size, equal=True)]


def ray_dataset_iterator(ds: ray.data.Dataset) -> RayDataShard:
    """The whole dataset for one rank (a dataset that is not split), as Ray Train gives it."""
    return RayDataShard(ds.iterator())


class RayDataShard:
    """A rank's part of a Ray dataset: Ray's ``DataIterator`` plus ``to_pandas`` and ``count``.

    ``iter_batches``/``iter_torch_batches``/``iter_rows`` take Ray's arguments; every other
    ``DataIterator`` attribute (``materialize``, ``schema``, ``stats``, ``to_torch``...) is passed
    through. Each pass over what an ``iter_*`` call returns (and ``to_pandas``/``count``) is a new epoch
    over the shard. The time the ``iter_*`` iterators make the training loop wait for each batch
    (or row) is counted as the rank's data wait (the goodput's data part), as phalanx's own
    datasets count theirs.
    """

    def __init__(
        self, iterator: Any
    ) -> None:  # Ray's DataIterator: its stubs are stricter than its API
        self._iterator = iterator

    def iter_batches(self, **kwargs: Any) -> Passes:
        return Passes(lambda: timed(iter(self._iterator.iter_batches(**kwargs))))

    def iter_torch_batches(self, **kwargs: Any) -> Passes:
        return Passes(lambda: timed(iter(self._iterator.iter_torch_batches(**kwargs))))

    def iter_rows(self, **kwargs: object) -> Iterator[dict[str, Any]]:
        return timed(iter(self._iterator.iter_rows(**kwargs)))

    def to_pandas(self) -> pd.DataFrame:
        """The whole shard as one pandas DataFrame (one epoch)."""
        import pandas as pd

        frames = list(self._iterator.iter_batches(batch_size=None, batch_format="pandas"))
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def count(self) -> int:
        """Rows in the shard (one epoch)."""
        batches = self._iterator.iter_batches(batch_size=None, batch_format="pyarrow")
        return sum(batch.num_rows for batch in batches)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_iterator":  # unpickling: not set yet
            raise AttributeError(name)
        return getattr(self._iterator, name)

    def __repr__(self) -> str:
        return f"RayDataShard({self._iterator!r})"


def timed(items: Iterator[T]) -> Iterator[T]:
    """``items``, adding the time each ``next()`` took to the rank's data wait; closing it
    closes ``items`` (Ray's read-ahead)."""
    clock = time.perf_counter
    try:
        while True:
            asked = clock()
            try:
                item = next(items)
            except StopIteration:
                data_wait.add(clock() - asked)  # the end of an epoch can be waited for too
                return
            data_wait.add(clock() - asked)
            yield item
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()
