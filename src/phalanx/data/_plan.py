"""Which rows each rank reads: exact, disjoint row ranges over an ordered list of fragments.

A source is a list of fragments (a Parquet row group, a CSV file, a block of an in-memory table),
each with a known number of rows. Concatenate the fragments in an order (their own, or a seeded
permutation that changes every epoch) and cut the rows into ``world_size`` contiguous ranges:
the ranges are disjoint and cover the data, so the shards are too. With ``equal=True`` every
rank gets ``total // world_size`` rows and the last ``total % world_size`` rows of that order are
left out (like Ray's ``streaming_split(equal=True)``), so every rank runs the same number of steps.

A *position* is a row's index in its epoch's order (``0 .. total-1``): the order depends on the
seed, the epoch and the data, never on the world size, so positions name the same rows in every
attempt. Sets of positions are kept as sorted, disjoint ``(start, stop)`` ranges (``Ranges``):
what is left of an epoch after a failure, and each rank's share of it, are such ranges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Assignment",
    "Piece",
    "Ranges",
    "Start",
    "as_ranges",
    "epoch_order",
    "map_ranges",
    "pieces_for_ranges",
    "pieces_in_range",
    "ranges_from_indices",
    "ranges_len",
    "rank_range",
    "subtract_ranges",
    "take_ranges",
]

Ranges = np.ndarray
"""Sorted, disjoint, non-empty ``[start, stop)`` ranges: an int64 array of shape (n, 2) (a
local shuffle leaves thousands, so they stay in numpy)."""


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of fragment ``fragment``."""

    fragment: int
    start: int
    stop: int

    @property
    def num_rows(self) -> int:
        return self.stop - self.start


def rank_range(total: int, rank: int, world_size: int, equal: bool) -> tuple[int, int]:
    """The global row range ``[start, stop)`` of ``rank``."""
    if equal:
        per_rank = total // world_size
        return rank * per_rank, (rank + 1) * per_rank
    return rank * total // world_size, (rank + 1) * total // world_size


def epoch_order(num_fragments: int, seed: int, epoch: int) -> np.ndarray:
    """The fragment order of ``epoch``: the same on every rank for the same seed."""
    return np.random.default_rng([seed, epoch]).permutation(num_fragments)


def pieces_in_range(
    fragment_rows: Sequence[int] | np.ndarray,
    start: int,
    stop: int,
    order: Sequence[int] | np.ndarray | None = None,
) -> list[Piece]:
    """The pieces of fragments (taken in ``order``) that hold global rows ``[start, stop)``."""
    sizes = np.asarray(fragment_rows, dtype=np.int64)
    ids = np.arange(len(sizes)) if order is None else np.asarray(order, dtype=np.int64)
    ordered = sizes[ids]
    ends = np.cumsum(ordered)
    begins = ends - ordered
    pieces = []
    i = int(np.searchsorted(ends, start, side="right"))
    while i < len(ids) and begins[i] < stop:
        lo = max(start, int(begins[i])) - int(begins[i])
        hi = min(stop, int(ends[i])) - int(begins[i])
        if hi > lo:
            pieces.append(Piece(int(ids[i]), lo, hi))
        i += 1
    return pieces


@dataclass(frozen=True, eq=False)
class Start:
    """Where a split's passes begin (from a checkpoint's record): pass 0 is epoch ``epoch``;
    pass ``i < len(partial)`` reads only the positions ``partial[i]`` of its epoch (what the
    checkpoint left of it), split over the ranks; later passes are whole epochs."""

    epoch: int = 0
    partial: tuple[Ranges, ...] = ()


