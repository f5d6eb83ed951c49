"""Which rows each rank reads: exact, disjoint row ranges over an ordered list of fragments.

A source is a list of fragments (a Parquet row group, a CSV file, a block of an in-memory table),
each with a known number of rows. Concatenate the fragments in an order (their own, or a seeded
permutation that changes every epoch) and cut the rows into ``world_size`` contiguous ranges:
the ranges are disjoint and cover the data, so the shards are too. With ``equal=True`` every
rank gets ``total // world_size`` rows and the last ``total % world_size`` rows of that order are
left out (like Ray's ``streaming_split(equal=True)``), so every rank runs the same number of steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Piece", "epoch_order", "pieces_in_range", "rank_range"]


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
