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

import numpy as np
import pyarrow as pa

from phalanx.data._batching import arrow_to_numpy

__all__ = ["MixedRows"]


class MixedRows:
    """Each source's rows of a block of steps (``pieces[s]``: the record batches taken from
    source ``s``, in order, ``counts[:, s].sum()`` rows in all) and the rows of each source in
    each step (``counts``, steps x sources).

    >>> a = pa.record_batch({"x": np.arange(6)})
    >>> b = pa.record_batch({"x": np.arange(100, 103)})
    >>> MixedRows([[a], [b]], np.array([[2, 1], [2, 1], [2, 1]])).column("x").tolist()
    [0, 1, 100, 2, 3, 101, 4, 5, 102]
    >>> MixedRows([[a.slice(0, 2), a.slice(2, 1)], [b.slice(0, 2)]], np.array([[1, 2], [2, 0]])
    ...           ).column("x").tolist()
    [0, 100, 101, 1, 2]
    """

    def __init__(self, pieces: list[list[pa.RecordBatch]], counts: np.ndarray) -> None:
        self.counts = counts
        self.rows = int(counts.sum())
        self._pieces = [[arrow_to_numpy(b) for b in source] for source in pieces]
        first = next(cols for source in self._pieces for cols in source)
        self.names = list(first)
        self.sample = first
        """A piece's columns: their dtypes and shapes past the rows (see ``uniform``)."""
        self.uniform = all(
            cols[n].dtype == first[n].dtype and cols[n].shape[1:] == first[n].shape[1:]
            for source in self._pieces
            for cols in source
            for n in self.names
        )
        """Every piece's columns have the sample's dtypes and shapes (a column with nulls in
        one piece only, or lists of another length, may not)."""
        steps = len(counts)
        self._whole = steps == 1 or bool((counts == counts[0]).all())
        # where each source's rows start within a step, and (steps that differ) where each of
        # its rows goes in the block: computed once for every column
        self._lo = (np.cumsum(counts[0]) - counts[0]).tolist()
        self._dest: list[np.ndarray] = []
        if not self._whole:
            step_start = np.cumsum(counts.sum(axis=1)) - counts.sum(axis=1)
            within = np.cumsum(counts, axis=1) - counts
            for s in range(counts.shape[1]):
                c = counts[:, s]
                before = np.cumsum(c) - c
                base = step_start + within[:, s] - before
                self._dest.append(np.repeat(base, c) + np.arange(int(c.sum())))

    def column(self, name: str) -> np.ndarray:
        """Column ``name``'s rows in the block's order, as a new array (the pieces' common
        dtype)."""
        parts = [cols[name] for source in self._pieces for cols in source]
        sample = self.sample[name]
        kind = sample.dtype if self.uniform else np.result_type(*parts)
        out = np.empty((self.rows, *sample.shape[1:]), dtype=kind)
        self.fill(name, out)
        return out

    def fill(self, name: str, out: np.ndarray) -> None:
        """Write column ``name``'s rows into ``out`` (rows along its first axis, any strides)."""
        if self._whole:
            steps, per = len(self.counts), int(self.counts[0].sum())
            grid = out.view()
            grid.shape = (steps, per, *out.shape[1:])  # a view: never a silent copy
        for s, source in enumerate(self._pieces):
            at = 0
            for cols in source:
                part = cols[name]
                if self._whole:
                    _place(grid, self._lo[s], int(self.counts[0, s]), at, part)
                else:
                    out[self._dest[s][at : at + len(part)]] = part
                at += len(part)


def _place(grid: np.ndarray, lo: int, count: int, at: int, part: np.ndarray) -> None:
    """A source's rows ``[at, at + len(part))`` into ``grid`` (steps x rows of a step), where
    its rows of every step are ``count`` rows from ``lo``: the first step's rest, the whole
    steps as one strided copy, the last step's start."""
    n, i = len(part), 0
    step, into = divmod(at, count)
    if into:
        k = min(count - into, n)
        grid[step, lo + into : lo + into + k] = part[:k]
        i, step = k, step + 1
    whole = (n - i) // count
    if whole:
        block = part[i : i + whole * count]
        grid[step : step + whole, lo : lo + count] = block.reshape(whole, count, *part.shape[1:])
        i, step = i + whole * count, step + whole
    if i < n:
        grid[step, lo : lo + n - i] = part[i:]
