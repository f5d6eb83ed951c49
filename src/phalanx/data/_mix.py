"""``Dataset.mix``: rows of several datasets in weighted proportion, the ratio held in every
global batch, and resumable exactly.

A mixed dataset is split as its sources are: each rank gets its own shard of every source (the
sources' ``_split``, with their file shuffle), so every row belongs to one rank. A pass (one
epoch) over a rank's mixed shard reads each source's shard in order and takes from it as many
rows per batch as the pass's plan (``_mix_plan.PassPlan``, the same arithmetic on every rank)
gives it. Each source's shard keeps its own position (rows of it given out), so a checkpoint
holds one ordinary data-position record per source (``combine``) and a resume, at any world
size, continues every source where it stood (``resume_split``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from phalanx.data._mix_iter import MixedIterator, combine
from phalanx.data._mix_plan import MixRule
from phalanx.data._plan import Start, as_ranges

if TYPE_CHECKING:
    from phalanx.data._dataset import Dataset

__all__ = [
    "MixStoppingCondition",
    "MixedIterator",
    "combine",
    "make_rule",
    "resume_split",
    "split_mixed",
]


class MixStoppingCondition(enum.Enum):
    """When an epoch of a mixed dataset ends (Ray Data's names).

    ``STOP_ON_SHORTEST``: when the shortest source (for its weight) runs out; the rest of the
    other sources is left out of that epoch. ``STOP_ON_LONGEST_DROP`` (the default): when every
    source has run out; a source that runs out drops out and the batches after it are drawn from
    the others, by their weights.

    Example::

        mixed = web.mix(code, weights=[0.7, 0.3],
                        stopping_condition=MixStoppingCondition.STOP_ON_SHORTEST)
    """

    STOP_ON_SHORTEST = "stop_on_shortest"
    STOP_ON_LONGEST_DROP = "stop_on_longest_drop"


def make_rule(count: int, weights: Sequence[float] | None, stopping_condition: Any) -> MixRule:
    """The weights checked and normalized, and the stopping condition (also by its value)."""
    if weights is None:
        weights = [1.0] * count
    weights = list(weights)
    if len(weights) != count:
        raise ValueError(
            f"Number of datasets ({count}) must match number of weights ({len(weights)}).\n"
            "HINT: give one weight per dataset, this one first: ds.mix(b, c, "
            "weights=[0.5, 0.3, 0.2])."
        )
    bad = [w for w in weights if not isinstance(w, int | float) or not w > 0 or w != w]
    if bad:
        raise ValueError(
            f"mix: weights={weights!r} holds {bad!r}; every weight must be a number > 0.\n"
            "HINT: leave a dataset out of the mix rather than giving it weight 0."
        )
    try:
        condition = MixStoppingCondition(getattr(stopping_condition, "value", stopping_condition))
    except ValueError:
        raise ValueError(
            f"mix: stopping_condition={stopping_condition!r} is invalid.\nHINT: use "
            "phalanx.data.MixStoppingCondition.STOP_ON_SHORTEST or .STOP_ON_LONGEST_DROP."
        ) from None
    total = float(sum(weights))
    return MixRule(
        tuple(float(w) / total for w in weights),
        condition is MixStoppingCondition.STOP_ON_SHORTEST,
    )


def split_mixed(
    parts: Sequence[Dataset],
    rule: MixRule,
    n: int,
    equal: bool,
    starts: Sequence[tuple[Start | None, int | None]] | None = None,
    split: bool = True,
) -> list[MixedIterator]:
    """``n`` mixed shards: rank ``r``'s shard of every source, mixed by ``rule``."""
    starts = starts or [(None, None)] * len(parts)
    per_part = [
        part._split(n, equal, start=start, seed=seed, split=split)
        for part, (start, seed) in zip(parts, starts)
    ]
    return [
        MixedIterator([its[r] for its in per_part], rule, rank=r, world_size=n, equal=equal)
        for r in range(n)
    ]


def resume_split(
    parts: Sequence[Dataset],
    rule: MixRule,
    n: int,
    equal: bool,
    record: dict[str, Any],
    name: str,
) -> list[MixedIterator]:
    """The mixed shards of an attempt resumed from ``record`` (``combine``'s): each source from
    its own record. A record that is not a mixed one of as many sources: its epoch starts over."""
    from phalanx.data._position import resume_start

    records = record.get("mix")
    if not isinstance(records, list) or len(records) != len(parts):
        import logging

        logging.getLogger(__name__).warning(
            "Dataset %r: the data position stored with the checkpoint is not that of a mix of "
            "%d datasets, so the epoch starts over.\nHINT: resume with the same mix of the "
            "same data to continue the epoch exactly.",
            name,
            len(parts),
        )
        return split_mixed(parts, rule, n, equal)
    starts = []
    for i, (part, rec) in enumerate(zip(parts, records)):
        own_seed = part._seed if part._shuffle_files else None
        starts.append(resume_start(rec, f"{name}[{i}]", part.source, own_seed))
    # a source used up in the epoch's passes has a record of the next epoch: it keeps the
    # others' epoch, with nothing left of it
    epoch = min(s.epoch for s, _ in starts)
    fixed: list[tuple[Start | None, int | None]] = []
    for start, seed in starts:
        if start.epoch > epoch:
            start = Start(epoch, (as_ranges([]), *start.partial))
        fixed.append((start, seed))
    return split_mixed(parts, rule, n, equal, fixed)
