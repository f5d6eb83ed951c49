"""prepare_data_loader: a DistributedSampler, batches on the device, set_epoch handled."""

from __future__ import annotations

import collections.abc
import logging
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

import phalanx.session as session
from phalanx.torch._devices import get_device
from phalanx.torch._model import reproducibility_seed

__all__ = ["prepare_data_loader"]

logger = logging.getLogger(__name__)


def prepare_data_loader(
    data_loader: DataLoader[Any],
    add_dist_sampler: bool = True,
    move_to_device: bool = True,
    auto_transfer: bool = True,
) -> DataLoader[Any]:
    """Make ``data_loader`` give this worker its shard of the data, on its device.

    With more than one worker (and a map-style dataset without a ``DistributedSampler``), the
    loader is rebuilt with a ``DistributedSampler`` that shuffles if the original loader did.
    Each new pass over the returned loader advances that sampler's epoch by one
    (``sampler.set_epoch``), so every epoch is shuffled differently; if you call
    ``loader.sampler.set_epoch(epoch)`` yourself (as Ray Train's docs ask, and as a resumed run
    should), your value is used instead.
    With ``move_to_device`` every tensor in a batch (also inside tuples, lists and dicts) is
    moved to :func:`get_device`; on a GPU with ``auto_transfer`` the next batch is copied on a
    side stream while the current one is used.

    Example::

        loader = DataLoader(dataset, batch_size=64, shuffle=True)
        loader = phalanx.torch.prepare_data_loader(loader)
        for epoch in range(epochs):
            for x, y in loader:  # this rank's part of the data, already on its device
                ...
    """
    ctx = session.get_context()
    if (
        add_dist_sampler
        and ctx.get_world_size() > 1
        and not isinstance(data_loader.sampler, DistributedSampler)
        and not isinstance(data_loader.dataset, IterableDataset)
    ):
        data_loader = _with_distributed_sampler(
            data_loader, ctx.get_world_size(), ctx.get_world_rank()
        )
    auto_epoch = isinstance(data_loader.sampler, _EpochSampler)
    if not move_to_device and not auto_epoch:
        return data_loader
    device = get_device() if move_to_device else None
    return _PreparedDataLoader(data_loader, device, auto_transfer)


class _EpochSampler(DistributedSampler):  # type: ignore[type-arg]
    """A DistributedSampler that knows whether the user called ``set_epoch`` since last pass."""

    user_set_epoch = False

    def set_epoch(self, epoch: int) -> None:
        self.user_set_epoch = True
        super().set_epoch(epoch)


def _with_distributed_sampler(loader: DataLoader[Any], world: int, rank: int) -> DataLoader[Any]:
    if loader.batch_size is None:
        logger.warning(
            "prepare_data_loader: this DataLoader has a custom batch_sampler, so no "
            "DistributedSampler was added; every rank reads the whole dataset. HINT: shard it in "
            "your batch_sampler, or pass batch_size= and sampler= instead."
        )
        return loader
    if not isinstance(loader.sampler, SequentialSampler | RandomSampler) and rank == 0:
        logger.warning(
            "prepare_data_loader replaces the loader's %s with a DistributedSampler. "
            "HINT: pass add_dist_sampler=False to keep it.",
            type(loader.sampler).__name__,
        )
    seed = reproducibility_seed()
    sampler = _EpochSampler(
        loader.dataset,
        num_replicas=world,
        rank=rank,
        shuffle=not isinstance(loader.sampler, SequentialSampler),
        seed=seed or 0,
        drop_last=False,
    )
    generator, worker_init_fn = loader.generator, loader.worker_init_fn
    if seed is not None:
        generator = torch.Generator().manual_seed(seed)
        worker_init_fn = _SeededWorkerInit(worker_init_fn)
    extra: dict[str, Any] = {}
    if loader.num_workers > 0:
        extra = {
            "prefetch_factor": loader.prefetch_factor,
            "persistent_workers": loader.persistent_workers,
            "multiprocessing_context": loader.multiprocessing_context,
        }
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        shuffle=False,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=worker_init_fn,
        generator=generator,
        **extra,
    )


class _SeededWorkerInit:
    """Seeds ``random`` and NumPy in each DataLoader worker process from torch's seed."""

    def __init__(self, inner: Callable[[int], None] | None) -> None:
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        seed = torch.initial_seed() % 2**32
        np.random.seed(seed)
        random.seed(seed)
        if self.inner is not None:
            self.inner(worker_id)


class _PreparedDataLoader(DataLoader):  # type: ignore[type-arg]
    """The user's loader, seen through: same attributes, batches moved, epochs counted.

    A subclass so ``isinstance(loader, DataLoader)`` still holds; it takes the wrapped loader's
    attributes instead of running ``DataLoader.__init__`` again.
    """

    def __init__(
        self, loader: DataLoader[Any], device: torch.device | None, auto_transfer: bool
    ) -> None:
        self.__dict__.update(loader.__dict__)
        self._loader = loader
        self._device = device
        self._side_stream = device is not None and device.type == "cuda" and auto_transfer
        self._passes = 0

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self._next_epoch()
        batches = iter(self._loader)
        if self._device is None:
            return batches
        if self._side_stream:
            return _prefetch_on_stream(batches, self._device)
        return (_to_device(batch, self._device) for batch in batches)

    def _next_epoch(self) -> None:
        """Each pass after the first uses the previous pass's epoch + 1, unless the user called
        ``set_epoch`` since: then theirs stands (and later passes count on from it)."""
        sampler = self._loader.sampler
        if isinstance(sampler, _EpochSampler):
            if not sampler.user_set_epoch and self._passes > 0:
                DistributedSampler.set_epoch(sampler, sampler.epoch + 1)
            sampler.user_set_epoch = False
        self._passes += 1


def _to_device(item: Any, device: torch.device, non_blocking: bool = False) -> Any:
    if isinstance(item, torch.Tensor):
        return item.to(device, non_blocking=non_blocking)
    if isinstance(item, collections.abc.Mapping):
        moved = {k: _to_device(v, device, non_blocking) for k, v in item.items()}
        try:
            return type(item)(moved)  # type: ignore[call-arg]
        except TypeError:  # a mapping type that cannot be built from a dict
            return moved
    if isinstance(item, tuple) and hasattr(item, "_fields"):  # a namedtuple
        return type(item)(*(_to_device(v, device, non_blocking) for v in item))
    if isinstance(item, list | tuple):
        return type(item)(_to_device(v, device, non_blocking) for v in item)
    return item


def _tensors(item: Any) -> Iterator[torch.Tensor]:
    if isinstance(item, torch.Tensor):
        yield item
    elif isinstance(item, collections.abc.Mapping):
        for value in item.values():
            yield from _tensors(value)
    elif isinstance(item, list | tuple):
        for value in item:
            yield from _tensors(value)


def _prefetch_on_stream(batches: Iterator[Any], device: torch.device) -> Iterator[Any]:
    """Copy batch n+1 to the GPU on a side stream while batch n is used on the main stream."""
    stream = torch.cuda.Stream(device)

    def load() -> tuple[bool, Any]:
        try:
            batch = next(batches)
        except StopIteration:
            return False, None
        with torch.cuda.stream(stream):
            return True, _to_device(batch, device, non_blocking=True)

    more, batch = load()
    while more:
        current = torch.cuda.current_stream(device)
        current.wait_stream(stream)
        for tensor in _tensors(batch):
            if tensor.device.type == "cuda":
                tensor.record_stream(current)  # its memory is used by the main stream now
        more, upcoming = load()
        yield batch
        batch = upcoming
