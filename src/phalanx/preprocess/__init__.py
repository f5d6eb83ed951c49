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

from phalanx.preprocess.base import FitStatus, Preprocessor, PreprocessorNotFittedError
from phalanx.preprocess.concat import Chain, Concatenator
from phalanx.preprocess.encoders import LabelEncoder, OneHotEncoder, OrdinalEncoder
from phalanx.preprocess.imputer import SimpleImputer
from phalanx.preprocess.mapper import BatchMapper
from phalanx.preprocess.scalers import MinMaxScaler, StandardScaler

PreprocessorNotFittedException = PreprocessorNotFittedError  # Ray's name

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
