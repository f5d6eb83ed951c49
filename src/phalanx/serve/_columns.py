"""Which input columns a served model takes, as far as the model and its preprocessor say.

``model_columns``: the booster's own feature names when raw input reaches it (no preprocessor);
the server requires them in every request. ``input_columns``: what ``GET /metadata`` lists: the
booster's feature names, with those the preprocessor makes replaced by those it reads (a torch
model names none: then the preprocessor's alone). None where neither knows.
"""

from __future__ import annotations

import re

from phalanx.predict import Predictor

__all__ = ["input_columns", "model_columns"]

GENERATED_NAME = re.compile(r"f\d+|Column_\d+")  # xgboost's and lightgbm's names for a matrix


def model_columns(predictor: Predictor) -> list[str] | None:
    """The booster's feature names when raw input goes to it (no preprocessor), else None."""
    if predictor.get_preprocessor() is not None:
        return None
    return _feature_names(predictor)


def input_columns(predictor: Predictor) -> list[str] | None:
    """The raw columns a request should carry (see the module's docstring)."""
    names = _feature_names(predictor)
    preprocessor = predictor.get_preprocessor()
    if preprocessor is None:
        return names
    seen = _preprocessor_columns(preprocessor)
    if seen is None:
        return names  # a stage that does not name its columns: the model's names, if any
    reads, makes = seen
    return list(dict.fromkeys([*reads, *(n for n in names or [] if n not in makes)]))


def _feature_names(predictor: Predictor) -> list[str] | None:
    model = getattr(predictor, "model", None)
    names = getattr(model, "feature_names", None)  # xgboost
    feature_name = getattr(model, "feature_name", None)  # lightgbm
    if names is None and feature_name is not None:
        names = feature_name()
    if not names or all(GENERATED_NAME.fullmatch(str(n)) for n in names):
        return None  # generated names: the model was trained on a bare matrix
    return [str(n) for n in names]


def _preprocessor_columns(preprocessor: object) -> tuple[list[str], set[str]] | None:
    """(raw columns the stages read, columns they make), or None if a stage does not say."""
    reads: list[str] = []
    makes: set[str] = set()
    for stage in getattr(preprocessor, "preprocessors", None) or [preprocessor]:
        columns = getattr(stage, "columns", None)
        if columns is None:
            label = getattr(stage, "label_column", None)  # LabelEncoder: not a request column
            if label is None:
                return None
            makes.add(getattr(stage, "output_column", None) or label)
            continue
        reads += [c for c in columns if c not in makes]
        made = getattr(stage, "output_columns", None) or [getattr(stage, "output_column_name", "")]
        makes.update(str(c) for c in made if c)
    return reads, makes