@dataclass(frozen=True, eq=False)
class Assignment:
    """Which rows of the source a rank reads in each pass (each pass is one epoch).

    ``pieces``: fixed pieces of a restricted source, the same every whole epoch (no file
    shuffle): they hold positions ``rank_range(total, ...)`` in order. Otherwise each pass reads
    this rank's positions of the epoch's order: the fragments' own (``seed`` None) or a seeded
    permutation per epoch. ``total`` and ``fingerprint`` describe the whole dataset (a restricted
    source holds only this rank's rows); ``split`` is False for a dataset every rank reads whole.
    """

    pieces: tuple[Piece, ...] | None = None
    seed: int | None = None
    rank: int = 0
    world_size: int = 1
    equal: bool = True
    total: int | None = None
    fingerprint: str = ""
    start: Start = Start()
    split: bool = True

    def epoch_of(self, pass_index: int) -> int:
        return self.start.epoch + pass_index

    def positions(self, source_rows: int, pass_index: int) -> Ranges:
        """This rank's positions in pass ``pass_index``, in the order it reads them."""
        if pass_index < len(self.start.partial):
            base = self.start.partial[pass_index]
            lo, hi = rank_range(ranges_len(base), self.rank, self.world_size, self.equal)
            return take_ranges(base, lo, hi)
        total = source_rows if self.total is None else self.total
        lo, hi = rank_range(total, self.rank, self.world_size, self.equal)
        return as_ranges([(lo, hi)] if hi > lo else [])

    def pieces_for(self, source: Any, pass_index: int) -> list[Piece]:
        if self.pieces is not None and pass_index >= len(self.start.partial):
            return list(self.pieces)
        rows = source.fragment_rows
        order = None
        if self.seed is not None:
            order = epoch_order(len(rows), self.seed, self.epoch_of(pass_index))
        return pieces_for_ranges(rows, self.positions(source.num_rows, pass_index), order)

    def num_rows(self, source: Any) -> int:
        """Rows of a whole epoch's share (a resumed first pass may have fewer)."""
        if self.pieces is not None:
            return sum(p.num_rows for p in self.pieces)
        return ranges_len(self.positions(source.num_rows, len(self.start.partial)))


def pieces_for_ranges(
    fragment_rows: Sequence[int] | np.ndarray,
    ranges: Ranges,
    order: Sequence[int] | np.ndarray | None = None,
) -> list[Piece]:
    """The pieces holding positions ``ranges`` (in that order) of the fragments taken in
    ``order``."""
    if len(ranges) == 1:
        return pieces_in_range(fragment_rows, int(ranges[0, 0]), int(ranges[0, 1]), order)
    sizes = np.asarray(fragment_rows, dtype=np.int64)
    ids = np.arange(len(sizes)) if order is None else np.asarray(order, dtype=np.int64)
    ends = np.cumsum(sizes[ids])
    begins = ends - sizes[ids]
    pieces = []
    for start, stop in ranges.tolist():
        i = int(np.searchsorted(ends, start, side="right"))
        while i < len(ids) and begins[i] < stop:
            lo, hi = max(start, int(begins[i])), min(stop, int(ends[i]))
            if hi > lo:
                pieces.append(Piece(int(ids[i]), lo - int(begins[i]), hi - int(begins[i])))
            i += 1
    return pieces


# -- sets of positions as ranges ------------------------------------------------------------


def as_ranges(value: object) -> Ranges:
    """``[(start, stop), ...]`` (or an array of them) as ``Ranges``."""
    return np.asarray(value, dtype=np.int64).reshape(-1, 2)


def ranges_len(ranges: Ranges) -> int:
    return int((ranges[:, 1] - ranges[:, 0]).sum())


def take_ranges(ranges: Ranges, lo: int, hi: int) -> Ranges:
    """Items ``[lo, hi)`` of the positions ``ranges`` lists, as ranges.

    >>> take_ranges(as_ranges([(0, 3), (10, 13)]), 2, 5).tolist()
    [[2, 3], [10, 12]]
    """
    lens = ranges[:, 1] - ranges[:, 0]
    begins = np.cumsum(lens) - lens
    s, e = np.clip(lo - begins, 0, lens), np.clip(hi - begins, 0, lens)
    keep = e > s
    return np.stack([ranges[keep, 0] + s[keep], ranges[keep, 0] + e[keep]], axis=1)


