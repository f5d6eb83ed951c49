"""What the trainer calls: check ``datasets=`` at construction, shard it at each attempt.

``validate_datasets`` runs in the Trainer's constructor (cheap: files are listed and their
footers read, in-memory data is checked, nothing is converted). ``shard_datasets`` runs at the
start of every attempt (a callable dataset is called again then) and returns, per rank, the
``DataIterator`` that ``get_dataset_shard(name)`` gives back. The iterators are light: a file
shard lists the row groups / files of its rank; an in-memory table is shared through one
memory-mapped file rather than copied into every worker's pickle.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np
import pyarrow as pa

from phalanx._foundation.execution_options import options_for, prefetch_bytes
from phalanx.config import DataConfig
from phalanx.data._dataset import (
    Dataset,
    MixedDataset,
    from_arrow,
    from_items,
    from_numpy,
    from_pandas,
)
from phalanx.data._describe import shorten
from phalanx.data._files import file_source
from phalanx.data._iterator import DataIterator
from phalanx.data._mix import resume_split
from phalanx.data._plan import ranges_len
from phalanx.data._position import resume_start
from phalanx.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow.dataset as pds
    import ray.data

__all__ = ["as_dataset", "require_columns", "shard_datasets", "validate_datasets"]

logger = logging.getLogger(__name__)

ACCEPTED = (
    "a pandas DataFrame, a pyarrow Table, a dict of numpy arrays, a list of dicts (records), a "
    "path or URI (or a list of them) of Parquet/CSV/JSON-lines files or folders, a pyarrow "
    "dataset, a phalanx.data.Dataset, a ray.data.Dataset (on Ray), or a function returning one"
)


def validate_datasets(datasets: Mapping[str, object], data_config: DataConfig) -> None:
    """Raise ConfigError for anything ``shard_datasets`` could not read."""
    for name in datasets:
        if not isinstance(name, str):
            raise ConfigError(f"datasets has a key {name!r}: dataset names must be strings.")
    split = data_config.datasets_to_split
    if split != "all":
        unknown = sorted(set(split) - set(datasets))
        if unknown:
            raise ConfigError(
                f"DataConfig(datasets_to_split={list(split)}) names {unknown}, which are not in "
                f"datasets (given: {sorted(datasets)}).\nHINT: use the keys of datasets=."
            )
    resume = data_config.resume_position
    if isinstance(resume, dict) and set(resume) - set(datasets):
        raise ConfigError(
            f"DataConfig(resume_position={resume}) names {sorted(set(resume) - set(datasets))}, "
            f"which are not in datasets (given: {sorted(datasets)}).\nHINT: use the keys of "
            "datasets=."
        )
    for name, value in datasets.items():
        if _is_ray_dataset(value) or _is_factory(value):
            continue  # a factory is checked when it is called, at the start of each attempt
        _check_value(value, _label(name))


def shard_datasets(
    datasets: dict[str, Any],
    data_config: DataConfig,
    world_size: int,
    resume: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One dict per rank: dataset name -> that rank's ``DataIterator`` (split datasets) or an
    iterator over every row (the others). Split datasets are split equally: every rank gets
    ``rows // world_size`` rows, and the remainder is left out, so ranks run the same steps.

    ``resume``: dataset name -> the record ``phalanx.data._position.combine`` made at the
    checkpoint the attempt starts from. The first pass over each split dataset with a record
    reads what the record left of its epoch, split exactly and disjointly over ``world_size``
    ranks; later passes are the following epochs, in the order a run that never stopped reads
    them. Datasets read whole by every rank start their epochs over (as in Ray)."""
    split = data_config.datasets_to_split
    # DataConfig(equal_split=False) keeps every row; the ranks then differ by at most one row.
    equal = data_config.equal_split
    shards: list[dict[str, Any]] = [{} for _ in range(world_size)]
    for name, value in datasets.items():
        if _is_factory(value):
            value = _call_factory(name, value)
        is_split = split == "all" or name in split
        options = options_for(data_config, name)
        iterators = _ray_iterators(value, world_size, is_split, options)
        if iterators is None:
            dataset = as_dataset(value, name)
            if is_split:
                record = (resume or {}).get(name) if data_config.resumes(name) else None
                iterators = _split(dataset, name, world_size, equal, record)
            else:  # one iterator object per rank: each keeps its own epoch count
                iterators = [dataset._split(1, False, split=False)[0] for _ in range(world_size)]
            for iterator in iterators:
                iterator.limit_prefetch_bytes(prefetch_bytes(options))
        for rank, iterator in enumerate(iterators):
            shards[rank][name] = iterator
    return shards


