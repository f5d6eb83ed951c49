"""Make a pandas DataFrame acceptable to ``lightgbm.Dataset``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["normalize_pandas_for_lightgbm"]


def normalize_pandas_for_lightgbm(df: pd.DataFrame) -> pd.DataFrame:
    """Arrow-backed numeric and boolean columns (``int64[pyarrow]``, which LightGBM rejects)
    become pandas' nullable NumPy dtypes (``Int64``, ``Float32``, ``boolean``); every other
    column is returned untouched, without a copy.

    Example::

        train = lightgbm.Dataset(normalize_pandas_for_lightgbm(shard.to_pandas()), label=y)
    """
    import pandas as pd
    import pyarrow as pa

    wanted = {}
    for column, dtype in df.dtypes.items():
        if not isinstance(dtype, pd.ArrowDtype):
            continue
        arrow = dtype.pyarrow_dtype
        if pa.types.is_boolean(arrow):
            wanted[column] = "boolean"
        elif pa.types.is_signed_integer(arrow):
            wanted[column] = f"Int{arrow.bit_width}"
        elif pa.types.is_unsigned_integer(arrow):
            wanted[column] = f"UInt{arrow.bit_width}"
        elif pa.types.is_floating(arrow):
            wanted[column] = f"Float{arrow.bit_width}"
    return df.astype(wanted, copy=False) if wanted else df
