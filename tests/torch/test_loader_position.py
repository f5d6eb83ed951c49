"""prepare_data_loader's exact position, without a Trainer: the re-split of an epoch's rest over
a new world size, the set_epoch rule of the first pass after a restart, the count of samples
yielded (not read ahead by the loader's worker processes), iterable datasets' own state."""

from __future__ import annotations

import gc
import itertools
import logging
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from phalanx._internal.worker import data_wait
from phalanx.torch._data_loader import _PreparedDataLoader, _track_iterable
from phalanx.torch._loader_position import (
    EpochSampler,
    MapPosition,
    global_order,
    plan_resume,
    split,
)

# -- the order is DistributedSampler's -------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "world", "shuffle", "drop_last"),
    # a list: pytest 9.2 refuses an iterator as parametrize values
    list(itertools.product([1, 5, 7, 12], [1, 2, 3, 4], [True, False], [True, False])),
)
def test_order_is_torch_distributed_samplers(size, world, shuffle, drop_last):
    for rank, epoch in itertools.product(range(world), [0, 3]):
        sampler = DistributedSampler(
            range(size), num_replicas=world, rank=rank, shuffle=shuffle, seed=5, drop_last=drop_last
        )
        sampler.set_epoch(epoch)
        assert split(global_order(size, 5, epoch, shuffle), world, rank, drop_last) == list(sampler)


# -- the re-split ----------------------------------------------------------------------------


def _stage(
    size: int,
    world: int,
    record: dict[str, Any] | None,
    steps: int | None,
    batch: int,
    shuffle: bool,
    drop_last: bool,
) -> tuple[list[list[int]], dict[str, Any]]:
    """Every rank of one attempt: its order for the epoch (a fresh epoch 2, or its share of
    ``record``'s rest), ``steps`` batches of it trained in lockstep (None: the whole pass);
    what each rank trained, and the record a checkpoint then would hold."""
    trained, states = [], []
    for rank in range(world):
        position = MapPosition(size, world, rank, 11, shuffle, drop_last)
        position.batch_size = batch
        if record is None:
            epoch, order, resumed = (
                2,
                split(global_order(size, 11, 2, shuffle), world, rank, drop_last),
                None,
            )
        else:
            point = plan_resume(record, size, world, rank, drop_last)
            assert point is not None
            epoch, order, resumed = point.epoch, point.share, point.record
        position.start_pass(epoch, len(order), resumed)
        if steps is None:
            position.finish()
            trained.append(order)
        else:
            position.batches = steps
            trained.append(order[: steps * batch])
        states.append(position.position_state())
    assert len({len(t) for t in trained}) == 1  # every rank has as many batches: no rank waits
    return trained, {"world_size": world, "ranks": states}


@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(1, 40),
    worlds=st.lists(st.integers(1, 4), min_size=2, max_size=4),
    batch=st.integers(1, 5),
    steps=st.lists(st.integers(0, 6), min_size=3, max_size=3),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
)
def test_rest_of_the_epoch_is_split_exactly_over_any_new_world_size(
    size, worlds, batch, steps, shuffle, drop_last
):
    """Fail in the epoch with one world size, resume with another, maybe fail again in the same
    epoch: what every attempt trained before its checkpoint, plus the last attempt's whole pass,
    is the epoch, each sample once (DistributedSampler's padding or drop_last apart)."""
    record, attempts = None, []
    for i, world in enumerate(worlds):
        last = i == len(worlds) - 1
        trained, record = _stage(
            size, world, record, None if last else steps[i % 3], batch, shuffle, drop_last
        )
        attempts.append([i for rank in trained for i in rank])
    seen: set[int] = set()
    for world, attempt in zip(worlds, attempts, strict=True):
        assert not seen & set(attempt)  # nothing trained before a checkpoint is trained again
        assert len(attempt) - len(set(attempt)) < world  # repeats: padding only
        seen |= set(attempt)
    if drop_last:
        assert size - len(seen) < sum(worlds)  # each split cuts fewer than its world size
    else:
        assert seen == set(range(size))