def _split(
    dataset: Dataset, name: str, world_size: int, equal: bool, record: Mapping[str, object] | None
) -> list[DataIterator]:
    if not isinstance(record, dict):
        _log_split(name, dataset.count(), world_size, equal)
        return dataset.streaming_split(world_size, equal=equal)
    if isinstance(dataset, MixedDataset):
        _log_split(name, dataset.count(), world_size, equal, resumed=int(record.get("epoch", 0)))
        return list(resume_split(dataset._parts, dataset._rule, world_size, equal, record, name))
    own_seed = dataset._seed if dataset._shuffle_files else None
    start, seed = resume_start(record, name, dataset.source, own_seed)
    if start.partial:
        _log_split(name, ranges_len(start.partial[0]), world_size, equal, resumed=start.epoch)
    else:
        _log_split(name, dataset.count(), world_size, equal)
    return dataset._split(world_size, equal, start=start, seed=seed)


def as_dataset(value: object, name: str = "dataset") -> Dataset:
    """``value`` (any accepted kind of data) as a :class:`Dataset`.

    Example::

        dataset = as_dataset(pandas_frame, name="train")  # as Trainer(datasets=...) does
    """
    label = _label(name)
    if _is_paths(value):
        return Dataset(file_source(value, label=label))
    if _is_arrow_dataset(value):
        return _from_arrow_dataset(value, label)
    _check_value(value, label)
    if isinstance(value, Dataset):
        return value
    if isinstance(value, pa.Table):
        return from_arrow(value)
    if _is_pandas(value):
        return _converted(label, from_pandas, value)
    if isinstance(value, np.ndarray | dict):
        return _converted(label, from_numpy, value)
    return _converted(label, from_items, value)


def require_columns(
    data: object, columns: Sequence[str], what: str, name: str | None = None
) -> None:
    """Raise ConfigError if ``data`` (a dataset value, a Dataset or a DataIterator) lacks any of
    ``columns``. For trainers that need e.g. a label column::

        require_columns(datasets["train"], [label_column], f"label_column={label_column!r}")

    A function returning a dataset is not called; its columns are checked when it is.
    """
    if _is_factory(data):
        return
    have = _column_names(data, name or "dataset")
    if have is None:
        return
    missing = [c for c in columns if c not in have]
    if missing:
        where = f"dataset {name!r}" if name else "the dataset"
        raise ConfigError(
            f"{what} needs column(s) {missing}, but {where} has columns {have}.\n"
            "HINT: check the spelling (column names are case-sensitive), or add the column "
            "to the data."
        )


# -- checks ---------------------------------------------------------------------------------


def _check_value(value: object, label: str) -> None:
    if isinstance(value, Dataset | pa.Table) or _is_pandas(value):
        return
    if _is_paths(value):
        file_source(value, label=label)  # lists files, reads footers: raises if unreadable
    elif _is_arrow_dataset(value):
        _from_arrow_dataset(value, label)
    elif isinstance(value, np.ndarray):
        return
    elif isinstance(value, dict):
        _check_arrays(value, label)
    elif isinstance(value, list) and all(isinstance(r, dict) for r in value):
        _check_records(value, label)
    else:
        raise ConfigError(
            f"{label} is a {type(value).__module__}.{type(value).__qualname__}, which phalanx "
            f"cannot read.\nIt accepts {ACCEPTED}.\nHINT: convert it, e.g. to a pandas "
            "DataFrame or a dict of numpy arrays."
        )


def _check_arrays(value: dict[Any, Any], label: str) -> None:
    lengths = {}
    for key, column in value.items():
        if not isinstance(key, str) or not hasattr(column, "__len__"):
            raise ConfigError(
                f"{label} is a dict, so it must map column names (str) to arrays; "
                f"{key!r} maps to a {type(column).__name__}.\nHINT: pass "
                "{'x': np.array(...), 'y': np.array(...)}."
            )
        lengths[key] = len(column)
    if len(set(lengths.values())) > 1:
        raise ConfigError(
            f"{label}: its arrays have different lengths ({lengths}).\n"
            "HINT: every column must have one value per row."
        )


def _check_records(value: list[dict[str, Any]], label: str) -> None:
    if not value:
        return
    keys = list(value[0])
    for i, record in enumerate(value):
        if list(record) != keys and set(record) != set(keys):
            raise ConfigError(
                f"{label} has mixed schemas: record 0 has keys {keys} but record {i} has "
                f"{list(record)}.\nHINT: give every record the same keys (use None for missing "
                "values)."
            )


def _column_names(data: object, name: str) -> list[str] | None:
    if isinstance(data, Dataset | DataIterator):
        return data.columns()
    if isinstance(data, pa.Table):
        return list(data.column_names)
    if _is_pandas(data):
        return [str(c) for c in data.columns]
    if isinstance(data, dict):
        return [str(c) for c in data]
    if isinstance(data, list) and data and isinstance(data[0], dict):
        return list(data[0])
    if _is_ray_dataset(data):
        schema = data.schema()
        return list(schema.names) if schema is not None else None
    return as_dataset(data, name).columns()


