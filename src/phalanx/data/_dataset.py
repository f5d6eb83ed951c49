"""Dataset: a description of where rows are and how to read them; cheap to create and to pickle.

``datasets={"train": X}`` accepts a :class:`Dataset` or anything :func:`as_dataset` turns into
one; the constructors here (``from_pandas``, ``from_numpy``, ...) and in ``_read``
(``read_parquet``, ...) carry options a bare value cannot (columns, the file shuffle).
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from phalanx.data._batching import to_arrow_column
from phalanx.data._iterator import Assignment, DataIterator, Passes
from phalanx.data._mix import MixStoppingCondition, make_rule, split_mixed
from phalanx.data._mix_plan import MixRule
from phalanx.data._plan import Start, pieces_in_range, rank_range
from phalanx.data._position import fingerprint
from phalanx.data._source import Source, TableSource

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "Dataset",
    "MixedDataset",
    "from_arrow",
    "from_items",
    "from_numpy",
    "from_pandas",
]


class Dataset:
    """Rows to train on: split across workers by the trainer, or read whole.

    Example::

        ds = phalanx.data.read_parquet("s3://bucket/train/", columns=["x", "y"], shuffle="files")
        trainer = DataParallelTrainer(train_func, datasets={"train": ds}, ...)
    """

    def __init__(self, source: Source, *, shuffle_files: bool = False, seed: int | None = None):
        self._source = source
        self._shuffle_files = shuffle_files
        self._seed = seed

    @property
    def source(self) -> Source:
        return self._source

    def count(self) -> int:
        return self._source.num_rows

    def schema(self, fetch_if_missing: bool = True) -> pa.Schema:
        """The columns' names and types (``.names``, ``.types``), known without reading rows."""
        return self._source.schema

    def columns(self, fetch_if_missing: bool = True) -> list[str]:
        return list(self._source.schema.names)

    def randomize_block_order(self, seed: int | None = None) -> Dataset:
        """The same rows, with the fragments (Parquet row groups, files, blocks of in-memory
        rows) read in a new seeded order every epoch, identically on every rank."""
        return Dataset(self._source, shuffle_files=True, seed=seed)

    def mix(
        self,
        *other: object,
        weights: Sequence[float] | None = None,
        stopping_condition: object = None,
    ) -> Dataset:
        """This dataset's rows and ``other``'s in the ratio of ``weights`` (this one's first;
        default: equal; normalized), as Ray Data's ``mix``. Unlike Ray's, the ratio holds in
        every global batch (all ranks' batch ``i`` together: each source within one row of its
        share), the mix is the same in every run, and a mixed dataset resumes exactly from a
        checkpoint. ``stopping_condition``: ``MixStoppingCondition.STOP_ON_LONGEST_DROP``
        (default) or ``STOP_ON_SHORTEST``.

        Example::

            ds = phalanx.data.read_parquet("web/").mix(
                phalanx.data.read_parquet("code/"), weights=[0.75, 0.25]
            )
        """
        if not other:
            raise ValueError("mix: no other dataset given.\nHINT: a.mix(b, weights=[0.75, 0.25]).")
        parts = check_parts([self, *other])
        condition = stopping_condition or MixStoppingCondition.STOP_ON_LONGEST_DROP
        return MixedDataset(parts, make_rule(len(parts), weights, condition))

    def iterator(self) -> DataIterator:
        """One iterator over every row."""
        return self.streaming_split(1, equal=False)[0]

    def streaming_split(self, n: int, *, equal: bool = True) -> list[DataIterator]:
        """``n`` disjoint shards covering the rows. ``equal=True``: each has ``count() // n``
        rows, and the last ``count() % n`` rows (of each epoch's order) are left out."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n={n!r} is invalid: use a positive int.")
        return self._split(n, equal)

    def _split(
        self,
        n: int,
        equal: bool,
        start: Start | None = None,
        seed: int | None = None,
        split: bool = True,
    ) -> list[DataIterator]:
        """``streaming_split``, the passes beginning at ``start`` (a resume), the file order
        seeded by ``seed`` (a resume's; default: the dataset's, else drawn now). ``split=False``
        marks an iterator over every row that a rank reads whole (its position is not kept)."""
        source, total = self._source, self._source.num_rows
        start = start or Start()
        common: dict[str, Any] = {
            "world_size": n,
            "equal": equal,
            "total": total,
            "fingerprint": fingerprint(source),
            "start": start,
            "split": split,
        }
        if self._shuffle_files:
            seed = seed if seed is not None else self._seed
            seed = seed if seed is not None else secrets.randbits(63)
            return [DataIterator(source, Assignment(seed=seed, rank=r, **common)) for r in range(n)]
        if start.partial:  # the first passes read scattered rows: every rank gets the source
            return [DataIterator(source, Assignment(rank=r, **common)) for r in range(n)]
        shards = []
        for rank in range(n):
            lo, hi = rank_range(total, rank, n, equal)
            pieces = pieces_in_range(source.fragment_rows, lo, hi)
            subset, local = source.restrict(pieces)
            shards.append(DataIterator(subset, Assignment(local, rank=rank, **common)))
        return shards

    # -- reading, as Ray Data's Dataset ----------------------------------------------------------

    def iter_batches(
        self,
        *,
        prefetch_batches: int = 1,
        batch_size: int | None = 256,
        batch_format: str | None = "default",
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
    ) -> Passes:
        """Batches over every row: a dict of numpy arrays (``"default"``/``"numpy"``), a
        pandas DataFrame (``"pandas"``) or a pyarrow Table (``"pyarrow"``)."""
        return self.iterator().iter_batches(
            prefetch_batches=prefetch_batches,
            batch_size=batch_size,
            batch_format=batch_format or "default",
            drop_last=drop_last,
            local_shuffle_buffer_size=local_shuffle_buffer_size,
            local_shuffle_seed=local_shuffle_seed,
        )

    def iter_torch_batches(self, **kwargs: Any) -> Passes:
        return self.iterator().iter_torch_batches(**kwargs)

    def iter_rows(self) -> Iterator[dict[str, Any]]:
        return self.iterator().iter_rows()

    def take_batch(self, batch_size: int = 20, *, batch_format: str | None = "default") -> Any:
        """The first ``batch_size`` rows as one batch."""
        batches = iter(
            self.iter_batches(batch_size=batch_size, batch_format=batch_format, prefetch_batches=0)
        )
        try:
            return next(batches)
        except StopIteration:
            raise ValueError("take_batch: the dataset has no rows.") from None
        finally:
            batches.close()  # type: ignore[attr-defined]

    def take(self, limit: int = 20) -> list[dict[str, Any]]:
        """Up to ``limit`` rows, as dicts."""
        if not self.count() or limit <= 0:
            return []
        return self.take_batch(limit, batch_format="pyarrow").to_pylist()  # type: ignore[no-any-return]

    def take_all(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Every row, as dicts; ValueError if there are more than ``limit``."""
        from phalanx.data._transform import check_limit

        check_limit(self.count(), limit, "take_all")
        return self.iterator().to_arrow().to_pylist()  # type: ignore[no-any-return]

    def show(self, limit: int = 20) -> None:
        """Print up to ``limit`` rows, one dict per line (as Ray Data's ``show``)."""
        for row in self.take(limit):
            sys.stdout.write(f"{row}\n")

    def to_pandas(self, limit: int | None = None) -> Any:
        """Every row as one DataFrame; ValueError if there are more than ``limit``."""
        from phalanx.data._transform import check_limit

        check_limit(self.count(), limit, "to_pandas")
        return self.iterator().to_pandas()

    def to_arrow(self) -> pa.Table:
        return self.iterator().to_arrow()

    def materialize(self) -> Dataset:
        """The rows read into memory once."""
        return from_arrow(self.to_arrow())

    def sum(self, on: str) -> Any:
        """The sum of column ``on`` (Ray Data's aggregate, computed here at once)."""
        return self._aggregate("sum", on)

    def mean(self, on: str) -> Any:
        return self._aggregate("mean", on)

    def min(self, on: str) -> Any:
        return self._aggregate("min", on)

    def max(self, on: str) -> Any:
        return self._aggregate("max", on)

    def _aggregate(self, how: str, on: str) -> Any:
        import pyarrow.compute as pc

        if on not in self.columns():
            raise ValueError(f"{how}(on={on!r}): no such column; the columns are {self.columns()}.")
        return getattr(pc, how)(self.select_columns([on]).to_arrow()[on]).as_py()

    def select_columns(self, cols: list[str]) -> Dataset:
        """Only columns ``cols``, held in memory."""
        return from_arrow(self.to_arrow().select(list(cols)))

    def map_batches(
        self,
        fn: Callable[..., object],
        *,
        batch_size: int | str | None = None,
        compute: object = None,
        batch_format: str | None = "default",
        zero_copy_batch: bool = True,
        fn_args: Iterable[Any] | None = None,
        fn_kwargs: dict[str, Any] | None = None,
        fn_constructor_args: Iterable[Any] | None = None,
        fn_constructor_kwargs: dict[str, Any] | None = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        memory: float | None = None,
        concurrency: object = None,
        **ray_remote_args: object,
    ) -> Dataset:
        """``fn`` applied to every batch (a function, or a callable class built once with
        ``fn_constructor_args/kwargs``; it may return or yield batches). Unlike Ray Data, this
        runs now, in this process, and the output is held in memory; the resource arguments
        are accepted and unused."""
        from phalanx.data._transform import map_batches

        table = map_batches(
            self,
            fn,
            batch_size,
            batch_format,
            fn_args,
            fn_kwargs,
            (fn_constructor_args, fn_constructor_kwargs),
        )
        return from_arrow(table if table is not None else self._source.schema.empty_table())

    def __repr__(self) -> str:
        shuffle = ", shuffle_files=True" if self._shuffle_files else ""
        return f"Dataset({self._source.describe()}, columns={self.columns()}{shuffle})"


