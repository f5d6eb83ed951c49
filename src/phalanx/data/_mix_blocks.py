"""The rows of a mixed block before they are put together (``MixedRows``): each source's rows of
the block's steps, as the numpy columns of the record batches read (zero-copy views), written
straight into the block's final layout, one copy per column.

A mixed block of steps holds, for step ``i``, ``counts[i, s]`` rows of each source ``s`` in turn.
Torch and numpy batches ask ``MixedRows`` for each column's rows in that order, either into memory
of their own (``fill``: a row of a ``(columns, rows)`` group, a column of a ``stack_columns``
block) or as a new array (``column``). Nothing is converted, concatenated or stacked first: the
rows are read once, from the buffers the files were decoded into.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from phalanx.data._batching import arrow_to_numpy

__all__ = ["MixedRows"]

RUN_ROWS = 256
"""Steps that differ are copied run by run (a source's rows of a step: one slice copy per
column) where a run is this many rows on average; shorter runs are scattered by index."""


Piece = tuple[dict[str, np.ndarray], int, int]
"""Rows ``[start, stop)`` of a record batch read, as its numpy columns (converted once per
batch read, however many blocks take from it)."""


class MixedRows:
    """Each source's rows of a block of steps (``pieces[s]``: the pieces taken from source
    ``s``, in order, ``counts[:, s].sum()`` rows in all) and the rows of each source in each
    step (``counts``, steps x sources).

    >>> a = pa.record_batch({"x": np.arange(6)})
    >>> b = pa.record_batch({"x": np.arange(100, 103)})
    >>> MixedRows.of_batches([[a], [b]], np.array([[2, 1], [2, 1], [2, 1]])).column("x").tolist()
    [0, 1, 100, 2, 3, 101, 4, 5, 102]
    >>> MixedRows.of_batches([[a.slice(0, 2), a.slice(2, 1)], [b.slice(0, 2)]],
    ...                      np.array([[1, 2], [2, 0]])).column("x").tolist()
    [0, 100, 101, 1, 2]
    """

    @classmethod
    def of_batches(cls, pieces: list[list[pa.RecordBatch]], counts: np.ndarray) -> MixedRows:
        """The same from whole record batches."""
        return cls([[(arrow_to_numpy(b), 0, b.num_rows) for b in p] for p in pieces], counts)

    def __init__(self, pieces: list[list[Piece]], counts: np.ndarray) -> None:
        self.counts = counts
        self.rows = int(counts.sum())
        self._pieces = pieces
        first = next(cols for source in pieces for cols, _, _ in source)
        self.names = list(first)
        self.sample = first
        """A piece's columns: their dtypes and shapes past the rows (see ``uniform``)."""
        self.uniform = all(
            cols[n].dtype == first[n].dtype and cols[n].shape[1:] == first[n].shape[1:]
            for source in pieces
            for cols, _, _ in source
            for n in self.names
        )
        """Every piece's columns have the sample's dtypes and shapes (a column with nulls in
        one piece only, or lists of another length, may not)."""
        steps = len(counts)
        self._whole = steps == 1 or bool((counts == counts[0]).all())
        # where each source's rows start within a step, and (steps that differ) where each of
        # its rows goes in the block: computed once for every column
        self._dest: list[np.ndarray] = []
        self._moves: list[list[_Move]] = []
        self._runs = False
        if self._whole:
            lo = (np.cumsum(counts[0]) - counts[0]).tolist()
            for s, source in enumerate(self._pieces):
                count, at, moves = int(counts[0, s]), 0, []
                for p, (_, start, stop) in enumerate(source):
                    moves += [(p, *move) for move in _moves(lo[s], count, at, start, stop)]
                    at += stop - start
                self._moves.append(moves)
        else:
            step_start = np.cumsum(counts.sum(axis=1)) - counts.sum(axis=1)
            within = np.cumsum(counts, axis=1) - counts
            runs = int(np.count_nonzero(counts))
            self._runs = self.rows >= RUN_ROWS * runs
            for s, source in enumerate(self._pieces):
                c = counts[:, s]
                before = np.cumsum(c) - c
                if self._runs:  # few long runs (large batches): a slice copy each
                    self._moves.append(_run_moves(source, step_start + within[:, s], before, c))
                else:  # many short runs: one scatter per piece of a source
                    base = step_start + within[:, s] - before
                    self._dest.append(np.repeat(base, c) + np.arange(int(c.sum())))

    def column(self, name: str) -> np.ndarray:
        """Column ``name``'s rows in the block's order, as a new array (the pieces' common
        dtype)."""
        parts = [cols[name] for source in self._pieces for cols, _, _ in source]
        sample = self.sample[name]
        kind = sample.dtype if self.uniform else np.result_type(*parts)
        out = np.empty((self.rows, *sample.shape[1:]), dtype=kind)
        self.fill(name, out)
        return out

    def fill(self, name: str, out: np.ndarray) -> None:
        """Write column ``name``'s rows into ``out`` (rows along its first axis, any strides)."""
        if self._runs:
            for s, moves in enumerate(self._moves):
                source = self._pieces[s]
                for p, into, take, _ in moves:
                    out[into[1]] = source[p][0][name][take]
            return
        if not self._whole:
            for s, source in enumerate(self._pieces):
                at = 0
                for cols, start, stop in source:
                    out[self._dest[s][at : at + stop - start]] = cols[name][start:stop]
                    at += stop - start
            return
        grid = out.view()
        grid.shape = (len(self.counts), int(self.counts[0].sum()), *out.shape[1:])  # no copy
        for s, moves in enumerate(self._moves):
            source = self._pieces[s]
            for p, into, take, shape in moves:
                part = source[p][0][name]
                grid[into] = (
                    part[take] if shape is None else part[take].reshape(*shape, *part.shape[1:])
                )

    def fill_group(self, names: list[str], out: np.ndarray) -> None:
        """Write 1-D columns ``names`` into the rows of ``out`` (``(len(names), rows)``, C
        order): one copy per piece of a source for all the columns at once where the steps
        are alike."""
        if self._runs:
            for s, moves in enumerate(self._moves):
                source = self._pieces[s]
                for p, into, take, _ in moves:
                    cols = source[p][0]
                    np.stack([cols[n][take] for n in names], out=out[:, into[1]])
            return
        if not self._whole:
            for j, name in enumerate(names):
                self.fill(name, out[j])
            return
        grid = out.view()
        grid.shape = (len(names), len(self.counts), int(self.counts[0].sum()))  # no copy
        for s, moves in enumerate(self._moves):
            source = self._pieces[s]
            for p, into, take, shape in moves:
                cols = source[p][0]
                target = grid[(slice(None), into[0], into[1])]
                if shape is None:
                    np.stack([cols[n][take] for n in names], out=target)
                else:
                    np.stack([cols[n][take].reshape(shape) for n in names], out=target)


