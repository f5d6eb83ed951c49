"""prepare_data_loader: a DistributedSampler, batches on the device, set_epoch handled, the
position saved with every checkpoint and continued after a restart."""

from __future__ import annotations

import collections.abc
import logging
import random
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

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
from phalanx._internal.worker import data_wait
from phalanx._internal.worker.data_position import DataPositions
from phalanx._internal.worker.session import get_session
from phalanx.torch._devices import get_device
from phalanx.torch._loader_position import (
    EpochSampler,
    MapPosition,
    ResumePoint,
    StatefulPosition,
    rank_state,
    resume_point,
    resumed_epoch,
    track_map,
    warn_once,
)
from phalanx.torch._model import reproducibility_seed

__all__ = ["prepare_data_loader"]

T = TypeVar("T")

logger = logging.getLogger(__name__)


def prepare_data_loader(
    data_loader: DataLoader[T],
    add_dist_sampler: bool = True,
    move_to_device: bool = True,
    auto_transfer: bool = True,
) -> DataLoader[T]:
    """Make ``data_loader`` give this worker its shard of the data, on its device, and continue
    where the checkpoint left it after a restart.

    With more than one worker (and a map-style dataset without a ``DistributedSampler``), the
    loader is rebuilt with a ``DistributedSampler`` that shuffles if the original loader did
    (one worker: a shuffling loader gets one too, with one replica, so its order can be
    recomputed after a restart).
    Each new pass over the returned loader advances that sampler's epoch by one
    (``sampler.set_epoch``), so every epoch is shuffled differently; if you call
    ``loader.sampler.set_epoch(epoch)`` yourself (as Ray Train's docs ask, and as a resumed run
    should), your value is used instead.
    With ``move_to_device`` every tensor in a batch (also inside tuples, lists and dicts) is
    moved to :func:`get_device`; on a GPU with ``auto_transfer`` the next batch is copied on a
    side stream while the current one is used. The time each batch took to arrive counts as
    waiting for data in the run's goodput.

    Exact resume: every ``report()`` carries the sampler's epoch and how many samples this rank
    was given in it. When the function starts again from a checkpoint (a retry, a rerun, a new
    number of workers), the first pass continues that epoch: the samples no old rank was given
    are split over the new workers (padded by repeating a few, as ``DistributedSampler`` pads),
    and later passes are whole epochs. The first pass is the checkpoint's epoch ``E`` when you
    call ``set_epoch(E)`` before it, or no ``set_epoch`` at all (if ``E`` had been finished,
    ``set_epoch(E)`` gives an empty pass and no call starts epoch ``E + 1``); ``set_epoch`` with
    another epoch skips the rest of ``E``, with a warning. An ``IterableDataset`` with
    ``state_dict``/``load_state_dict`` is read through torchdata's ``StatefulDataLoader`` and
    its state restored rank by rank (same number of workers only); other iterable datasets
    start from their beginning. ``add_dist_sampler=False`` keeps your sampler and opts out.

    Example::

        loader = DataLoader(dataset, batch_size=64, shuffle=True)
        loader = phalanx.torch.prepare_data_loader(loader)
        for epoch in range(start_epoch, epochs):  # start_epoch: from your checkpoint
            loader.sampler.set_epoch(epoch)
            for x, y in loader:  # this rank's part of the data, already on its device
                ...
    """
    ctx = session.get_context()
    world, rank = ctx.get_world_size(), ctx.get_world_rank()
    positions = _data_positions()
    key = positions.next_loader_key() if positions is not None else ""
    record = positions.resume_record(key) if positions is not None else None
    device = get_device() if move_to_device else None
    if isinstance(data_loader.dataset, IterableDataset):
        position = None
        if positions is not None:
            data_loader, position = _track_iterable(data_loader, key, record, world, rank)
            if position is not None:
                positions.track(key, position)
                auto_transfer = False  # a side stream reads one batch ahead of the state
        return _PreparedDataLoader(data_loader, device, auto_transfer, position)
    if add_dist_sampler and _needs_sampler(data_loader, world, positions is not None, record):
        data_loader = _with_distributed_sampler(data_loader, world, rank)
    map_position, resume = None, None
    if positions is not None and add_dist_sampler:  # False: the user's own sampler, untracked
        map_position = track_map(data_loader, key)
        if map_position is not None:
            positions.track(key, map_position)
            resume = resume_point(data_loader, key, record, world, rank)
    prepared = _PreparedDataLoader(data_loader, device, auto_transfer, map_position)
    if resume is not None:
        prepared.resume_from(resume)
    return prepared


def _data_positions() -> DataPositions | None:
    return getattr(get_session(), "data_positions", None)


def _needs_sampler(
    loader: DataLoader[object], world: int, tracking: bool, record: Mapping[str, object] | None
) -> bool:
    """A DistributedSampler is added with several workers, and with one where the order must be
    recomputable: a shuffling loader, or one continuing a checkpoint's epoch."""
    if isinstance(loader.sampler, DistributedSampler):
        return False
    if world > 1:
        return True
    plain = isinstance(loader.sampler, SequentialSampler | RandomSampler)
    shuffled = isinstance(loader.sampler, RandomSampler)
    return tracking and plain and loader.batch_size is not None and (shuffled or bool(record))