def from_arrow(table: pa.Table) -> Dataset:
    """A dataset of a pyarrow table's rows (held in memory, sharded by rows across workers).

    Example::

        dataset = phalanx.data.from_arrow(pa.table({"x": [1.0, 2.0], "y": [0, 1]}))
    """
    return Dataset(TableSource(table))


def from_pandas(df: pd.DataFrame) -> Dataset:
    """A dataset of a pandas DataFrame's rows (its index is dropped).

    Example::

        dataset = phalanx.data.from_pandas(pd.DataFrame({"x": [1.0, 2.0], "y": [0, 1]}))
    """
    return Dataset(TableSource(pa.Table.from_pandas(df, preserve_index=False)))


def from_numpy(arrays: np.ndarray | dict[str, Any]) -> Dataset:
    """A dict of equal-length arrays (one column each), or one array (column ``"data"``).
    Arrays with more than one dimension become tensor columns, given back with their shape.

    Example::

        dataset = phalanx.data.from_numpy({"image": np.zeros((8, 28, 28)), "label": np.arange(8)})
    """
    if isinstance(arrays, np.ndarray):
        arrays = {"data": arrays}
    return Dataset(TableSource(pa.table({k: to_arrow_column(v) for k, v in arrays.items()})))


def from_items(items: list[dict[str, Any]]) -> Dataset:
    """A dataset of a list of rows (dicts of column to value).

    Example::

        dataset = phalanx.data.from_items([{"x": i, "y": i % 2} for i in range(100)])
    """
    return Dataset(TableSource(pa.Table.from_pylist(items)))