_Move = tuple[int, tuple[Any, Any], slice, "tuple[int, int] | None"]
"""A piece of a source's rows into a block: the piece, where in the (steps x rows of a step)
grid, which of its rows, and the (steps, rows) shape they take there (None: a run of one
step)."""


def _moves(
    lo: int, count: int, at: int, start: int, stop: int
) -> list[tuple[tuple[Any, Any], slice, tuple[int, int] | None]]:
    """Where a source's rows ``[at, at + stop - start)`` (rows ``[start, stop)`` of a piece)
    go in the grid (steps x rows of a step), its rows of every step being ``count`` rows from
    ``lo``: the first step's rest, the whole steps as one strided copy, the last step's start."""
    out: list[tuple[tuple[Any, Any], slice, tuple[int, int] | None]] = []
    n, i = stop - start, 0
    step, into = divmod(at, count) if count else (0, 0)
    if count and into:
        k = min(count - into, n)
        out.append(((step, slice(lo + into, lo + into + k)), slice(start, start + k), None))
        i, step = k, step + 1
    whole = (n - i) // count if count else 0
    if whole:
        rows = slice(start + i, start + i + whole * count)
        out.append(((slice(step, step + whole), slice(lo, lo + count)), rows, (whole, count)))
        i, step = i + whole * count, step + whole
    if i < n:
        out.append(((step, slice(lo, lo + n - i)), slice(start + i, stop), None))
    return out


def _run_moves(
    source: list[Piece], dest: np.ndarray, before: np.ndarray, counts: np.ndarray
) -> list[_Move]:
    """A source's rows of each step (``counts[i]`` rows from its row ``before[i]``) as slice
    copies to rows ``dest[i]`` on of the block (cut where its pieces end)."""
    out: list[_Move] = []
    ends = np.cumsum([stop - start for _, start, stop in source]).tolist()
    p, piece_lo = 0, 0
    for at, lo, n in zip(dest.tolist(), before.tolist(), counts.tolist()):
        while n:
            while lo >= ends[p]:
                piece_lo, p = ends[p], p + 1
            k = min(n, ends[p] - lo)
            start = source[p][1] + lo - piece_lo
            out.append((p, (None, slice(at, at + k)), slice(start, start + k), None))
            at, lo, n = at + k, lo + k, n - k
    return out
