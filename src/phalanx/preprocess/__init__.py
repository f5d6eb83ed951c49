"""phalanx.preprocess: Ray's ``ray.data.preprocessors``, fitted by streaming over batches.

Fit on a dataset (anything ``datasets=`` accepts), then transform batches::

    from phalanx.preprocess import Chain, Concatenator, StandardScaler

    prep = Chain(StandardScaler(["a", "b"]), Concatenator(["a", "b"], output_column_name="x"))
    prep.fit(train_df)
    batch = prep.transform_batch(df)  # pandas in, pandas out; dict of numpy in, dict out

A trainer's ``preprocessor=`` fits it on the train dataset and saves it in every checkpoint;
predictors apply it to raw input.
"""

from __future__ import annotations

from phalanx._foundation.optional import missing as _missing_extra

if _missing := _missing_extra("phalanx.preprocess", "numpy", "pyarrow", "pandas"):
    raise _missing

from phalanx._foundation.module_aliases import keep_old_module_paths as _keep_old_paths
from phalanx.preprocess._base import FitStatus, Preprocessor, PreprocessorNotFittedError
from phalanx.preprocess._concat import Chain, Concatenator
from phalanx.preprocess._encoders import LabelEncoder, OneHotEncoder, OrdinalEncoder
from phalanx.preprocess._imputer import SimpleImputer
from phalanx.preprocess._mapper import BatchMapper
from phalanx.preprocess._scalers import MinMaxScaler, StandardScaler

PreprocessorNotFittedException = PreprocessorNotFittedError  # Ray's name

# Checkpoints written before the modules were renamed pickle preprocessors by these paths.
_keep_old_paths(__name__, ["base", "concat", "encoders", "imputer", "mapper", "scalers"])

__all__ = [
    "BatchMapper",
    "Chain",
    "Concatenator",
    "FitStatus",
    "LabelEncoder",
    "MinMaxScaler",
    "OneHotEncoder",
    "OrdinalEncoder",
    "Preprocessor",
    "PreprocessorNotFittedError",
    "PreprocessorNotFittedException",
    "SimpleImputer",
    "StandardScaler",
]
