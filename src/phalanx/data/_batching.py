"""Cut a stream of record batches into exact batches, optionally through a shuffle buffer.

Blocks are either pyarrow Tables (for the ``pyarrow`` and ``pandas`` formats) or dicts of numpy
arrays (``numpy`` and torch). Each record batch read from storage is converted once; batches are
then zero-copy slices of it, so small batches cost little more than slicing arrays in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "ARROW",
    "NUMPY",
    "BlockOps",
    "arrow_to_numpy",
    "rebatch",
    "shuffle_blocks",
    "to_arrow_column",
]

B = TypeVar("B")


class BlockOps(Generic[B]):
    def from_arrow(self, batch: pa.RecordBatch) -> B:
        raise NotImplementedError

    def length(self, block: B) -> int:
        raise NotImplementedError

    def slice(self, block: B, start: int, stop: int) -> B:
        raise NotImplementedError

    def concat(self, blocks: list[B]) -> B:
        raise NotImplementedError

    def take(self, block: B, indices: np.ndarray) -> B:
        raise NotImplementedError


class ArrowOps(BlockOps[pa.Table]):
    def from_arrow(self, batch: pa.RecordBatch) -> pa.Table:
        return pa.Table.from_batches([batch])

    def length(self, block: pa.Table) -> int:
        return int(block.num_rows)

    def slice(self, block: pa.Table, start: int, stop: int) -> pa.Table:
        return block.slice(start, stop - start)

    def concat(self, blocks: list[pa.Table]) -> pa.Table:
        return blocks[0] if len(blocks) == 1 else pa.concat_tables(blocks)

    def take(self, block: pa.Table, indices: np.ndarray) -> pa.Table:
        return block.take(indices)


Columns = dict[str, np.ndarray]


class NumpyOps(BlockOps[Columns]):
    def __init__(self, writable: bool = False) -> None:
        self.writable = writable

    def from_arrow(self, batch: pa.RecordBatch) -> Columns:
        return arrow_to_numpy(batch, self.writable)

    def length(self, block: Columns) -> int:
        return len(next(iter(block.values()))) if block else 0

    def slice(self, block: Columns, start: int, stop: int) -> Columns:
        return {k: v[start:stop] for k, v in block.items()}

    def concat(self, blocks: list[Columns]) -> Columns:
        if len(blocks) == 1:
            return blocks[0]
        return {k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]}

    def take(self, block: Columns, indices: np.ndarray) -> Columns:
        return {k: v[indices] for k, v in block.items()}


ARROW = ArrowOps()
NUMPY = NumpyOps()
NUMPY_WRITABLE = NumpyOps(writable=True)


def arrow_to_numpy(batch: pa.RecordBatch | pa.Table, writable: bool = False) -> Columns:
    """Columns as numpy arrays: zero-copy where Arrow allows; fixed-size lists and tensor
    columns become n-dimensional arrays. ``writable`` copies read-only arrays (torch wants it)."""
    out = {}
    for name, column in zip(batch.schema.names, batch.columns):
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        array = _column_to_numpy(column)
        out[name] = array if not writable or array.flags.writeable else array.copy()
    return out


def _column_to_numpy(column: pa.Array) -> np.ndarray:
    kind = column.type
    if isinstance(kind, pa.FixedShapeTensorType):
        return column.to_numpy_ndarray()  # type: ignore[attr-defined, no-any-return]
    if pa.types.is_fixed_size_list(kind) and column.null_count == 0:
        shape = [len(column)]
        while pa.types.is_fixed_size_list(column.type):
            shape.append(column.type.list_size)
            column = column.flatten()
        if pa.types.is_primitive(column.type):
            return column.to_numpy(zero_copy_only=False).reshape(shape)
    stacked = _equal_lists_to_numpy(column)
    if stacked is not None:
        return stacked
    return column.to_numpy(zero_copy_only=False)


def _equal_lists_to_numpy(column: pa.Array) -> np.ndarray | None:
    """A list column whose rows all have the same length (e.g. a pandas column of lists or
    arrays) as one ``(rows, length)`` array, as Ray Data gives it; None for anything else."""
    kind = column.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not len(column):
        return None
    if column.null_count or not pa.types.is_primitive(kind.value_type):
        return None
    lengths = pc.list_value_length(column)
    low, high = pc.min_max(lengths).values()
    if low.as_py() != high.as_py():
        return None
    values = pc.list_flatten(column)
    if values.null_count:
        return None
    return values.to_numpy(zero_copy_only=False).reshape(len(column), int(high.as_py()))


def rebatch(
    blocks: Iterator[B], ops: BlockOps[B], batch_size: int | None, drop_last: bool
) -> Iterator[B]:
    """Batches of exactly ``batch_size`` rows (the last may be smaller unless ``drop_last``);
    ``batch_size=None`` passes the blocks through."""
    if batch_size is None:
        yield from (b for b in blocks if ops.length(b))
        return
    pending: list[B] = []
    held = 0
    for block in blocks:
        n, pos = ops.length(block), 0
        if held:  # complete the partial batch first
            pos = min(batch_size - held, n)
            pending.append(ops.slice(block, 0, pos))
            held += pos
            if held == batch_size:
                yield ops.concat(pending)
                pending, held = [], 0
        while n - pos >= batch_size:
            yield ops.slice(block, pos, pos + batch_size)
            pos += batch_size
        if pos < n:
            pending.append(ops.slice(block, pos, n))
            held += n - pos
    if held and not drop_last:
        yield ops.concat(pending)


def shuffle_blocks(
    blocks: Iterator[B], ops: BlockOps[B], buffer_size: int, min_out: int, seed: Any
) -> Iterator[B]:
    """A local shuffle: rows wait in a buffer of at least ``buffer_size`` rows, and each block
    given out is a random draw from everything buffered. The buffer is drained at the end."""
    rng = np.random.default_rng(seed)
    held: list[B] = []
    rows = 0
    for block in blocks:
        held.append(block)
        rows += ops.length(block)
        if rows >= buffer_size + min_out:
            mixed = ops.take(ops.concat(held), rng.permutation(rows))
            out = rows - buffer_size
            yield ops.slice(mixed, 0, out)
            held, rows = [ops.slice(mixed, out, rows)], buffer_size
    if rows:
        yield ops.take(ops.concat(held), rng.permutation(rows))


def to_arrow_column(values: Any) -> pa.Array:
    """One column of a dict of arrays: a tensor column where the rows are arrays."""
    array = np.asarray(values)
    if array.ndim > 1:
        return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(array))
    return pa.array(array)
