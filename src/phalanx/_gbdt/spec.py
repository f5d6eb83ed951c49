"""The blueprint of a ``datasets`` + ``label_column`` + ``params`` run, and what each worker
does with its shards before boosting starts."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from phalanx._gbdt.threads import cpu_share

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["TRAIN", "Frame", "GBDTSpec", "read_frames"]

logger = logging.getLogger(__name__)

TRAIN = "train"


@dataclass(frozen=True)
class GBDTSpec:
    """Everything the built-in training loop needs; pickled to every worker.

    ``num_boost_round`` is the target total: a run resumed from a checkpoint with ``k`` rounds
    boosts ``num_boost_round - k`` more. ``dataset_names``: ``"train"`` first, then the
    evaluation sets in the order given. ``dmatrix_params``: per dataset, keyword arguments for
    the library's data object, where a value naming a column (``{"weight": "w"}``) is that
    column (taken out of the features).
    """

    label_column: str
    params: dict[str, object]
    num_boost_round: int
    dataset_names: tuple[str, ...]
    dmatrix_params: dict[str, dict[str, object]] = field(default_factory=dict)
    # Keyword arguments for the library's train function (callbacks, obj, ...): the user's.
    train_kwargs: dict[str, Any] = field(default_factory=dict)

    checkpoint_frequency: int = 0
    checkpoint_at_end: bool = True
    cpus_per_worker: float | None = None

    def remaining_rounds(self, done: int) -> int:
        if done > self.num_boost_round:
            logger.warning(
                "The checkpoint to resume from has %d boosting rounds, more than "
                "num_boost_round=%d: no round is added.",
                done,
                self.num_boost_round,
            )
        return max(0, self.num_boost_round - done)

    def params_with_threads(self, names: tuple[str, ...]) -> dict[str, object]:
        """``params`` with this worker's share of the cores as the thread count, unless one of
        ``names`` (the library's thread parameter and its aliases) is set."""
        params = dict(self.params)
        if not any(name in params for name in names):
            import phalanx.session as session

            local = session.get_context().get_local_world_size()
            params[names[0]] = cpu_share(self.cpus_per_worker, local)
        return params


@dataclass
class Frame:
    """One dataset shard, ready for the library: features, label and the other columns."""

    features: pd.DataFrame
    label: pd.Series
    # Keyword arguments for the library's data object (DMatrix, Dataset): the user's values.
    kwargs: dict[str, Any]

    @property
    def num_rows(self) -> int:
        return len(self.features)


def read_frames(spec: GBDTSpec, column_keys: frozenset[str]) -> dict[str, Frame]:
    """This worker's shard of every dataset, read into memory (``phalanx.get_dataset_shard``)."""
    import phalanx.session as session

    frames = {}
    for name in spec.dataset_names:
        df = session.get_dataset_shard(name).to_pandas()
        frames[name] = split_frame(
            df, spec.label_column, spec.dmatrix_params.get(name, {}), column_keys
        )
    return frames


def split_frame(
    df: pd.DataFrame, label_column: str, kwargs: dict[str, object], column_keys: frozenset[str]
) -> Frame:
    """Take the label and the columns named in ``kwargs`` (for ``column_keys``) out of ``df``."""
    kwargs = dict(kwargs)
    taken = [label_column]
    for key in column_keys:
        value = kwargs.get(key)
        if isinstance(value, str) and value in df.columns:
            kwargs[key] = df[value].to_numpy()
            taken.append(value)
    return Frame(df.drop(columns=taken), df[label_column], kwargs)