class MixedDataset(Dataset):
    """Rows of several datasets in the ratio of their weights (what ``Dataset.mix`` returns).

    Split over the ranks as its sources are (each rank reads its own shard of every source);
    each global batch (batch ``i`` of every rank together) holds, of each source, within one
    row of its weight times the global batch's rows."""

    def __init__(self, parts: Sequence[Dataset], rule: MixRule) -> None:
        super().__init__(parts[0].source)
        self._parts = list(parts)
        self._rule = rule

    @property
    def weights(self) -> tuple[float, ...]:
        """The weights, normalized to sum to 1."""
        return self._rule.weights

    @property
    def stopping_condition(self) -> MixStoppingCondition:
        return (
            MixStoppingCondition.STOP_ON_SHORTEST
            if self._rule.stop_on_shortest
            else MixStoppingCondition.STOP_ON_LONGEST_DROP
        )

    def count(self) -> int:
        """Rows of one epoch of the mix (for ``STOP_ON_SHORTEST``, fewer than the sources')."""
        return self._rule.epoch_rows([p.count() for p in self._parts])

    def randomize_block_order(self, seed: int | None = None) -> Dataset:
        return MixedDataset([p.randomize_block_order(seed) for p in self._parts], self._rule)

    def _split(
        self,
        n: int,
        equal: bool,
        start: Start | None = None,
        seed: int | None = None,
        split: bool = True,
    ) -> list[DataIterator]:
        if start is not None and (start.partial or start.epoch):
            raise ValueError("A mixed dataset resumes through resume_split, not a Start.")
        return list(split_mixed(self._parts, self._rule, n, equal, split=split))

    def materialize(self) -> Dataset:
        return MixedDataset([p.materialize() for p in self._parts], self._rule)

    def select_columns(self, cols: list[str]) -> Dataset:
        return MixedDataset([p.select_columns(cols) for p in self._parts], self._rule)

    def __repr__(self) -> str:
        inner = ", ".join(repr(p) for p in self._parts)
        return (
            f"MixedDataset([{inner}], weights={list(self.weights)}, "
            f"stopping_condition={self.stopping_condition.name})"
        )


def check_parts(parts: Sequence[object]) -> list[Dataset]:
    """The datasets to mix: phalanx datasets of one schema, none itself a mix."""
    out = []
    for i, part in enumerate(parts):
        if isinstance(part, MixedDataset):
            raise ValueError(
                f"mix: dataset {i} is itself a mix.\nHINT: mix all the datasets in one call, "
                "a.mix(b, c, weights=[...]), with the weights multiplied out."
            )
        if not isinstance(part, Dataset):
            raise ValueError(
                f"mix: dataset {i} is a {type(part).__name__}, not a phalanx dataset.\nHINT: "
                "turn it into one first: phalanx.data.as_dataset(value) (a table, arrays, "
                "records or paths)."
            )
        out.append(part)
    names = out[0].columns()
    for i, part in enumerate(out[1:], 1):
        if part.columns() != names:
            raise ValueError(
                f"mix: dataset {i} has columns {part.columns()}, dataset 0 has {names}; mixed "
                "datasets must have the same columns.\nHINT: select_columns(...) or "
                "map_batches(...) each dataset to the same columns before mixing."
            )
        mine, first = part.schema(), out[0].schema()
        differ = [n for n in names if mine.field(n).type != first.field(n).type]
        if differ:
            n = differ[0]
            raise ValueError(
                f"mix: column {n!r} is {mine.field(n).type} in dataset {i} but "
                f"{first.field(n).type} in dataset 0; mixed datasets must have the same column "
                "types.\nHINT: map_batches(...) the datasets to the same types before mixing."
            )
    return out
