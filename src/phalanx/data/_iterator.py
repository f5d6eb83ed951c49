"""DataIterator: one worker's shard of a dataset; every pass over an ``iter_*`` result is one
epoch over it, and the iterator knows where the pass it is in stands (``position_state``).

A pass itself (reading, shuffling, batching, counting) is in ``_pass``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from phalanx.data._batching import ARROW, NUMPY, NUMPY_WRITABLE, BlockOps
from phalanx.data._pass import BatchArgs, Passes, read, read_rows, start_pass
from phalanx.data._plan import Assignment, Piece, ranges_len
from phalanx.data._position import DataPosition, PassPosition
from phalanx.data._source import Source, TableSource

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Assignment", "DataIterator", "Passes"]

BATCH_FORMATS = ("numpy", "pandas", "pyarrow", "default")


class DataIterator:
    """This worker's shard of one dataset, read in batches (what ``get_dataset_shard`` returns).

    What ``iter_batches`` / ``iter_torch_batches`` return is an iterable, as in Ray: each pass
    over it (each ``for`` loop, or ``iter()``) is one epoch over the shard, so it can be handed
    once to a framework that loops over it every epoch (a Lightning ``train_dataloaders``). Rows
    are read from storage by this worker, in a background thread that stays about
    ``prefetch_batches`` batches ahead (at least one block of rows as read), so memory stays
    bounded whatever the dataset's size.

    It counts the rows it has given out in the pass in progress (``position()``); ``report()``
    sends that with each round, and an attempt that starts from a checkpoint continues the
    epoch there: its first pass reads only the rows of the epoch no rank had consumed (split
    over the new world size), the next passes are the following epochs. A local shuffle's
    order depends only on its seed, the epoch and the shard, so that too is exact.

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
        self._passes = 0
        self._position: PassPosition | None = None
        self._prefetch_bytes: int | None = None
        self._lock = threading.Lock()

    def limit_prefetch_bytes(self, limit: int | None) -> None:
        """Hold at most about ``limit`` bytes of rows read ahead (None: ``prefetch_batches``
        alone decides); what ``DataConfig(execution_options=...)``'s object-store limit sets."""
        self._prefetch_bytes = limit

    # -- position -------------------------------------------------------------------------------

    def position(self) -> DataPosition:
        """Where this rank is in its shard: the epoch of the pass in progress (the last one
        started), the rows of it given out so far (``consumed``) and the rows of the whole pass
        (``rows``; a pass resumed from a checkpoint holds only what the checkpoint left of its
        epoch). Before the first pass: the epoch it will read, nothing consumed.

        Example::

            position = phalanx.get_dataset_shard("train").position()
            print(f"epoch {position.epoch}: {position.consumed} of {position.rows} rows")
        """
        current = self._position
        if current is None:
            a = self._assignment
            rows = ranges_len(a.positions(self._source.num_rows, self._passes))
            return DataPosition(a.epoch_of(self._passes), 0, rows)
        return DataPosition(current.epoch, min(current.consumed, current.rows), current.rows)

    def position_state(self) -> dict[str, Any] | None:
        """The position of the pass in progress as a small JSON-able dict, for the driver's
        ``phalanx.data._position.combine`` (None before the first pass, and for a dataset every
        rank reads whole, whose position is not kept). Two passes at once: the last started
        counts; a pass left early (``break``) counts as done once the next one starts."""
        current = self._position
        if current is None or not self._assignment.split:
            return None
        return current.state()

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
        blocks as read. With ``local_shuffle_buffer_size``, each batch is drawn at random
        from about that many rows around it (seeded by ``local_shuffle_seed``, else a seed
        drawn per pass; each epoch differs).
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
        dtypes: object = None,
        device: object = "auto",
        collate_fn: Callable[[Any], Any] | None = None,
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
        stack_columns: dict[str, Any] | None = None,
    ) -> Passes:
        """Batches as a dict of column -> ``torch.Tensor`` on ``device`` (``"auto"``: this
        worker's device). ``dtypes``: one torch dtype or a dict per column. ``collate_fn`` gets
        each numpy batch (pyarrow/pandas for Ray's ``ArrowBatchCollateFn`` /
        ``PandasBatchCollateFn`` subclasses) and returns the batch; tensors in what it returns
        are moved to ``device``.

        ``stack_columns``: ``{"features": ["c0", "c1", ...]}`` gives those numeric columns as
        one ``(rows, columns)`` tensor named ``features`` (in that order, their common dtype or
        ``dtypes["features"]``) instead of a tensor each: stacked once per block read, so
        handing out a batch is a slice (the fastest way to feed a wide table, and one
        transfer per block to a GPU)."""
        from phalanx.data import _torch_batches as tb

        _check_args(batch_size, prefetch_batches, local_shuffle_buffer_size)
        if collate_fn is not None and dtypes is not None:
            raise ValueError(
                "iter_torch_batches: collate_fn cannot be used with dtypes.\nHINT: convert the "
                "tensors to the dtypes you want inside collate_fn."
            )
        stack = None
        if stack_columns is not None:
            if collate_fn is not None:
                raise ValueError(
                    "iter_torch_batches: collate_fn cannot be used with stack_columns.\nHINT: "
                    "stack the columns inside collate_fn."
                )
            stack = tb.check_stack_columns(stack_columns, self.schema())
        target = tb.resolve_device(device)
        # Tensors share the memory of the rows they come from: copy rows that are not ours.
        numpy_ops = NUMPY if self._source.private_buffers else NUMPY_WRITABLE
        ops: BlockOps[Any]
        finish: Callable[[Any], Any]
        if collate_fn is None:
            # on CUDA, blocks travel to the device whole, in the read-ahead thread (staged)
            tensor_ops = tb.TensorOps(dtypes, self._source.private_buffers, target, stack)
            ops, finish = tensor_ops, tensor_ops.finish

        else:
            fmt = tb.collate_format(collate_fn)
            convert = _to_pandas if fmt == "pandas" else None
            ops = ARROW if fmt in ("pandas", "pyarrow") else numpy_ops

            def finish(batch: object) -> Any:
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
        feature_type_spec: object = None,
        label_type_spec: object = None,
        additional_type_spec: object = None,
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
            index, self._passes = self._passes, self._passes + 1
        args = BatchArgs(
            ops, finish, batch_size, drop_last, buffer_size, shuffle_seed, prefetch_batches
        )
        position, batches = start_pass(
            self._source, self._assignment, index, args, self._prefetch_bytes
        )
        self._position = position
        return batches

    # -- whole shard ----------------------------------------------------------------------------

    def count(self) -> int:
        """The number of rows in this shard (known without reading)."""
        return self._assignment.num_rows(self._source)

    def schema(self) -> pa.Schema:
        return self._source.schema

    def columns(self) -> list[str]:
        return list(self._source.schema.names)

    def to_arrow(self) -> pa.Table:
        """The whole shard as one ``pyarrow.Table`` (must fit in memory): a whole epoch's
        rows, also when the shard's first pass resumes a checkpoint's partial epoch."""
        # the rows of the last pass, no new pass started; never a resumed partial one
        index = max(self._passes - 1, len(self._assignment.start.partial))
        pieces = self._assignment.pieces_for(self._source, index)
        batches = list(read(self._source, pieces, read_rows(self._source, None)))
        return pa.Table.from_batches(batches, schema=self._source.schema)

    def to_pandas(self) -> pd.DataFrame:
        """The whole shard as one ``pandas.DataFrame`` (must fit in memory)."""
        return self.to_arrow().to_pandas()

    def materialize(self) -> DataIterator:
        """This shard read into memory once: later epochs read no storage."""
        return DataIterator(TableSource(self.to_arrow()))

    def stats(self) -> str:
        return f"DataIterator: {self.count()} rows from {self._source.describe()}"

    def __repr__(self) -> str:
        return f"DataIterator(rows={self.count()}, columns={self.columns()})"

    def __getstate__(self) -> dict[str, object]:
        return {
            "source": self._source,
            "assignment": self._assignment,
            "passes": self._passes,
            "prefetch_bytes": self._prefetch_bytes,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._source = state["source"]
        self._assignment = state["assignment"]
        self._passes = state["passes"]
        self._position = None
        self._prefetch_bytes = state.get("prefetch_bytes")
        self._lock = threading.Lock()


def _check_args(batch_size: object, prefetch: object, buffer_size: object) -> None:
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size={batch_size!r} is invalid: use a positive int or None.")
    if not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"prefetch_batches={prefetch!r} is invalid: use an int >= 0.")
    if buffer_size is not None and (not isinstance(buffer_size, int) or buffer_size < 1):
        raise ValueError(
            f"local_shuffle_buffer_size={buffer_size!r} is invalid: use a positive int or None."
        )


def _to_pandas(table: pa.Table) -> pd.DataFrame:
    return table.to_pandas()
