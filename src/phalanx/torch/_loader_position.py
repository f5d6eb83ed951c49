"""Where a prepared DataLoader is in its epoch, and where it goes on after a restart.

A map-style loader's order in an epoch is ``DistributedSampler``'s: a deterministic function of
the dataset's size, the seed, the epoch, ``shuffle``, ``drop_last`` and the world size. So a
rank's position is a few integers (the epoch and how many of its samples were yielded to the
user), and on resume the samples any old rank consumed are recomputed from them; the rest of
that epoch is split over the new world size the way ``DistributedSampler`` splits a dataset
(interleaved, padded by repeating the first samples, or cut with ``drop_last``).

A rank's state (``position_state()``, one per report)::

    {"kind": "map", "epoch": 3, "yielded": 640, "size": 5000, "world_size": 4, "rank": 1,
     "seed": 0, "shuffle": True, "drop_last": False}

plus ``"resumed": <record>`` while the epoch is one continued from a checkpoint: that rank's
order is then its share of what ``<record>`` left of the epoch (so a second failure in the same
epoch is resumed exactly too). A record is ``{"world_size": W, "ranks": [state, ...]}``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler

__all__ = [
    "EpochSampler",
    "MapPosition",
    "ResumePoint",
    "StatefulPosition",
    "global_order",
    "plan_resume",
    "rank_state",
    "remaining",
    "resume_point",
    "resumed_epoch",
    "split",
    "track_map",
    "warn_once",
]

logger = logging.getLogger(__name__)


def global_order(size: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The epoch's order of the whole dataset, as ``DistributedSampler`` draws it."""
    if not shuffle:
        return list(range(size))
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(size, generator=generator).tolist()


def split(order: list[int], world_size: int, rank: int, drop_last: bool) -> list[int]:
    """``rank``'s part of ``order``, as ``DistributedSampler`` splits its indices: every
    ``world_size``-th sample from ``rank`` on, after padding ``order`` to a multiple of
    ``world_size`` by repeating its first samples (or, with ``drop_last``, cutting its tail).

    >>> split([5, 6, 7], 2, 1, drop_last=False)
    [6, 5]
    >>> split([5, 6, 7], 2, 1, drop_last=True)
    [6]
    """
    size = len(order)
    if size == 0:
        return []
    if drop_last and size % world_size:
        per_rank = math.ceil((size - world_size) / world_size)
    else:
        per_rank = math.ceil(size / world_size)
    total = per_rank * world_size
    if total > size:
        padding = total - size
        order = order + (order * math.ceil(padding / size))[:padding]
    return order[rank:total:world_size]


def remaining(record: dict[str, Any]) -> tuple[int, list[int]] | None:
    """The epoch a record is in, and that epoch's samples no old rank consumed, in the epoch's
    order (None: no rank had started). Ranks at a later epoch than the others finished it."""
    states = [s for s in record.get("ranks", []) if isinstance(s, dict) and s.get("kind") == "map"]
    if not states:
        return None
    epoch = min(int(s["epoch"]) for s in states)
    reference = next(s for s in states if s["epoch"] == epoch)
    order = _epoch_order(reference)
    world, drop_last = int(reference["world_size"]), bool(reference["drop_last"])
    consumed: set[int] = set()
    for state in states:
        mine = split(order, world, int(state["rank"]), drop_last)
        done = len(mine) if state["epoch"] > epoch else int(state["yielded"])
        consumed.update(mine[:done])
    if drop_last:  # the tail the old split cut was not in this epoch
        order = order[: len(split(order, world, 0, True)) * world]
    return epoch, [i for i in order if i not in consumed]


def _epoch_order(state: dict[str, Any]) -> list[int]:
    """The order the state's epoch was split from: the dataset's (a fresh epoch) or what the
    record it resumed from left of it."""
    resumed = state.get("resumed")
    if isinstance(resumed, dict):
        left = remaining(resumed)
        return left[1] if left is not None else []
    return global_order(
        int(state["size"]), int(state["seed"]), int(state["epoch"]), bool(state["shuffle"])
    )


@dataclass(frozen=True)
class ResumePoint:
    """Where a loader starts after a restart: the checkpoint's ``epoch``, this rank's ``share``
    of what was left of it, and ``left``/``size`` for the log line. ``left == 0``: the epoch had
    been consumed."""

    epoch: int
    share: list[int]
    left: int
    size: int
    record: dict[str, Any]