def _with_distributed_sampler(loader: DataLoader[T], world: int, rank: int) -> DataLoader[T]:
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
    sampler = EpochSampler(
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
    return _rebuilt(
        loader,
        type(loader) if _is_stateful(loader) else DataLoader,
        shuffle=False,
        sampler=sampler,
        worker_init_fn=worker_init_fn,
        generator=generator,
    )


def _rebuilt(loader: DataLoader[T], cls: type, **changes: object) -> DataLoader[T]:
    """A new loader of class ``cls`` with ``loader``'s settings, but ``changes``."""
    kwargs: dict[str, Any] = {
        "batch_size": loader.batch_size,
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "drop_last": loader.drop_last,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "generator": loader.generator,
    }
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
        kwargs["persistent_workers"] = loader.persistent_workers
        kwargs["multiprocessing_context"] = loader.multiprocessing_context
    rebuilt: DataLoader[T] = cls(loader.dataset, **{**kwargs, **changes})
    return rebuilt


def _is_stateful(loader: DataLoader[object]) -> bool:
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        return False
    return isinstance(loader, StatefulDataLoader)


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
    """The user's loader, seen through: same attributes, batches moved, epochs counted, the
    position kept.

    A subclass so ``isinstance(loader, DataLoader)`` still holds; it takes the wrapped loader's
    attributes instead of running ``DataLoader.__init__`` again.
    """

    def __init__(
        self,
        loader: DataLoader[Any],
        device: torch.device | None,
        auto_transfer: bool,
        position: MapPosition | StatefulPosition | None = None,
    ) -> None:
        self.__dict__.update(loader.__dict__)
        self._loader = loader
        self._device = device
        self._side_stream = device is not None and device.type == "cuda" and auto_transfer
        self._passes = 0
        self._position = position
        self.resume: ResumePoint | None = None  # the checkpoint's epoch, for the first pass

    def resume_from(self, point: ResumePoint) -> None:
        """Start at ``point``: until the first pass, the loader (and ``len``) is that of the
        checkpoint's epoch's rest, or of the next epoch if it was finished."""
        sampler = self._loader.sampler
        assert isinstance(sampler, EpochSampler)
        finished = point.left == 0
        DistributedSampler.set_epoch(sampler, point.epoch + 1 if finished else point.epoch)
        sampler.share = None if finished else point.share
        self.resume = point

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self._next_epoch()
        batches: Iterator[Any] = iter(self._loader)
        if self._device is not None:
            if self._side_stream:
                batches = _prefetch_on_stream(batches, self._device)
            else:
                batches = (_to_device(batch, self._device) for batch in batches)
        return _counted(batches, self._position)

    def _next_epoch(self) -> None:
        """Each pass after the first uses the previous pass's epoch + 1, unless the user called
        ``set_epoch`` since: then theirs stands (and later passes count on from it). The first
        pass after a restart may continue the checkpoint's epoch (``resumed_epoch``)."""
        sampler = self._loader.sampler
        resumed = None
        if isinstance(sampler, EpochSampler):
            if not sampler.user_set_epoch and self._passes > 0:
                DistributedSampler.set_epoch(sampler, sampler.epoch + 1)
            sampler.share = None
            if self.resume is not None:
                resumed = resumed_epoch(sampler, self.resume)
            sampler.user_set_epoch = False
        self.resume = None
        epoch = sampler.epoch if isinstance(sampler, EpochSampler) else self._passes
        self._passes += 1
        if isinstance(self._position, MapPosition):
            self._position.start_pass(epoch, len(sampler), resumed)  # type: ignore[arg-type]


def _counted(
    batches: Iterator[Any], position: MapPosition | StatefulPosition | None
) -> Iterator[Any]:
    """The batches as the user gets them: each counted (the position is what was *yielded*, not
    what the loader's workers read ahead) and its wait added to the goodput's data time."""
    while True:
        asked = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            data_wait.add(time.perf_counter() - asked)
            if position is not None:
                position.finish()
            return
        data_wait.add(time.perf_counter() - asked)
        if position is not None:
            position.batches += 1
        yield batch


def _track_iterable(
    loader: DataLoader[T], key: str, record: dict[str, Any] | None, world: int, rank: int
) -> tuple[DataLoader[T], StatefulPosition | None]:
    """An IterableDataset with ``state_dict``/``load_state_dict``, read through a
    ``StatefulDataLoader`` (which also takes the state in each of its worker processes, aligned
    with the batches yielded), restored from ``record`` when the world size is the same."""
    dataset = loader.dataset
    if not (hasattr(dataset, "state_dict") and hasattr(dataset, "load_state_dict")):
        warn_once(key, "its IterableDataset has no state_dict()/load_state_dict()")
        return loader, None
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        warn_once(key, "torchdata is not installed (pip install 'phalanx[torch]')")
        return loader, None
    if not isinstance(loader, StatefulDataLoader):
        with warnings.catch_warnings():
            # torchdata 0.11 calls torch.set_vital, deprecated in torch 2.13: not the user's
            # call, and this loader is one phalanx chose to build
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
            loader = _rebuilt(loader, StatefulDataLoader)
    state = rank_state(record, key, world, rank)
    if state is not None:
        loader.load_state_dict(state)  # type: ignore[attr-defined]
    return loader, StatefulPosition(loader, world, rank)


def _to_device(item: object, device: torch.device, non_blocking: bool = False) -> Any:
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


def _tensors(item: object) -> Iterator[torch.Tensor]:
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