def test_a_finished_epoch_leaves_nothing_and_a_rank_ahead_finished_it():
    _, record = _stage(10, 2, None, None, 2, True, False)
    point = plan_resume(record, 10, 3, 0, False)
    assert point is not None and (point.epoch, point.left, point.share) == (2, 0, [])
    ahead = {**record["ranks"][1], "epoch": 3, "yielded": 0}
    behind = {**record["ranks"][0], "yielded": 2}
    point = plan_resume({"world_size": 2, "ranks": [behind, ahead]}, 10, 1, 0, False)
    order = global_order(10, 11, 2, True)
    assert point is not None and point.epoch == 2
    assert point.share == [i for i in order if i not in split(order, 2, 1, False) + order[0:4:2]]


def test_a_record_of_another_dataset_size_or_no_start_is_not_continued():
    _, record = _stage(10, 2, None, 1, 2, True, False)
    assert plan_resume(record, 11, 2, 0, False) is None
    assert plan_resume({"world_size": 2, "ranks": [None, None]}, 10, 2, 0, False) is None


# -- the first pass after a restart ----------------------------------------------------------


def _loader(
    size: int, num_workers: int = 0, drop_last: bool = False
) -> tuple[_PreparedDataLoader, MapPosition]:
    """A prepared loader of ids 0..size-1 on one worker, shuffled with seed 3, and its position."""
    dataset = TensorDataset(torch.arange(size))
    sampler = EpochSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=3)
    loader = DataLoader(
        dataset, batch_size=2, sampler=sampler, num_workers=num_workers, drop_last=drop_last
    )
    position = MapPosition(size, 1, 0, 3, True, False)
    position.batch_size = 2
    return _PreparedDataLoader(loader, None, False, position), position


def _restarted(size: int, epoch: int, trained: int | None) -> _PreparedDataLoader:
    """A loader restarted from a checkpoint taken in ``epoch`` after ``trained`` samples (None:
    after the whole epoch)."""
    _, old = _loader(size)
    old.start_pass(epoch, size, None)
    if trained is None:
        old.finish()
    else:
        old.batches = trained // 2
    loader, _ = _loader(size)
    point = plan_resume({"world_size": 1, "ranks": [old.position_state()]}, size, 1, 0, False)
    assert point is not None
    loader.resume_from(point)
    return loader


def _ids(loader: DataLoader[Any]) -> list[int]:
    return [int(i) for (batch,) in loader for i in batch]


def _epoch(epoch: int, size: int = 10) -> list[int]:
    return global_order(size, 3, epoch, True)


def test_without_set_epoch_the_first_pass_continues_the_checkpoints_epoch():
    loader = _restarted(10, 4, trained=4)
    assert len(loader) == 3  # 6 samples left: the loop and an LR schedule see the short epoch
    assert _ids(loader) == _epoch(4)[4:]
    assert _ids(loader) == _epoch(5)  # then whole epochs, counted on


def test_set_epoch_with_the_checkpoints_epoch_continues_it():
    loader = _restarted(10, 4, trained=4)
    loader.sampler.set_epoch(4)
    assert _ids(loader) == _epoch(4)[4:]
    loader.sampler.set_epoch(5)
    assert _ids(loader) == _epoch(5)


def test_a_finished_epoch_gives_the_next_one_or_an_empty_pass_for_set_epoch_of_it():
    assert _ids(_restarted(10, 4, trained=None)) == _epoch(5)  # Ray's loop: start = epoch + 1
    loader = _restarted(10, 4, trained=None)
    loader.sampler.set_epoch(5)
    assert _ids(loader) == _epoch(5)
    loader = _restarted(10, 4, trained=None)
    loader.sampler.set_epoch(4)  # a loop restarting at the checkpoint's epoch: it is done
    assert _ids(loader) == []
    loader.sampler.set_epoch(5)
    assert _ids(loader) == _epoch(5)


