"""DataIterator: one worker's shard of a dataset; every pass over an ``iter_*`` result is one
epoch over it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from phalanx._internal.worker import data_wait
from phalanx.data._batching import ARROW, NUMPY, NUMPY_WRITABLE, BlockOps, rebatch, shuffle_blocks
from phalanx.data._plan import Piece, epoch_order, pieces_in_range, rank_range
from phalanx.data._prefetch import prefetched
from phalanx.data._source import Source, TableSource

__all__ = ["DataIterator", "Passes"]

READ_BYTES = 8 << 20
"""About this many bytes of rows are read from storage at a time (more when a batch is larger)."""
MIN_READ_ROWS, MAX_READ_ROWS = 1024, 262144
BATCH_FORMATS = ("numpy", "pandas", "pyarrow", "default")
_END = object()


@dataclass(frozen=True)
class Assignment:
    """Which rows of the source a shard reads: fixed pieces, or this rank's range of a seeded
    per-epoch order of the fragments (the same order on every rank, so shards stay disjoint)."""

    pieces: tuple[Piece, ...] | None = None
    seed: int | None = None
    rank: int = 0
    world_size: int = 1
    equal: bool = True

    def pieces_for(self, source: Source, epoch: int) -> list[Piece]:
        if self.pieces is not None:
            return list(self.pieces)
        assert self.seed is not None
        order = epoch_order(len(source.fragment_rows), self.seed, epoch)
        start, stop = rank_range(source.num_rows, self.rank, self.world_size, self.equal)
        return pieces_in_range(source.fragment_rows, start, stop, order)

    def num_rows(self, source: Source) -> int:
        if self.pieces is not None:
            return sum(p.num_rows for p in self.pieces)
        start, stop = rank_range(source.num_rows, self.rank, self.world_size, self.equal)
        return stop - start


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


class DataIterator:
    """This worker's shard of one dataset, read in batches (what ``get_dataset_shard`` returns).

    What ``iter_batches`` / ``iter_torch_batches`` return is an iterable, as in Ray: each pass
    over it (each ``for`` loop, or ``iter()``) is one epoch over the shard, so it can be handed
    once to a framework that loops over it every epoch (a Lightning ``train_dataloaders``). Rows
    are read from storage by this worker, in a background thread that stays about
    ``prefetch_batches`` batches ahead (at least one block of rows as read), so memory stays
    bounded whatever the dataset's size.

    Example::

        def train_func():
            shard = phalanx.get_dataset_shard("train")
            for epoch in range(3):
                for batch in shard.iter_torch_batches(batch_size=256):
                    loss = model(batch["x"]).sub(batch["y"]).pow(2).mean()
    """

    def __init__(self, source: Source, assignment: Assignment | None = None) -> None:
        self._source = source
        self._assignment = assignment or Assignment(
            tuple(Piece(i, 0, int(n)) for i, n in enumerate(source.fragment_rows))
        )
        self._epoch = 0
        self._prefetch_bytes: int | None = None
        self._lock = threading.Lock()

    def limit_prefetch_bytes(self, limit: int | None) -> None:
        """Hold at most about ``limit`` bytes of rows read ahead (None: ``prefetch_batches``
        alone decides); what ``DataConfig(execution_options=...)``'s object-store limit sets."""
        self._prefetch_bytes = limit

    # -- reading --------------------------------------------------------------------------------

    def iter_batches(
        self,
        *,
        prefetch_batches: int = 1,
        batch_size: int | None = 256,
        batch_format: str = "numpy",
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
    ) -> Passes:
        """Batches of ``batch_size`` rows: a dict of column -> numpy array (``"numpy"``, the
        default), a ``pandas.DataFrame`` or a ``pyarrow.Table``. ``batch_size=None`` gives the
        blocks as read. With ``local_shuffle_buffer_size``, rows are drawn at random from a
        buffer of at least that many rows (seeded by ``local_shuffle_seed``; each epoch differs).
        """
        _check_args(batch_size, prefetch_batches, local_shuffle_buffer_size)
        if batch_format not in BATCH_FORMATS:
            raise ValueError(
                f"batch_format={batch_format!r} is invalid: use one of {BATCH_FORMATS[:3]}."
            )
        ops: BlockOps[Any] = NUMPY if batch_format in ("numpy", "default") else ARROW
        finish = _to_pandas if batch_format == "pandas" else None
        return Passes(
            lambda: self._iter(
                ops,
                finish,
                batch_size,
                drop_last,
                local_shuffle_buffer_size,
                local_shuffle_seed,
                prefetch_batches,
            )
        )

    def iter_torch_batches(
        self,
        *,
        prefetch_batches: int = 1,
        batch_size: int | None = 256,
        dtypes: Any = None,
        device: Any = "auto",
        collate_fn: Callable[[Any], Any] | None = None,
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
    ) -> Passes:
        """Batches as a dict of column -> ``torch.Tensor`` on ``device`` (``"auto"``: this
        worker's device). ``dtypes``: one torch dtype or a dict per column. ``collate_fn`` gets
        each numpy batch (pyarrow/pandas for Ray's ``ArrowBatchCollateFn`` /
        ``PandasBatchCollateFn`` subclasses) and returns the batch; tensors in what it returns
        are moved to ``device``."""
        from phalanx.data import _torch_batches as tb

        _check_args(batch_size, prefetch_batches, local_shuffle_buffer_size)
        if collate_fn is not None and dtypes is not None:
            raise ValueError(
                "iter_torch_batches: collate_fn cannot be used with dtypes.\nHINT: convert the "
                "tensors to the dtypes you want inside collate_fn."
            )
        target = tb.resolve_device(device)
        # Tensors share the memory of the rows they come from: copy rows that are not ours.
        numpy_ops = NUMPY if self._source.private_buffers else NUMPY_WRITABLE
        ops: BlockOps[Any]
        finish: Callable[[Any], Any]
        if collate_fn is None:
            ops = tb.TensorOps(dtypes, self._source.private_buffers)

            def finish(block: Any) -> Any:
                return tb.to_device(block.as_dict(), target)

        else:
            fmt = tb.collate_format(collate_fn)
            convert = _to_pandas if fmt == "pandas" else None
            ops = ARROW if fmt in ("pandas", "pyarrow") else numpy_ops

            def finish(batch: Any) -> Any:
                return tb.to_device(collate_fn(convert(batch) if convert else batch), target)

        return Passes(
            lambda: self._iter(
                ops,
                finish,
                batch_size,
                drop_last,
                local_shuffle_buffer_size,
                local_shuffle_seed,
                prefetch_batches,
            )
        )

    def to_tf(
        self,
        feature_columns: str | list[str],
        label_columns: str | list[str],
        *,
        additional_columns: str | list[str] | None = None,
        prefetch_batches: int = 1,
        batch_size: int = 1,
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
        feature_type_spec: Any = None,
        label_type_spec: Any = None,
        additional_type_spec: Any = None,
    ) -> Any:
        """This shard as a ``tf.data.Dataset`` of ``(features, labels)`` batches (plus
        ``additional_columns``), as Ray's: a column name gives a tensor, a list a dict of them;
        type specs are taken from the schema unless given. Each pass TensorFlow makes over it
        (each Keras epoch) is a new epoch over the shard. Needs ``phalanx[tensorflow]``."""
        from phalanx.data._tf_batches import to_tf

        batches = self.iter_batches(
            prefetch_batches=prefetch_batches,
            batch_size=batch_size,
            drop_last=drop_last,
            local_shuffle_buffer_size=local_shuffle_buffer_size,
            local_shuffle_seed=local_shuffle_seed,
        )
        return to_tf(
            lambda: iter(batches),
            self._source.schema,
            (feature_columns, label_columns, additional_columns),
            (feature_type_spec, label_type_spec, additional_type_spec),
        )

    def iter_rows(self) -> Iterator[dict[str, Any]]:
        """Rows as dicts (slow; for inspection)."""
        for batch in self.iter_batches(batch_size=None, batch_format="pyarrow"):
            yield from batch.to_pylist()

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
        with self._lock:
            epoch, self._epoch = self._epoch, self._epoch + 1
        pieces = self._assignment.pieces_for(self._source, epoch)
        source = self._source
        read_rows = _read_rows(source, batch_size)
        # The thread reads, decodes and shuffles whole blocks (work that mostly releases the
        # GIL); cutting batches and making tensors stays in the caller's thread, so small
        # batches do not pay a thread hand-off (and GIL contention) each.
        ahead = -(-prefetch_batches * (batch_size or read_rows) // read_rows)
        if self._prefetch_bytes is not None and ahead > 1:
            block_bytes = max(read_rows * source.row_bytes(), 1)
            ahead = max(1, min(ahead, self._prefetch_bytes // block_bytes))

        def produce() -> Iterator[Any]:
            blocks: Iterator[Any] = (
                ops.from_arrow(b) for p in pieces for b in source.read(p, read_rows)
            )
            if buffer_size:
                seed = None if shuffle_seed is None else [shuffle_seed, epoch]
                blocks = shuffle_blocks(blocks, ops, buffer_size, batch_size or 1, seed)
            return blocks

        def batches() -> Iterator[Any]:
            blocks = prefetched(produce, ahead, _size_of)
            cut = rebatch(blocks, ops, batch_size, drop_last)
            try:
                while True:
                    # the training thread's wait for each batch, for the goodput breakdown
                    asked = time.perf_counter()
                    batch = next(cut, _END)
                    if batch is _END:
                        data_wait.add(time.perf_counter() - asked)
                        return
                    batch = batch if finish is None else finish(batch)
                    data_wait.add(time.perf_counter() - asked)
                    yield batch
            finally:
                blocks.close()  # type: ignore[attr-defined]

        return batches()

    # -- whole shard ----------------------------------------------------------------------------

    def count(self) -> int:
        """The number of rows in this shard (known without reading)."""
        return self._assignment.num_rows(self._source)

    def schema(self) -> pa.Schema:
        return self._source.schema

    def columns(self) -> list[str]:
        return list(self._source.schema.names)

    def to_arrow(self) -> pa.Table:
        """The whole shard as one ``pyarrow.Table`` (must fit in memory)."""
        epoch = max(self._epoch - 1, 0)  # the rows of the last epoch; no new epoch starts
        pieces = self._assignment.pieces_for(self._source, epoch)
        read_rows = _read_rows(self._source, None)
        batches = [b for p in pieces for b in self._source.read(p, read_rows)]
        return pa.Table.from_batches(batches, schema=self._source.schema)

    def to_pandas(self) -> Any:
        """The whole shard as one ``pandas.DataFrame`` (must fit in memory)."""
        return self.to_arrow().to_pandas()

    def materialize(self) -> DataIterator:
        """This shard read into memory once: later epochs read no storage."""
        return DataIterator(TableSource(self.to_arrow()))

    def stats(self) -> str:
        return f"DataIterator: {self.count()} rows from {self._source.describe()}"

    def __repr__(self) -> str:
        return f"DataIterator(rows={self.count()}, columns={self.columns()})"

    def __getstate__(self) -> dict[str, Any]:
        return {
            "source": self._source,
            "assignment": self._assignment,
            "epoch": self._epoch,
            "prefetch_bytes": self._prefetch_bytes,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._source = state["source"]
        self._assignment = state["assignment"]
        self._epoch = state["epoch"]
        self._prefetch_bytes = state.get("prefetch_bytes")
        self._lock = threading.Lock()


def _check_args(batch_size: Any, prefetch: Any, buffer_size: Any) -> None:
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size={batch_size!r} is invalid: use a positive int or None.")
    if not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"prefetch_batches={prefetch!r} is invalid: use an int >= 0.")
    if buffer_size is not None and (not isinstance(buffer_size, int) or buffer_size < 1):
        raise ValueError(
            f"local_shuffle_buffer_size={buffer_size!r} is invalid: use a positive int or None."
        )


def _read_rows(source: Source, batch_size: int | None) -> int:
    rows = min(max(READ_BYTES // source.row_bytes(), MIN_READ_ROWS), MAX_READ_ROWS)
    return max(rows, batch_size or 0)


def _to_pandas(table: pa.Table) -> Any:
    return table.to_pandas()


def _size_of(batch: Any) -> int:
    if isinstance(batch, dict):
        return sum(int(getattr(v, "nbytes", 1 << 20)) for v in batch.values())
    if isinstance(batch, pa.Table):
        return int(batch.nbytes)
    return 1 << 30  # unknown (a collate_fn's output, a DataFrame): one batch per bundle
