"""One pass over a shard (one epoch): which rows it reads (the assignment's pieces for that
pass), in what order (a local shuffle's seeded keys), read ahead in a background thread, cut
into batches in the caller's thread, and how many rows the user has been given (its
``PassPosition``); and ``Passes``, the iterable whose every ``for`` loop is a new pass."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from phalanx._internal.worker import data_wait
from phalanx.data._batching import BlockOps, ShuffleKeys, rebatch, shuffle_blocks
from phalanx.data._plan import Assignment, Piece
from phalanx.data._position import PassPosition
from phalanx.data._prefetch import prefetched
from phalanx.data._source import Source

READ_BYTES = 8 << 20
"""About this many bytes of rows are read from storage at a time (more when a batch is larger)."""
MIN_READ_ROWS, MAX_READ_ROWS = 1024, 262144
_END = object()


class Passes:
    """The batches of a shard, as Ray's ``iter_batches`` returns them: an iterable whose every
    pass (``for``, ``iter()``) is a new epoch. A framework given it once (Lightning's
    ``train_dataloaders``, Hugging Face's Trainer) gets every epoch's rows, not an exhausted
    generator from epoch 2 on.

    ``next()`` also works (unlike Ray's): it starts a pass and continues it, and a ``for`` loop
    after ``next()`` finishes that pass, as it would on the generator phalanx returned before
    (``first = next(batches); for b in batches: ...`` sees every batch once).
    """

    def __init__(self, start: Callable[[], Iterator[Any]]) -> None:
        self._start = start
        self._current: Iterator[Any] | None = None

    def __iter__(self) -> Iterator[Any]:
        current, self._current = self._current, None
        return current if current is not None else self._start()

    def __next__(self) -> Any:
        if self._current is None:
            self._current = self._start()
        return next(self._current)

    def close(self) -> None:
        """Stop the pass ``next()`` started (its read-ahead thread), as a generator's ``close``."""
        current, self._current = self._current, None
        close = getattr(current, "close", None)
        if close is not None:
            close()


@dataclass(frozen=True)
class BatchArgs:
    """How an ``iter_*`` call asked for its batches (the same for each of its passes)."""

    ops: BlockOps[Any]
    finish: Callable[[Any], Any] | None  # in the caller's thread, per batch (e.g. to tensors)
    batch_size: int | None
    drop_last: bool
    buffer_size: int | None  # local shuffle buffer
    shuffle_seed: int | None
    prefetch_batches: int


def start_pass(
    source: Source,
    assignment: Assignment,
    index: int,
    args: BatchArgs,
    prefetch_bytes: int | None,
) -> tuple[PassPosition, Iterator[Any]]:
    """Pass ``index`` over the shard: its position (counted as batches are given out) and its
    batches (nothing is read before the first is asked for)."""
    epoch = assignment.epoch_of(index)
    pieces = assignment.pieces_for(source, index)
    keys = None
    if args.buffer_size:  # the seed is drawn now when not given, so the position can name it
        seed = secrets.randbits(63) if args.shuffle_seed is None else args.shuffle_seed
        keys = ShuffleKeys(seed, epoch, args.buffer_size)
    rows = sum(p.num_rows for p in pieces)
    position = PassPosition(index, epoch, rows, None if keys is None else keys.state())
    rows_per_read = read_rows(source, args.batch_size)
    ahead = _blocks_ahead(source, args, rows_per_read, prefetch_bytes)

    # The thread reads, decodes and shuffles whole blocks (work that mostly releases the GIL);
    # cutting batches and making tensors stays in the caller's thread, so small batches do not
    # pay a thread hand-off (and GIL contention) each.
    def produce() -> Iterator[Any]:
        ops = args.ops
        blocks: Iterator[Any] = (ops.from_arrow(b) for b in read(source, pieces, rows_per_read))
        if keys is not None:
            blocks = shuffle_blocks(blocks, ops, keys, args.batch_size or 1)
        return blocks

    return position, _batches(prefetched(produce, ahead, _size_of), args, position)


def _blocks_ahead(
    source: Source, args: BatchArgs, rows_per_read: int, prefetch_bytes: int | None
) -> int:
    """Blocks the thread reads ahead: ``prefetch_batches`` batches' worth, at most about
    ``prefetch_bytes`` bytes."""
    ahead = -(-args.prefetch_batches * (args.batch_size or rows_per_read) // rows_per_read)
    if prefetch_bytes is not None and ahead > 1:
        block_bytes = max(rows_per_read * source.row_bytes(), 1)
        ahead = max(1, min(ahead, prefetch_bytes // block_bytes))
    return ahead


def _batches(blocks: Iterator[Any], args: BatchArgs, position: PassPosition) -> Iterator[Any]:
    cut = rebatch(blocks, args.ops, args.batch_size, args.drop_last)
    # Every batch but the last has batch_size rows, and the last ends the pass: the count may
    # run past the pass's rows only then, and is read capped (state()).
    step = args.batch_size or 0
    if not step:
        cut = _counted(cut, args.ops, position)
    finish = args.finish
    try:
        while True:
            # the training thread's wait for each batch, for the goodput breakdown
            asked = time.perf_counter()
            batch = next(cut, _END)
            if batch is _END:
                position.done = True
                data_wait.add(time.perf_counter() - asked)
                return
            position.consumed += step
            batch = batch if finish is None else finish(batch)
            data_wait.add(time.perf_counter() - asked)
            yield batch
    finally:
        blocks.close()  # type: ignore[attr-defined]


def _counted(blocks: Iterator[Any], ops: BlockOps[Any], position: PassPosition) -> Iterator[Any]:
    for block in blocks:
        position.consumed += ops.length(block)
        yield block


def read(source: Source, pieces: Sequence[Piece], read_rows: int) -> Iterator[pa.RecordBatch]:
    """The pieces' rows in order. Nearby pieces of one fragment (a pass resumed from a
    checkpoint reads scattered rows) are read as one span and the rows taken from it, so a row
    group is decoded once, not once per piece."""
    i = 0
    while i < len(pieces):
        j = i + 1
        while (
            j < len(pieces)
            and pieces[j].fragment == pieces[i].fragment
            and 0 <= pieces[j].start - pieces[j - 1].stop <= read_rows
        ):
            j += 1
        if j == i + 1:
            yield from source.read(pieces[i], read_rows)
        else:
            group, lo = pieces[i:j], pieces[i].start
            span = Piece(group[0].fragment, lo, group[-1].stop)
            table = pa.Table.from_batches(list(source.read(span, read_rows)))
            take = np.concatenate([np.arange(p.start - lo, p.stop - lo) for p in group])
            yield from table.take(take).to_batches(max_chunksize=read_rows)
        i = j


def read_rows(source: Source, batch_size: int | None) -> int:
    """Rows per read: about ``READ_BYTES`` of them, at least a batch."""
    rows = min(max(READ_BYTES // source.row_bytes(), MIN_READ_ROWS), MAX_READ_ROWS)
    return max(rows, batch_size or 0)


def _size_of(batch: object) -> int:
    if isinstance(batch, dict):
        return sum(int(getattr(v, "nbytes", 1 << 20)) for v in batch.values())
    if isinstance(batch, pa.Table):
        return int(batch.nbytes)
    return 1 << 30  # unknown (a collate_fn's output, a DataFrame): one batch per bundle