# -- kinds of values ------------------------------------------------------------------------


def _label(name: str) -> str:
    return f"datasets[{name!r}]"


def _is_factory(value: object) -> bool:
    known = Dataset | pa.Table | dict | list | str | os.PathLike | np.ndarray
    return callable(value) and not isinstance(value, known) and not _is_pandas(value)


def _call_factory(name: str, factory: Callable[[], object]) -> object:
    try:
        value = factory()
    except Exception as exc:
        if hasattr(exc, "add_note"):  # Python 3.11+; on 3.10 the traceback still points here
            exc.add_note(f"(raised by the function given as datasets[{name!r}])")
        raise
    if _is_factory(value):
        raise ConfigError(
            f"datasets[{name!r}] is a function that returned another function ({value!r}).\n"
            f"HINT: it must return the data itself: {ACCEPTED}."
        )
    return value


def _is_pandas(value: object) -> TypeGuard[pd.DataFrame]:
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(value, pd.DataFrame)


def _is_paths(value: object) -> bool:
    if isinstance(value, str | os.PathLike):
        return True
    return (
        isinstance(value, list | tuple)
        and bool(value)
        and all(isinstance(v, str | os.PathLike) for v in value)
    )


def _is_arrow_dataset(value: object) -> TypeGuard[pds.Dataset]:
    if not type(value).__module__.startswith("pyarrow"):
        return False
    import pyarrow.dataset as pds

    return isinstance(value, pds.Dataset)


def _is_ray_dataset(value: object) -> TypeGuard[ray.data.Dataset]:
    if "ray" not in sys.modules or not type(value).__module__.startswith("ray"):
        return False
    try:
        from phalanx.data import _ray_data as ray_data
    except ImportError:
        return False
    return bool(ray_data.is_ray_dataset(value))


def _ray_iterators(
    value: object, world_size: int, split: bool, options: object
) -> list[Any] | None:
    """Ray Data's own iterators for a ``ray.data.Dataset`` (``streaming_split`` when split),
    with ``options`` (execution options; None: Ray's ingest defaults) set on a copy of it, as
    Ray Train does."""
    if not _is_ray_dataset(value):
        if "ray" in sys.modules and type(value).__module__.startswith("ray.data"):
            raise ConfigError(
                f"A {type(value).__name__} from Ray Data needs phalanx's Ray support "
                "(phalanx.data._ray_data), which is not available here.\nHINT: pass the data's "
                "files (a path) or a pandas DataFrame instead."
            )
        return None
    from phalanx.data import _ray_data as ray_data

    value = ray_data.with_execution_options(value, options)
    if split:
        return list(ray_data.split_ray_dataset(value, world_size))
    return [ray_data.ray_dataset_iterator(value) for _ in range(world_size)]


def _converted(label: str, convert: Any, value: Any) -> Dataset:
    try:
        return convert(value)  # type: ignore[no-any-return]
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise ConfigError(
            f"{label} cannot be converted to Arrow columns: {shorten(str(exc))}.\nHINT: give "
            "each column "
            "one type (e.g. no mix of numbers and strings in one column)."
        ) from exc


def _from_arrow_dataset(value: pds.Dataset, label: str) -> Dataset:
    """A pyarrow dataset: file datasets are read file by file (with their partition columns),
    others are materialized."""
    import pyarrow.dataset as pds

    if not isinstance(value, pds.FileSystemDataset):
        return from_arrow(value.to_table())
    fragments = list(value.get_fragments())
    files = [f.path for f in fragments]
    constants = [pds.get_partition_keys(f.partition_expression) for f in fragments]
    keys = {k for c in constants for k in c}
    constant_schema = pa.schema([value.schema.field(k) for k in value.schema.names if k in keys])
    fmt = value.format.default_extname
    fmt = {"parquet": "parquet", "csv": "csv", "json": "json"}.get(fmt)
    if fmt is None or (fmt != "parquet" and keys):
        return from_arrow(value.to_table())
    source = file_source(
        files,
        label=label,
        format=fmt,
        filesystem=value.filesystem,
        file_constants=constants if keys else None,
        constant_schema=constant_schema if keys else None,
    )
    return Dataset(source)


def _log_split(
    name: str, rows: int, world_size: int, equal: bool, resumed: int | None = None
) -> None:
    dropped = rows % world_size if equal else 0
    if dropped and resumed is not None:
        logger.info(
            "Dataset %r: the %d rows left of epoch %d over %d ranks: %d per rank; %d row(s) "
            "left out so every rank runs the same number of steps.",
            name,
            rows,
            resumed,
            world_size,
            rows // world_size,
            dropped,
        )
    elif dropped:
        logger.info(
            "Dataset %r: %d rows over %d ranks: %d per rank; %d row(s) left out each epoch so "
            "every rank runs the same number of steps.",
            name,
            rows,
            world_size,
            rows // world_size,
            dropped,
        )
