"""``Dataset.mix``: rows of several datasets in weighted proportion, the ratio held in every
global batch, and resumable exactly.

A mixed dataset is split as its sources are: each rank gets its own shard of every source (the
sources' ``_split``, with their file shuffle), so every row belongs to one rank. A pass (one
epoch) over a rank's mixed shard reads each source's shard in order and takes from it as many
rows per batch as the pass's plan (``_mix_plan.PassPlan``, the same arithmetic on every rank)
gives it. Each source's shard keeps its own position (rows of it given out), so a checkpoint
holds one ordinary data-position record per source (``combine``) and a resume, at any world
size, continues every source where it stood (``resume_split``).
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from phalanx._internal.worker import data_wait
from phalanx.data._batching import BlockOps
from phalanx.data._iterator import DataIterator
from phalanx.data._mix_plan import MixRule, PassPlan, pass_rows
from phalanx.data._pass import _size_of, read, read_rows
from phalanx.data._plan import Start, as_ranges, ranges_len
from phalanx.data._position import DataPosition, PassPosition

if TYPE_CHECKING:
    from phalanx.data._dataset import Dataset

__all__ = ["MixStoppingCondition", "MixedIterator", "make_rule", "resume_split", "split_mixed"]

_END = object()


class MixStoppingCondition(enum.Enum):
    """When an epoch of a mixed dataset ends (Ray Data's names).

    ``STOP_ON_SHORTEST``: when the shortest source (for its weight) runs out; the rest of the
    other sources is left out of that epoch. ``STOP_ON_LONGEST_DROP`` (the default): when every
    source has run out; a source that runs out drops out and the batches after it are drawn from
    the others, by their weights.

    Example::

        mixed = web.mix(code, weights=[0.7, 0.3],
                        stopping_condition=MixStoppingCondition.STOP_ON_SHORTEST)
    """

    STOP_ON_SHORTEST = "stop_on_shortest"
    STOP_ON_LONGEST_DROP = "stop_on_longest_drop"


def make_rule(count: int, weights: Sequence[float] | None, stopping_condition: Any) -> MixRule:
    """The weights checked and normalized, and the stopping condition (also by its value)."""
    if weights is None:
        weights = [1.0] * count
    weights = list(weights)
    if len(weights) != count:
        raise ValueError(
            f"Number of datasets ({count}) must match number of weights ({len(weights)}).\n"
            "HINT: give one weight per dataset, this one first: ds.mix(b, c, "
            "weights=[0.5, 0.3, 0.2])."
        )
    bad = [w for w in weights if not isinstance(w, int | float) or not w > 0 or w != w]
    if bad:
        raise ValueError(
            f"mix: weights={weights!r} holds {bad!r}; every weight must be a number > 0.\n"
            "HINT: leave a dataset out of the mix rather than giving it weight 0."
        )
    try:
        condition = MixStoppingCondition(getattr(stopping_condition, "value", stopping_condition))
    except ValueError:
        raise ValueError(
            f"mix: stopping_condition={stopping_condition!r} is invalid.\nHINT: use "
            "phalanx.data.MixStoppingCondition.STOP_ON_SHORTEST or .STOP_ON_LONGEST_DROP."
        ) from None
    total = float(sum(weights))
    return MixRule(
        tuple(float(w) / total for w in weights),
        condition is MixStoppingCondition.STOP_ON_SHORTEST,
    )


def split_mixed(
    parts: Sequence[Dataset],
    rule: MixRule,
    n: int,
    equal: bool,
    starts: Sequence[tuple[Start | None, int | None]] | None = None,
    split: bool = True,
) -> list[MixedIterator]:
    """``n`` mixed shards: rank ``r``'s shard of every source, mixed by ``rule``."""
    starts = starts or [(None, None)] * len(parts)
    per_part = [
        part._split(n, equal, start=start, seed=seed, split=split)
        for part, (start, seed) in zip(parts, starts)
    ]
    return [
        MixedIterator([its[r] for its in per_part], rule, rank=r, world_size=n, equal=equal)
        for r in range(n)
    ]


def resume_split(
    parts: Sequence[Dataset],
    rule: MixRule,
    n: int,
    equal: bool,
    record: dict[str, Any],
    name: str,
) -> list[MixedIterator]:
    """The mixed shards of an attempt resumed from ``record`` (``combine``'s): each source from
    its own record. A record that is not a mixed one of as many sources: its epoch starts over."""
    from phalanx.data._position import resume_start

    records = record.get("mix")
    if not isinstance(records, list) or len(records) != len(parts):
        import logging

        logging.getLogger(__name__).warning(
            "Dataset %r: the data position stored with the checkpoint is not that of a mix of "
            "%d datasets, so the epoch starts over.\nHINT: resume with the same mix of the "
            "same data to continue the epoch exactly.",
            name,
            len(parts),
        )
        return split_mixed(parts, rule, n, equal)
    starts = []
    for i, (part, rec) in enumerate(zip(parts, records)):
        own_seed = part._seed if part._shuffle_files else None
        starts.append(resume_start(rec, f"{name}[{i}]", part.source, own_seed))
    # a source used up in the epoch's passes has a record of the next epoch: it keeps the
    # others' epoch, with nothing left of it
    epoch = min(s.epoch for s, _ in starts)
    fixed: list[tuple[Start | None, int | None]] = []
    for start, seed in starts:
        if start.epoch > epoch:
            start = Start(epoch, (as_ranges([]), *start.partial))
        fixed.append((start, seed))
    return split_mixed(parts, rule, n, equal, fixed)


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
        positions = []
        pieces = []
        for part in self._parts:
            a = part._assignment
            its_pieces = a.pieces_for(part._source, index)
            pos = PassPosition(index, a.epoch_of(index), sum(p.num_rows for p in its_pieces), None)
            with part._lock:
                part._passes = index + 1
            part._position = pos
            positions.append(pos)
            pieces.append(its_pieces)
        rank = self._rank
        parts = self._parts

        block_rows = max(read_rows(p._source, batch_size) for p in parts)

        # The thread reads each source and builds mixed blocks of many steps (one take per
        # block puts every step's rows of each source together); the caller's thread only
        # slices batches from them, as for one dataset.
        schema = parts[0]._source.schema

        def produce() -> Iterator[tuple[np.ndarray, Any]]:
            streams = [
                _Stream(ops, read(p._source, pc, read_rows(p._source, batch_size)), schema)
                for p, pc in zip(parts, pieces)
            ]
            step = 0
            while step < plan.total_steps:
                chunk = plan.counts(step, step + 512)[:, rank, :]
                step += len(chunk)
                rows = chunk.sum(axis=1)
                keep = rows > 0
                if drop_last:
                    keep &= rows == batch_size
                chunk = chunk[keep]
                per = max(1, block_rows // batch_size)
                for lo in range(0, len(chunk), per):
                    counts = chunk[lo : lo + per]
                    yield counts, _mixed_block(ops, streams, counts)

        ahead = max(1, prefetch_batches)
        from phalanx.data._prefetch import prefetched

        items = prefetched(produce, ahead, lambda item: _size_of(item[1]))
        return _handed_out(items, positions, finish, ops)

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
    """A source's blocks, taken from ``c`` rows at a time."""

    def __init__(
        self, ops: BlockOps[Any], batches: Iterator[pa.RecordBatch], schema: pa.Schema
    ) -> None:
        self._ops = ops
        # the first source's schema (types are checked equal; nullability, metadata may differ)
        self._batches = (b if b.schema.equals(schema) else b.cast(schema) for b in batches)
        self._block: Any = None
        self._pos = 0
        self._len = 0

    def take(self, count: int) -> Any:
        ops, out = self._ops, []
        while count:
            if self._pos >= self._len:
                batch = next(self._batches)
                self._block, self._pos, self._len = ops.from_arrow(batch), 0, batch.num_rows
                continue
            n = min(count, self._len - self._pos)
            if n == self._len and self._pos == 0:
                out.append(self._block)
            else:
                out.append(ops.slice(self._block, self._pos, self._pos + n))
            self._pos += n
            count -= n
        return out[0] if len(out) == 1 else ops.concat(out)


def _mixed_block(ops: BlockOps[Any], streams: list[_Stream], counts: np.ndarray) -> Any:
    """The rows of steps ``counts`` (steps x sources), step by step, each step's rows source
    by source: each source's rows of all the steps taken at once, then one take."""
    totals = counts.sum(axis=0)
    used = [s for s in range(counts.shape[1]) if totals[s]]
    taken = [streams[s].take(int(totals[s])) for s in used]
    if len(used) == 1:
        return taken[0]
    interleave = getattr(ops, "interleave", None)
    if interleave is not None:  # torch batches: runs concatenated, no gather
        return interleave(taken, counts[:, used])
    whole = ops.concat(taken)
    sub = counts[:, used]
    # row j of source s in step i sits at start[s] + (rows of s in steps before i) + j
    start = np.concatenate(([0], np.cumsum(totals[used])[:-1]))
    before = np.cumsum(sub, axis=0) - sub
    flat = sub.ravel()
    base = (start + before).ravel()
    offsets = np.cumsum(flat) - flat
    index = np.repeat(base - offsets, flat) + np.arange(int(flat.sum()))
    return ops.take(whole, index)


def _handed_out(
    items: Iterator[tuple[np.ndarray, Any]],
    positions: list[PassPosition],
    finish: Callable[[Any], Any] | None,
    ops: BlockOps[Any],
) -> Iterator[Any]:
    try:
        while True:
            asked = time.perf_counter()
            item = next(items, _END)
            if item is _END:
                for p in positions:
                    p.done = True
                data_wait.add(time.perf_counter() - asked)
                return
            counts: np.ndarray = item[0]  # type: ignore[index]
            block = item[1]  # type: ignore[index]
            if len(counts) == 1:
                steps, cuts = [counts[0].tolist()], [0, ops.length(block)]
            else:
                steps = counts.tolist()
                cuts = [0, *np.cumsum(counts.sum(axis=1)).tolist()]
            for i, step in enumerate(steps):
                if i:
                    asked = time.perf_counter()
                for p, c in zip(positions, step):
                    p.consumed += c
                batch = ops.slice(block, cuts[i], cuts[i + 1]) if len(steps) > 1 else block
                batch = batch if finish is None else finish(batch)
                data_wait.add(time.perf_counter() - asked)
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