def map_ranges(positions: Ranges, items: Ranges) -> Ranges:
    """The positions of items ``items`` (sorted ranges of indices into ``positions``).

    >>> map_ranges(as_ranges([(0, 3), (10, 13)]), as_ranges([(1, 2), (3, 5)])).tolist()
    [[1, 2], [10, 12]]
    """
    if not len(items):
        return as_ranges([])
    if len(positions) == 1:
        return _join(items + positions[0, 0])
    lens = positions[:, 1] - positions[:, 0]
    offsets = np.cumsum(lens) - lens
    # cut at every item end and every boundary between position ranges: each piece maps whole
    points = _points(items.ravel(), offsets)
    s, e = points[:-1], points[1:]
    keep = _inside(items, s)
    s, e = s[keep], e[keep]
    j = np.searchsorted(offsets, s, side="right") - 1
    begin = positions[j, 0] + (s - offsets[j])
    return _join(np.stack([begin, begin + (e - s)], axis=1))


def merge_ranges(ranges: object) -> Ranges:
    """Any ranges (overlapping, unsorted, empty) as sorted disjoint ones.

    >>> merge_ranges([(5, 7), (0, 2), (1, 3), (3, 4), (9, 9)]).tolist()
    [[0, 4], [5, 7]]
    """
    arr = as_ranges(ranges)
    arr = arr[arr[:, 1] > arr[:, 0]]
    if not len(arr):
        return arr
    arr = arr[np.argsort(arr[:, 0], kind="stable")]
    reach = np.maximum.accumulate(arr[:, 1])
    new = np.concatenate(([True], arr[1:, 0] > reach[:-1]))
    last = np.concatenate((np.flatnonzero(new)[1:] - 1, [len(arr) - 1]))
    return np.stack([arr[new, 0], reach[last]], axis=1)


def subtract_ranges(base: Ranges, minus: object) -> Ranges:
    """Positions of ``base`` not in ``minus``.

    >>> subtract_ranges(as_ranges([(0, 10)]), [(2, 4), (3, 5), (9, 12)]).tolist()
    [[0, 2], [5, 9]]
    """
    cut = merge_ranges(minus)
    if not len(cut) or not len(base):
        return base
    points = _points(base.ravel(), cut.ravel())
    s, e = points[:-1], points[1:]
    keep = _inside(base, s) & ~_inside(cut, s)
    return _join(np.stack([s[keep], e[keep]], axis=1))


def ranges_from_indices(indices: np.ndarray) -> Ranges:
    """Sorted distinct indices as ranges.

    >>> ranges_from_indices(np.array([1, 2, 3, 7, 9, 10])).tolist()
    [[1, 4], [7, 8], [9, 11]]
    """
    if not len(indices):
        return as_ranges([])
    breaks = np.flatnonzero(np.diff(indices) != 1) + 1
    starts = indices[np.concatenate(([0], breaks))]
    stops = indices[np.concatenate((breaks - 1, [len(indices) - 1]))] + 1
    return np.stack([starts, stops], axis=1).astype(np.int64)


def _points(*bounds: np.ndarray) -> np.ndarray:
    """The distinct bounds, sorted (np.unique's hashing is slower for this)."""
    points = np.sort(np.concatenate(bounds))
    return points[np.concatenate(([True], points[1:] != points[:-1]))]


def _inside(arr: Ranges, x: np.ndarray) -> np.ndarray:
    """Whether each of ``x`` is in one of the sorted disjoint ranges ``arr``."""
    i = np.searchsorted(arr[:, 0], x, side="right") - 1
    return (i >= 0) & (x < arr[np.maximum(i, 0), 1])


def _join(arr: Ranges) -> Ranges:
    """Sorted disjoint ranges with the ones that touch joined."""
    if len(arr) < 2:
        return arr
    touch = arr[1:, 0] == arr[:-1, 1]
    if not touch.any():
        return arr
    starts = arr[np.concatenate(([True], ~touch)), 0]
    stops = arr[np.concatenate((~touch, [True])), 1]
    return np.stack([starts, stops], axis=1)
