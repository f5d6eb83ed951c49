"""``Dataset.map_batches``: a user function over every batch, run at once in this process.

phalanx Datasets describe rows to be read by training workers; a function that may change the
number of rows cannot be deferred into that plan, so ``map_batches`` runs now, batch by batch,
and its output is held in memory as a new Dataset (Ray Data defers it to a cluster instead).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from phalanx.data._batching import to_arrow_column

__all__ = ["check_limit", "map_batches", "pandas_to_arrow", "to_arrow_batch"]

DEFAULT_BATCH_SIZE = 4096


def map_batches(
    dataset: Any,
    fn: Any,
    batch_size: int | str | None,
    batch_format: str | None,
    fn_args: Iterable[Any] | None,
    fn_kwargs: dict[str, Any] | None,
    constructor: tuple[Iterable[Any] | None, dict[str, Any] | None],
) -> pa.Table | None:
    """All of ``fn``'s output batches as one table (None if it gave none)."""
    call = _callable(fn, *constructor)
    size = DEFAULT_BATCH_SIZE if batch_size in ("default", "auto") else batch_size
    fmt = "numpy" if batch_format in (None, "default") else batch_format
    tables: list[pa.Table] = []
    for batch in dataset.iter_batches(batch_size=size, batch_format=fmt, prefetch_batches=0):
        out = call(batch, *(fn_args or ()), **(fn_kwargs or {}))
        outputs = out if isinstance(out, Iterator) else [out]
        tables.extend(to_arrow_batch(o) for o in outputs)
    return pa.concat_tables(tables, promote_options="default") if tables else None


def _callable(
    fn: object, args: Iterable[object] | None, kwargs: Mapping[str, object] | None
) -> Callable[..., Any]:
    if isinstance(fn, type):  # a callable class: built once, as Ray's actor would
        return fn(*(args or ()), **(kwargs or {}))  # type: ignore[no-any-return]
    if args or kwargs:
        raise ValueError(
            "map_batches got fn_constructor_args/kwargs, but fn is a function, not a class.\n"
            "HINT: pass them only with a callable class."
        )
    if not callable(fn):
        raise TypeError(f"map_batches(fn={fn!r}): fn must be a function or a callable class.")
    return fn  # type: ignore[no-any-return]


def to_arrow_batch(batch: object) -> pa.Table:
    """A batch a function returned (pyarrow, pandas or a dict of arrays) as a pyarrow Table."""
    if isinstance(batch, pa.Table):
        return batch
    if isinstance(batch, pd.DataFrame):
        return pandas_to_arrow(batch)
    if isinstance(batch, dict):
        return pa.table({str(k): to_arrow_column(v) for k, v in batch.items()})
    raise TypeError(
        f"map_batches' fn returned a {type(batch).__name__}; it must return a pandas DataFrame, "
        "a pyarrow Table or a dict of numpy arrays (or yield them)."
    )


def pandas_to_arrow(df: pd.DataFrame) -> pa.Table:
    """A DataFrame as a pyarrow Table; a column of numpy arrays becomes a list column."""
    data = {}
    for name in df.columns:
        values = df[name]
        if values.dtype == object and len(values) and isinstance(values.iloc[0], np.ndarray):
            data[str(name)] = pa.array([v.tolist() for v in values])
        else:
            data[str(name)] = pa.array(values.to_numpy(), from_pandas=True)
    return pa.table(data)


def check_limit(count: int, limit: int | None, what: str) -> None:
    if limit is not None and count > limit:
        raise ValueError(
            f"The dataset has {count} rows, more than the given limit of {limit}.\n"
            f"HINT: if {count} rows fit in memory, call {what}(limit=None); or use take(n)."
        )
