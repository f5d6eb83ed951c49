"""phalanx.data: datasets for training workers, sharded exactly and streamed.

Pass data to a trainer as ``datasets={"train": X}`` -- a pandas DataFrame, a pyarrow Table, a
dict of numpy arrays, a list of records, a path/URI of Parquet, CSV or JSON-lines files or
folders, a pyarrow dataset, a :class:`Dataset` built here, or a function returning one -- and
read this worker's shard in the training function::

    shard = phalanx.get_dataset_shard("train")
    for epoch in range(epochs):
        for batch in shard.iter_torch_batches(batch_size=256):
            ...

Split datasets (``DataConfig(datasets_to_split=...)``, all by default) are cut into disjoint
shards with the same number of rows on every rank (the ``rows % world_size`` left over are
left out, as Ray's ``streaming_split(equal=True)`` does). Files are read by each worker itself:
only its own Parquet row groups or files.
"""

from __future__ import annotations

from phalanx._foundation.optional import missing as _missing_extra

if _missing := _missing_extra("phalanx.data", "numpy", "pyarrow", "pandas"):
    raise _missing

from phalanx._foundation.execution_options import ExecutionOptions, ExecutionResources
from phalanx.data._dataset import (
    Dataset,
    from_arrow,
    from_items,
    from_numpy,
    from_pandas,
)
from phalanx.data._ingest import as_dataset
from phalanx.data._iterator import DataIterator
from phalanx.data._mix import MixStoppingCondition
from phalanx.data._read import read_csv, read_json, read_parquet

__all__ = [
    "DataIterator",
    "Dataset",
    "ExecutionOptions",
    "ExecutionResources",
    "MixStoppingCondition",
    "as_dataset",
    "from_arrow",
    "from_items",
    "from_numpy",
    "from_pandas",
    "read_csv",
    "read_json",
    "read_parquet",
]