def plan_resume(
    record: dict[str, Any], size: int, world_size: int, rank: int, drop_last: bool
) -> ResumePoint | None:
    """This rank's start after a restart from ``record`` (None: nothing to continue: no rank had
    started, or the dataset's size changed, so the old indices mean other samples).

    >>> old = {"kind": "map", "epoch": 1, "size": 6, "world_size": 2, "seed": 0,
    ...        "shuffle": False, "drop_last": False}
    >>> record = {"world_size": 2, "ranks": [{**old, "rank": 0, "yielded": 2},
    ...                                       {**old, "rank": 1, "yielded": 1}]}
    >>> point = plan_resume(record, size=6, world_size=1, rank=0, drop_last=False)
    >>> point.epoch, point.share  # rank 0 had 0, 2; rank 1 had 1
    (1, [3, 4, 5])
    """
    states = [s for s in record.get("ranks", []) if isinstance(s, dict)]
    if any(s.get("kind") != "map" or s.get("size") != size for s in states):
        return None
    left = remaining(record)
    if left is None:
        return None
    epoch, order = left
    kept = {"world_size": record.get("world_size"), "ranks": record.get("ranks")}
    return ResumePoint(epoch, split(order, world_size, rank, drop_last), len(order), size, kept)


class MapPosition:
    """One map-style loader's position on this rank: counters bumped per batch, the state built
    only when asked (``position_state``, with every report)."""

    def __init__(
        self, size: int, world_size: int, rank: int, seed: int, shuffle: bool, drop_last: bool
    ) -> None:
        self._fixed = {
            "kind": "map",
            "size": size,
            "world_size": world_size,
            "rank": rank,
            "seed": seed,
            "shuffle": shuffle,
            "drop_last": drop_last,
        }
        self.batch_size = 1
        self.epoch: int | None = None
        self.batches = 0  # yielded to the user in this pass
        self.length = 0  # samples in this rank's order for this pass
        self.finished = False
        self.resumed: dict[str, Any] | None = None

    def finish(self) -> None:
        self.finished = True

    def start_pass(self, epoch: int, length: int, resumed: dict[str, Any] | None) -> None:
        self.epoch, self.length, self.resumed = epoch, length, resumed
        self.batches, self.finished = 0, False

    def position_state(self) -> dict[str, Any] | None:
        if self.epoch is None:
            return None
        done = self.batches * self.batch_size
        state = self._fixed.copy()
        state["epoch"] = self.epoch
        state["yielded"] = self.length if self.finished or done > self.length else done
        if self.resumed is not None:
            state["resumed"] = self.resumed
        return state


class StatefulPosition:
    """An iterable dataset's position on this rank: its ``StatefulDataLoader``'s state, taken
    again only after a new batch (a report between two batches reuses it)."""

    def __init__(self, loader: Any, world_size: int, rank: int) -> None:
        self._loader = loader
        self._fixed = {"kind": "stateful", "world_size": world_size, "rank": rank}
        self.batches = 0  # batches yielded, and ends of passes: when it moves, the state did
        self._taken_at = -1
        self._state: dict[str, Any] | None = None
        self._unsaveable = False

    def finish(self) -> None:
        self.batches += 1

    def position_state(self) -> dict[str, Any] | None:
        if self.batches == 0 or self._unsaveable:
            return None
        if self._taken_at != self.batches:
            state = self._loader.state_dict()
            if self._taken_at < 0 and not _json_round_trips(state):
                self._unsaveable = True
                return None
            self._state = {**self._fixed, "state": state}
            self._taken_at = self.batches
        return self._state


def _json_round_trips(state: Mapping[str, object]) -> bool:
    """Whether the checkpoint's JSON file keeps ``state`` as it is (checked once per loader: a
    dataset's state keeps its shape from batch to batch)."""
    try:
        if json.loads(json.dumps(state)) == state:
            return True
        reason = "it holds tuples or non-string keys, which JSON changes"
    except (TypeError, ValueError) as exc:
        reason = f"it is not JSON ({exc})"
    logger.warning(
        "prepare_data_loader: the IterableDataset's state_dict() cannot be saved with the "
        "checkpoint: %s; after a restart it starts from its beginning. HINT: return only "
        "str/int/float/bool/None, lists and dicts with str keys from state_dict().",
        reason,
    )
    return False