def test_set_epoch_to_another_epoch_skips_the_rest_with_a_warning(caplog):
    loader = _restarted(10, 4, trained=4)
    loader.sampler.set_epoch(5)
    with caplog.at_level(logging.WARNING, logger="phalanx.torch._loader_position"):
        assert _ids(loader) == _epoch(5)
    assert "taken in epoch 4 (6 of its 10 samples not yet trained)" in caplog.text
    assert "HINT: start your epoch loop at the epoch the checkpoint was taken in" in caplog.text


# -- the position is what the user was given -------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_position_counts_batches_yielded_not_those_read_ahead(num_workers):
    loader, position = _loader(11, num_workers=num_workers, drop_last=True)
    assert position.position_state() is None  # before the first batch
    data_wait.take()
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    state = position.position_state()
    assert state is not None and (state["epoch"], state["yielded"]) == (0, 6)
    rest = list(batches)  # the workers end with the pass
    assert len(rest) == 2  # drop_last: the 11th sample is not a batch
    state = position.position_state()
    assert state is not None and state["yielded"] == 11  # a finished pass is the whole epoch
    assert data_wait.take() > 0  # the goodput's data time


class _Counter(IterableDataset):  # type: ignore[type-arg]
    """0, 1, 2, ... split over the loader's worker processes; its own position is its state."""

    def __init__(self, size: int) -> None:
        self.size, self.next = size, 0

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        while self.next < self.size:
            value, self.next = self.next, self.next + 1
            if value % workers == worker:
                yield value
        self.next = 0

    def state_dict(self) -> dict[str, int]:
        return {"next": self.next}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next = state["next"]


class _Stateless(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        return iter(range(3))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_iterable_dataset_with_state_continues_at_the_same_world_size(num_workers):
    def prepared(record: dict[str, Any] | None) -> tuple[_PreparedDataLoader, Any]:
        loader = DataLoader(_Counter(24), batch_size=3, num_workers=num_workers)
        loader, position = _track_iterable(loader, "loader/0", record, 1, 0)
        assert isinstance(loader, StatefulDataLoader) and position is not None
        return _PreparedDataLoader(loader, None, False, position), position

    first, position = prepared(None)
    batches = iter(first)
    seen = [int(i) for _ in range(4) for i in next(batches)]
    state = position.position_state()
    del batches
    gc.collect()  # the first loader's worker processes end
    second, _ = prepared({"world_size": 1, "ranks": [state]})
    rest = [int(i) for batch in second for i in batch]
    assert sorted(seen + rest) == list(range(24))


def test_iterable_positions_are_not_split_and_stateless_ones_not_kept(caplog):
    record = {"world_size": 2, "ranks": [{"kind": "stateful", "state": {}}] * 2}
    with caplog.at_level(logging.WARNING):
        loader, position = _track_iterable(DataLoader(_Counter(6)), "loader/7", record, 1, 0)
        assert position is not None and list(loader) == [torch.tensor([i]) for i in range(6)]
        stateless = DataLoader(_Stateless())
        for _ in range(2):
            assert _track_iterable(stateless, "loader/8", None, 1, 0)[1] is None
    assert "saved by 2 worker(s); a dataset's own state cannot be split over 1" in caplog.text
    assert caplog.text.count("loader/8 is not saved with checkpoints") == 1  # once


class _TensorState(_Counter):
    def state_dict(self) -> dict[str, Any]:
        return {"next": torch.tensor(self.next)}


def test_a_state_json_cannot_keep_is_not_saved_with_a_warning(caplog):
    loader, position = _track_iterable(DataLoader(_TensorState(4)), "loader/9", None, 1, 0)
    assert position is not None
    prepared = _PreparedDataLoader(loader, None, False, position)
    with caplog.at_level(logging.WARNING):
        assert len(list(prepared)) == 4
        assert position.position_state() is None  # rather than a checkpoint that cannot commit
    assert "state_dict() cannot be saved with the checkpoint: it is not JSON" in caplog.text
