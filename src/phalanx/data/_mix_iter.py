"""A mixed dataset's shard (``MixedIterator``): each pass reads every source's shard, builds
mixed blocks of many steps in the read-ahead thread as the pass's plan (``_mix_plan``) gives
them, and hands out batches as slices of those blocks; and the driver's record of it
(``combine``: one data-position record per source).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from phalanx._internal.worker import data_wait
from phalanx.data._batching import BlockOps, arrow_to_numpy
from phalanx.data._iterator import DataIterator
from phalanx.data._mix_blocks import MixedRows
from phalanx.data._mix_plan import MixRule, PassPlan, pass_rows
from phalanx.data._pass import _size_of, read, read_rows
from phalanx.data._plan import ranges_len
from phalanx.data._position import DataPosition, PassPosition

__all__ = ["MixedIterator", "combine"]


class MixedIterator(DataIterator):
    """One rank's shard of a mixed dataset: its shards of every source, read in the ratio of
    the weights (what ``get_dataset_shard`` returns for a ``Dataset.mix``). Each batch holds the
    rows of the sources one after the other (first source first); ``position()`` sums the
    sources', ``source_positions()`` gives each."""

    def __init__(
        self,
        parts: list[DataIterator],
        rule: MixRule,
        *,
        rank: int = 0,
        world_size: int = 1,
        equal: bool = False,
    ) -> None:
        # tensors may share the rows' memory: copy as the least private source needs
        shared = [p._source for p in parts if not p._source.private_buffers]
        super().__init__(shared[0] if shared else parts[0]._source, parts[0]._assignment)
        self._parts = parts
        self._rule = rule
        self._rank = rank
        self._world = world_size
        self._equal = equal

    # -- position -------------------------------------------------------------------------------

    def source_positions(self) -> list[DataPosition]:
        """Each source's position in its shard (as ``position()`` for a plain dataset)."""
        return [p.position() for p in self._parts]

    def position(self) -> DataPosition:
        each = self.source_positions()
        return DataPosition(
            min(p.epoch for p in each), sum(p.consumed for p in each), sum(p.rows for p in each)
        )

    def position_state(self) -> dict[str, Any] | None:
        states = [p.position_state() for p in self._parts]
        if all(s is None for s in states):
            return None
        return {"mix": states}

    def combine_positions(
        self, shards: list[DataIterator], states: list[dict[str, Any] | None]
    ) -> dict[str, Any]:
        """What ``_position.combine`` gives for the mixed shards ``shards`` (this one's)."""
        return combine(shards, states)  # type: ignore[arg-type]

    def map_parts(self, fn: Callable[[DataIterator], DataIterator]) -> MixedIterator:
        """The same mixed shard over ``fn`` of each source's shard (e.g. read through a
        preprocessor)."""
        out = MixedIterator(
            [fn(p) for p in self._parts],
            self._rule,
            rank=self._rank,
            world_size=self._world,
            equal=self._equal,
        )
        out.limit_prefetch_bytes(self._prefetch_bytes)
        return out

    def limit_prefetch_bytes(self, limit: int | None) -> None:
        self._prefetch_bytes = limit
        for part in self._parts:
            part.limit_prefetch_bytes(limit)

    # -- the plan -------------------------------------------------------------------------------

    def _plan(self, index: int, batch: int) -> PassPlan:
        """Pass ``index``'s plan (every rank computes the same)."""
        parts = self._parts
        shards = np.zeros((self._world, len(parts)), dtype=np.int64)
        consumed = np.zeros(len(parts), dtype=np.int64)
        totals = []
        for s, part in enumerate(parts):
            a, rows = part._assignment, part._source.num_rows
            total = a.total if a.total is not None else rows
            totals.append(total)
            for r in range(self._world):
                shards[r, s] = ranges_len(dataclasses.replace(a, rank=r).positions(rows, index))
            if index < len(a.start.partial):
                consumed[s] = total - ranges_len(a.start.partial[index])
        epoch_rows = self._rule.epoch_rows(totals)
        given = pass_rows(self._rule, shards, consumed, epoch_rows, self._equal)
        return PassPlan(self._rule, shards, consumed, given, batch)

    # -- reading --------------------------------------------------------------------------------

    def _iter(
        self,
        ops: BlockOps[Any],
        finish: Callable[[Any], Any] | None,
        batch_size: int | None,
        drop_last: bool,
        buffer_size: int | None,
        shuffle_seed: int | None,
        prefetch_batches: int,
    ) -> Iterator[Any]:
        if batch_size is None:
            raise ValueError(
                "A mixed dataset (Dataset.mix) is read in batches: batch_size=None (the blocks "
                "as read) has no meaning for it.\nHINT: pass batch_size=<rows per batch>."
            )
        if buffer_size:
            raise ValueError(
                "local_shuffle_buffer_size is not supported on a mixed dataset (Dataset.mix): "
                "its batches follow the mixing plan, which a local shuffle would break.\nHINT: "
                "shuffle the sources before mixing (read_parquet(..., shuffle='files'), "
                "ds.randomize_block_order()), or shuffle rows within each batch yourself."
            )
        with self._lock:
            index, self._passes = self._passes, self._passes + 1
        plan = self._plan(index, batch_size)
        given = _Given(len(self._parts))
        positions = []
        pieces = []
        for s, part in enumerate(self._parts):
            a = part._assignment
            its_pieces = a.pieces_for(part._source, index)
            rows = sum(p.num_rows for p in its_pieces)
            pos = _SourcePosition(given, s, index, a.epoch_of(index), rows)
            with part._lock:
                part._passes = index + 1
            part._position = pos
            positions.append(pos)
            pieces.append(its_pieces)
        rank = self._rank
        parts = self._parts

        block_rows = max(read_rows(p._source, batch_size) for p in parts)

        # The thread reads each source and builds mixed blocks of many steps (each source's
        # rows of the steps taken at once, then put together step by step with one copy), and
        # the cuts and running counts of the block's batches; the caller's thread only slices
        # batches from them, as for one dataset.
        schema = parts[0]._source.schema
        numpy = hasattr(ops, "from_mixed")  # its blocks are built from numpy columns

        def produce() -> Iterator[_Block]:
            streams = [
                _Stream(read(p._source, pc, read_rows(p._source, batch_size)), schema, numpy)
                for p, pc in zip(parts, pieces)
            ]
            per = max(1, block_rows // batch_size)
            step = 0
            while step < plan.total_steps:
                chunk = plan.counts(step, step + per)[:, rank, :]
                step += len(chunk)
                rows = chunk.sum(axis=1)
                keep = rows > 0
                if drop_last:
                    keep &= rows == batch_size
                if not keep.all():
                    chunk, rows = chunk[keep], rows[keep]
                if len(chunk):
                    yield _Block(
                        _mixed_block(ops, streams, chunk),
                        [0, *np.cumsum(rows).tolist()],
                        np.cumsum(chunk, axis=0).tolist(),
                    )

        ahead = max(1, prefetch_batches)
        from phalanx.data._prefetch import prefetched

        items = prefetched(produce, ahead, lambda item: _size_of(item.data))
        return _handed_out(items, positions, given, finish, ops)

    def count(self) -> int:
        """Rows of this shard in a whole epoch (what the plan gives this rank)."""
        index = len(self._parts[0]._assignment.start.partial)
        plan = self._plan(index, 1)
        return int(plan._left[self._rank])

    def schema(self) -> pa.Schema:
        return self._parts[0].schema()

    def columns(self) -> list[str]:
        return self._parts[0].columns()

    def to_arrow(self) -> pa.Table:
        """One whole epoch of this shard, in the mixed order (batches of 256 rows)."""
        # the rows of the last pass (never a resumed partial one), read by a copy of the shard
        # so that this shard's own passes and positions stay as they are
        index = max(self._passes - 1, len(self._parts[0]._assignment.start.partial))
        parts = []
        for part in self._parts:
            fresh = DataIterator(part._source, part._assignment)
            fresh._passes = index
            parts.append(fresh)
        copy = MixedIterator(
            parts, self._rule, rank=self._rank, world_size=self._world, equal=self._equal
        )
        copy._passes = index
        batches = copy.iter_batches(batch_size=256, batch_format="pyarrow", prefetch_batches=0)
        tables = list(batches)
        return pa.concat_tables(tables) if tables else self.schema().empty_table()

    def materialize(self) -> DataIterator:
        from phalanx.data._source import TableSource

        return DataIterator(TableSource(self.to_arrow()))

    def stats(self) -> str:
        return f"MixedIterator: {len(self._parts)} sources, weights {self._rule.weights}"

    def __repr__(self) -> str:
        return f"MixedIterator(sources={len(self._parts)}, weights={list(self._rule.weights)})"

    def __getstate__(self) -> dict[str, Any]:
        return {
            **super().__getstate__(),
            "parts": self._parts,
            "rule": self._rule,
            "rank": self._rank,
            "world": self._world,
            "equal": self._equal,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._parts = state["parts"]
        self._rule = state["rule"]
        self._rank = state["rank"]
        self._world = state["world"]
        self._equal = state["equal"]


class _Stream:
    """A source's record batches, taken from ``count`` rows at a time: pieces of the batches
    read (``(batch, columns, start, stop)``; ``columns``: the batch's numpy columns, converted
    once per batch read when ``numpy``, else None)."""

    def __init__(self, batches: Iterator[pa.RecordBatch], schema: pa.Schema, numpy: bool) -> None:
        # the first source's schema (types are checked equal; nullability, metadata may differ)
        self._batches = (b if b.schema.equals(schema) else b.cast(schema) for b in batches)
        self._numpy = numpy
        self._batch: pa.RecordBatch | None = None
        self._columns: dict[str, np.ndarray] | None = None
        self._pos = 0
        self._len = 0

    def take(self, count: int) -> list[tuple[pa.RecordBatch, Any, int, int]]:
        out = []
        while count:
            if self._pos >= self._len:
                batch = self._batch = next(self._batches)
                self._columns = arrow_to_numpy(batch) if self._numpy else None
                self._pos, self._len = 0, batch.num_rows
                continue
            n = min(count, self._len - self._pos)
            out.append((self._batch, self._columns, self._pos, self._pos + n))
            self._pos += n
            count -= n
        return out


class _Block:
    """A mixed block of steps: its rows, where each batch ends (``cuts``: ``[0, ...]``) and
    the rows of each source given by the end of each batch of it (``given``, running sums)."""

    __slots__ = ("cuts", "data", "given")

    def __init__(self, data: Any, cuts: list[int], given: list[list[int]]) -> None:
        self.data, self.cuts, self.given = data, cuts, given


class _Given:
    """The rows of each source a pass has given out: the blocks' totals before the current
    block and that block's running counts up to its batch ``i``. The caller's thread sets
    ``i`` once per batch; the sources' positions read it when asked (``report()``)."""

    __slots__ = ("before", "block", "i")

    def __init__(self, sources: int) -> None:
        self.before = [0] * sources
        self.block: list[list[int]] = []
        self.i = 0

    def next_block(self, running: list[list[int]]) -> None:
        if self.block:
            self.before = [b + c for b, c in zip(self.before, self.block[-1])]
        self.i = 0
        self.block = running

    def of(self, source: int) -> int:
        i = min(self.i, len(self.block))
        return self.before[source] + (self.block[i - 1][source] if i else 0)


class _SourcePosition(PassPosition):
    """A source's position in a mixed pass: ``consumed`` read from the pass's ``_Given`` (no
    per-batch work per source)."""

    __slots__ = ("_given", "_source")

    def __init__(self, given: _Given, source: int, index: int, epoch: int, rows: int) -> None:
        self._given, self._source = given, source
        super().__init__(index, epoch, rows, None)

    @property  # type: ignore[override]
    def consumed(self) -> int:
        return self._given.of(self._source)

    @consumed.setter
    def consumed(self, value: int) -> None:
        if value:
            raise AttributeError("a mixed pass's source positions count themselves")


def _mixed_block(ops: BlockOps[Any], streams: list[_Stream], counts: np.ndarray) -> Any:
    """The rows of steps ``counts`` (steps x sources), step by step, each step's rows source
    by source: each source's rows of all the steps taken at once, then put in place."""
    totals = counts.sum(axis=0).tolist()
    taken = [streams[s].take(int(n)) if n else [] for s, n in enumerate(totals)]
    from_mixed = getattr(ops, "from_mixed", None)
    if from_mixed is not None:  # torch and numpy batches: each column written once, in place
        pieces = [[(cols, lo, hi) for _, cols, lo, hi in t] for t in taken]
        return from_mixed(MixedRows(pieces, counts))
    used = [s for s, n in enumerate(totals) if n]
    blocks = [
        ops.concat([ops.from_arrow(b.slice(lo, hi - lo)) for b, _, lo, hi in taken[s]])
        for s in used
    ]
    if len(used) == 1:
        return blocks[0]
    whole = ops.concat(blocks)
    # row j of source s in step i sits at start[s] + (rows of s in steps before i) + j
    sub = counts[:, used]
    start = np.concatenate(([0], np.cumsum(sub.sum(axis=0))[:-1]))
    before = np.cumsum(sub, axis=0) - sub
    flat = sub.ravel()
    base = (start + before).ravel()
    offsets = np.cumsum(flat) - flat
    index = np.repeat(base - offsets, flat) + np.arange(int(flat.sum()))
    return ops.take(whole, index)


def _handed_out(
    items: Iterator[_Block],
    positions: list[_SourcePosition],
    given: _Given,
    finish: Callable[[Any], Any] | None,
    ops: BlockOps[Any],
) -> Iterator[Any]:
    wait = data_wait.add
    clock = time.perf_counter
    # torch batches on the CPU: each batch made straight from the block (no block per batch)
    cutter = getattr(ops, "cutter", None) if finish == getattr(ops, "finish", None) else None
    try:
        while True:
            asked = clock()
            item = next(items, None)
            if item is None:
                for p in positions:
                    p.done = True
                wait(clock() - asked)
                return
            given.next_block(item.given)
            block, cuts = item.data, item.cuts
            cut = cutter(block) if cutter is not None else None
            whole = len(cuts) == 2
            for i in range(1, len(cuts)):
                if i > 1:
                    asked = clock()
                given.i = i
                if cut is not None:
                    batch = cut(cuts[i - 1], cuts[i])
                else:
                    batch = block if whole else ops.slice(block, cuts[i - 1], cuts[i])
                    batch = batch if finish is None else finish(batch)
                wait(clock() - asked)
                yield batch
    finally:
        items.close()  # type: ignore[attr-defined]


# -- the driver: one record per source ------------------------------------------------------


def combine(shards: list[MixedIterator], states: list[dict[str, Any] | None]) -> dict[str, Any]:
    """The record of a mixed dataset: each source's record (``_position.combine``) under
    ``"mix"``, and the epoch and counts of the whole (for the progress line)."""
    from phalanx.data._position import VERSION, mixed_consumed
    from phalanx.data._position import combine as combine_one

    records = []
    for s in range(len(shards[0]._parts)):
        part_states = [st["mix"][s] if st and st.get("mix") else None for st in states]
        records.append(combine_one([sh._parts[s] for sh in shards], part_states))
    return {
        "version": VERSION,
        "epoch": min(int(r["epoch"]) for r in records),
        "num_rows": sum(int(r["num_rows"]) for r in records),
        "consumed": sum(mixed_consumed(r, records) for r in records),
        "mix": records,
        "weights": list(shards[0]._rule.weights),
    }
