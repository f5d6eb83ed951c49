"""Cut a stream of record batches into exact batches, optionally through a shuffle buffer.

Blocks are either pyarrow Tables (for the ``pyarrow`` and ``pandas`` formats) or dicts of numpy
arrays (``numpy`` and torch). Each record batch read from storage is converted once; batches are
then zero-copy slices of it, so small batches cost little more than slicing arrays in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from phalanx.data._mix_blocks import MixedRows

__all__ = [
    "ARROW",
    "NUMPY",
    "BlockOps",
    "ShuffleKeys",
    "arrow_to_numpy",
    "as_numpy",
    "key_order",
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

    def from_mixed(self, rows: MixedRows) -> Columns:
        """A mixed dataset's block of steps (``_mix_blocks``): one copy per column."""
        return {name: rows.column(name) for name in rows.names}


ARROW = ArrowOps()
NUMPY = NumpyOps()
NUMPY_WRITABLE = NumpyOps(writable=True)


def as_numpy(tensors: list[Any]) -> list[np.ndarray] | None:
    """CPU tensors as the numpy arrays sharing their memory (None: a dtype numpy lacks)."""
    try:
        return [t.numpy() for t in tensors]
    except (TypeError, RuntimeError):
        return None


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
    if column.null_count == 0 and (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        return column.to_numpy()  # the common case first: zero-copy, no checks (wide tables)
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


class ShuffleKeys:
    """The local shuffle's order, as a sort key per row of a pass's stream.

    Row ``i`` (its index in the stream this rank reads) gets ``max(i, B) + 2B * u_i`` with
    ``u_i`` uniform in [0, 1) (``B``: the buffer size); the rows are given out in the order of
    their keys (ties by index). A row is given out once every row that could have a smaller key
    is read, so about ``B`` rows on average (``2B`` at most) plus a block wait in memory, as in
    a buffer of ``B`` rows; each batch is a draw from the ``2B`` rows before it (the first from
    the first ``B`` rows). Unlike a buffer's random draws, the order depends only on the seed,
    the epoch and the stream, not on how the rows were read in blocks: which rows the first
    ``k`` given out were is computable without the data (``first``), which is what lets a
    checkpoint say exactly which rows were trained.
    """

    CHUNK = 65536

    def __init__(self, seed: int, epoch: int, buffer_size: int) -> None:
        # plain ints: a numpy seed would not go into the JSON of a position
        self.seed, self.epoch, self.buffer = int(seed), int(epoch), int(buffer_size)
        self.width = 2 * self.buffer
        self._chunk: tuple[int, np.ndarray] | None = None

    @classmethod
    def from_state(cls, state: list[int], epoch: int) -> ShuffleKeys:
        return cls(int(state[0]), epoch, int(state[1]))

    def state(self) -> list[int]:
        """What a position records of this shuffle: ``[seed, buffer_size]``."""
        return [self.seed, self.buffer]

    def __call__(self, lo: int, hi: int) -> np.ndarray:
        """The keys of rows ``[lo, hi)``."""
        if hi <= lo:
            return np.empty(0)
        parts = []
        for c in range(lo // self.CHUNK, -(-hi // self.CHUNK)):
            base = c * self.CHUNK
            parts.append(self._uniform(c)[max(lo - base, 0) : hi - base])
        u = np.concatenate(parts) if len(parts) != 1 else parts[0]
        return np.maximum(np.arange(lo, hi), self.buffer) + self.width * u

    def _uniform(self, chunk: int) -> np.ndarray:
        if self._chunk is None or self._chunk[0] != chunk:
            rng = np.random.default_rng([self.seed, self.epoch, chunk])
            self._chunk = (chunk, rng.random(self.CHUNK))
        return self._chunk[1]

    def ready_below(self, rows_read: int) -> float:
        """Every row not yet read has a key at least this."""
        return float(max(rows_read, self.buffer))

    def first(self, n: int, k: int) -> tuple[int, np.ndarray]:
        """Which rows of a stream of ``n`` the first ``k`` given out are: every row below
        ``lo``, and the sorted indices returned. With keys in ``[max(i, B), max(i, B) + W)``
        (``W = 2B``), rows below ``k - W`` (once that is at least ``B``) always are, and rows
        from ``max(k, B) + W`` on never are: only about ``2W`` keys are computed."""
        k = min(max(k, 0), n)
        b, w = self.buffer, self.width
        lo = k - w if k - w >= b else 0
        hi = min(n, max(k, b) + w)
        if k == lo:
            return lo, np.empty(0, dtype=np.int64)
        chosen = key_order(self(lo, hi))[: k - lo] + lo
        return lo, np.sort(chosen)


def key_order(keys: np.ndarray) -> np.ndarray:
    """The indices that sort ``keys``, ties by index. Ties (two rows with equal float keys)
    almost never happen, so the fast unstable sort is used and checked: the order is the
    same on every machine either way."""
    order = np.argsort(keys)
    ranked = keys[order]
    if len(ranked) > 1 and not (ranked[1:] > ranked[:-1]).all():
        return np.argsort(keys, kind="stable")
    return order


def shuffle_blocks(
    blocks: Iterator[B], ops: BlockOps[B], keys: ShuffleKeys, min_out: int
) -> Iterator[B]:
    """A local shuffle: the rows in the order of ``keys`` (see :class:`ShuffleKeys`), given
    out in blocks of at least ``min_out`` rows."""
    held: list[B] = []
    held_keys: list[np.ndarray] = []
    read = 0
    for block in blocks:
        n = ops.length(block)
        if not n:
            continue
        held.append(block)
        held_keys.append(keys(read, read + n))
        read += n
        key = np.concatenate(held_keys) if len(held_keys) > 1 else held_keys[0]
        ready = key < keys.ready_below(read)
        out = np.flatnonzero(ready)
        if len(out) < min_out:
            continue
        rows = ops.concat(held)
        yield ops.take(rows, out[key_order(key[out])])
        rest = np.flatnonzero(~ready)  # kept in stream order: ties go by index
        held, held_keys = [ops.take(rows, rest)], [key[rest]]
    if held:
        key = np.concatenate(held_keys)
        if len(key):
            yield ops.take(ops.concat(held), key_order(key))


def to_arrow_column(values: object) -> pa.Array:
    """One column of a dict of arrays: a tensor column where the rows are arrays."""
    array = np.asarray(values)
    if array.ndim > 1:
        return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(array))
    return pa.array(array)