class EpochSampler(DistributedSampler):  # type: ignore[type-arg]
    """A DistributedSampler that knows whether the user called ``set_epoch`` since last pass,
    and gives this rank's share of a resumed epoch's rest (``share``) instead of an epoch."""

    user_set_epoch = False
    share: list[int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.user_set_epoch = True
        super().set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        if self.share is not None:
            return iter(self.share)
        return super().__iter__()

    def __len__(self) -> int:
        return len(self.share) if self.share is not None else super().__len__()


def resumed_epoch(sampler: EpochSampler, point: ResumePoint) -> dict[str, Any] | None:
    """Set up the first pass after a restart; the record it continues (None: a whole epoch).

    No ``set_epoch`` call: the checkpoint's epoch if it was unfinished, else the next one.
    ``set_epoch(E)`` with the checkpoint's epoch: its rest (empty if it was finished). Another
    epoch: that whole epoch, and the rest of ``E`` is skipped (a warning says so).
    """
    finished = point.left == 0
    if not sampler.user_set_epoch:
        DistributedSampler.set_epoch(sampler, point.epoch + 1 if finished else point.epoch)
    if sampler.epoch == point.epoch:
        sampler.share = point.share
        return point.record
    if not (finished and sampler.epoch == point.epoch + 1):
        logger.warning(
            "prepare_data_loader: the checkpoint was taken in epoch %d (%d of its %d samples "
            "not yet trained), but set_epoch(%d) was called before the first pass, so the rest "
            "of epoch %d is skipped. HINT: start your epoch loop at the epoch the checkpoint "
            "was taken in (save it with the checkpoint) to continue it.",
            point.epoch,
            point.left,
            point.size,
            sampler.epoch,
            point.epoch,
        )
    return None


def track_map(loader: DataLoader[Any], key: str) -> MapPosition | None:
    """A position for a loader whose order can be recomputed (None, and a warning, otherwise)."""
    sampler = loader.sampler
    if loader.batch_size is None:
        warn_once(key, "it has a custom batch_sampler")
        return None
    if isinstance(sampler, EpochSampler):
        position = MapPosition(
            len(sampler.dataset),  # type: ignore[arg-type]
            sampler.num_replicas,
            sampler.rank,
            sampler.seed,
            sampler.shuffle,
            sampler.drop_last,
        )
    elif isinstance(sampler, SequentialSampler):  # one worker, in order: range(len(dataset))
        position = MapPosition(len(sampler), 1, 0, 0, False, False)
    else:
        warn_once(key, f"its {type(sampler).__name__} is not one phalanx added")
        return None
    position.batch_size = loader.batch_size
    return position


def resume_point(
    loader: DataLoader[Any], key: str, record: dict[str, Any] | None, world: int, rank: int
) -> ResumePoint | None:
    if record is None or not isinstance(loader.sampler, EpochSampler):
        return None
    size = len(loader.sampler.dataset)  # type: ignore[arg-type]
    point = plan_resume(record, size, world, rank, loader.sampler.drop_last)
    if point is None:
        logger.warning(
            "prepare_data_loader: %s's position in the checkpoint does not fit this loader (a "
            "dataset of another size, or another kind of loader), so its first pass is a whole "
            "epoch. HINT: prepare the same loaders, in the same order, as the run that saved it.",
            key,
        )
    elif rank == 0 and point.left == 0:
        logger.info("prepare_data_loader: %s had finished epoch %d", key, point.epoch)
    elif rank == 0:
        logger.info(
            "prepare_data_loader: %s continues epoch %d at sample %s of %s (the %s left are "
            "split over %d worker(s))",
            key,
            point.epoch,
            f"{point.size - point.left:,}",
            f"{point.size:,}",
            f"{point.left:,}",
            world,
        )
    return point


def rank_state(
    record: dict[str, Any] | None, key: str, world: int, rank: int
) -> dict[str, Any] | None:
    if record is None:
        return None
    if record.get("world_size") != world:
        logger.warning(
            "prepare_data_loader: %s's IterableDataset was at a position saved by %s worker(s); "
            "a dataset's own state cannot be split over %d, so it starts from its beginning. "
            "HINT: resume with %s worker(s) to continue it, or use a map-style dataset.",
            key,
            record.get("world_size"),
            world,
            record.get("world_size"),
        )
        return None
    ranks = record.get("ranks") or []
    saved = ranks[rank] if rank < len(ranks) else None
    return saved.get("state") if isinstance(saved, dict) else None


_warned: set[str] = set()


def warn_once(key: str, reason: str) -> None:
    if key in _warned:
        return
    _warned.add(key)
    logger.warning(
        "prepare_data_loader: the position of %s is not saved with checkpoints because %s; "
        "after a restart it starts from its beginning. HINT: use a map-style dataset with the "
        "sampler phalanx adds, or an IterableDataset with state_dict()/load_state_dict().",
        key,
        reason,
    )
