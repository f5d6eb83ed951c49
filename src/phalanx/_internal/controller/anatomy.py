"""One round's step anatomy per rank, and which rank the others waited for.

Each rank's round time (between its previous report and this one, on its own clock) splits
into what it reported: seconds waiting for data, checkpointing and waiting in collectives
(``worker/step_anatomy.py``), and the rest, its **compute** (forward, backward, optimizer,
the loop's own code). Its **own time** is the round minus the collective waits.

In lockstep training (DDP: every rank waits for the slowest in each all-reduce) every rank's
round takes the same time, and the slow rank is the one whose own time is longer: the others
spend the difference waiting for it in the collective. Ranks that do not wait for each other
show it in the round time itself. ``slow_ranks`` applies both readings; ``cause`` names the
part whose excess over the other ranks is largest.

>>> parts = [RankParts(0.10, 0.0, 0.01, 0.0, 0.09, 1)] * 3 + [RankParts(0.10, 0.09, 0.01, 0.0, 0.0, 1)]
>>> slow = slow_ranks(parts)
>>> list(slow), cause(parts, 3, lockstep=slow[3].lockstep)
([3], 'data')
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from phalanx._internal.controller.rounds import Round

if TYPE_CHECKING:
    from phalanx._internal.controller.stragglers import StragglerPeriod

__all__ = [
    "MIN_EXCESS_S",
    "OWN_PARTS",
    "PARTS",
    "SLOWDOWN",
    "RankParts",
    "RoundAnatomy",
    "Slow",
    "cause",
    "excess_line",
    "others_median",
    "round_parts",
    "short",
    "slow_ranks",
]

PARTS = ("data", "compute", "checkpoint", "collective")
OWN_PARTS = ("data", "compute", "checkpoint")  # a rank's own time; collective: waiting for others

CAUSE_WORDS = {
    "data": "data loading",
    "compute": "compute",
    "checkpoint": "checkpointing",
    "collective": "waiting in collectives",
}

SLOWDOWN = 1.3  # a round (or own) time >= this x the median of the other ranks' is slow
LOCKSTEP_SLOWDOWN = 1.1  # ... or this, where the others' collective waits bear it out
MIN_EXCESS_S = 0.01  # and at least this much longer: sub-millisecond rounds jitter by 30 %


@dataclass(frozen=True, slots=True)
class RankParts:
    """One rank's round: its length and where it went (seconds), and the steps it took
    (0: not counted, no model prepared by ``prepare_model``)."""

    interval: float
    data: float
    compute: float
    checkpoint: float
    collective: float
    steps: int

    @property
    def own(self) -> float:
        """The rank's own time: the round minus its waits for the other ranks."""
        return self.data + self.compute + self.checkpoint

    def part(self, name: str) -> float:
        return float(getattr(self, name))


@dataclass(frozen=True, slots=True)
class Slow:
    ratio: float  # own (lockstep) or round time / the median of the other ranks'
    excess_s: float  # and how much longer, in seconds
    lockstep: bool  # named by its own time (the others waited for it in collectives)


def round_parts(
    intervals: list[float],
    data: list[float],
    checkpoint: list[float],
    collective: list[float],
    steps: list[int],
) -> list[RankParts]:
    """Each rank's parts; its compute is what its waits leave of the round (never negative:
    a wait measured across two reports can exceed one round)."""
    out = []
    for took, d, c, w, n in zip(intervals, data, checkpoint, collective, steps, strict=True):
        took = max(took, 0.0)
        waits = min(d + c + w, took) if took else 0.0
        scale = waits / (d + c + w) if d + c + w > 0 else 1.0
        out.append(RankParts(took, d * scale, took - waits, c * scale, w * scale, n))
    return out


def others_median(values: list[float], rank: int) -> float:
    return statistics.median(values[:rank] + values[rank + 1 :])


def slow_ranks(parts: list[RankParts]) -> dict[int, Slow]:
    """The slow ranks of a round: by their own time (lockstep), else by their round time."""
    own = [p.own for p in parts]
    waits = [p.collective for p in parts]
    rounds = [p.interval for p in parts]
    slow = {}
    for rank in range(len(parts)):
        others = others_median(own, rank)
        excess = own[rank] - others
        waited_for = others_median(waits, rank) - waits[rank]  # the others' extra wait
        threshold = LOCKSTEP_SLOWDOWN if waited_for >= excess / 2 else SLOWDOWN
        if excess >= MIN_EXCESS_S and own[rank] >= threshold * others:
            slow[rank] = Slow(_ratio(own[rank], others), excess, True)
            continue
        others = others_median(rounds, rank)
        excess = rounds[rank] - others
        if excess >= MIN_EXCESS_S and rounds[rank] >= SLOWDOWN * others:
            slow[rank] = Slow(_ratio(rounds[rank], others), excess, False)
    return slow


def _ratio(took: float, others: float) -> float:
    return took / others if others > 0 else float("inf")


def cause(parts: list[RankParts], rank: int, lockstep: bool) -> str:
    """The part in which ``rank`` exceeds the other ranks most (its collective waits count
    only where it was not named by its own time: "collective" means only waits differ)."""
    names = OWN_PARTS if lockstep else PARTS
    return max(names, key=lambda name: excess(parts, rank, name))


def excess(parts: list[RankParts], rank: int, name: str) -> float:
    values = [p.part(name) for p in parts]
    return values[rank] - others_median(values, rank)


class RoundAnatomy:
    """Turns committed rounds into every rank's parts (``None`` for a round that is not
    eligible); one per attempt. Shared by the detector and the goodput clock's rule."""

    def __init__(self, skip_checkpoints: bool = True) -> None:
        self._previous: list[float] | None = None  # each rank's last report time
        self._after_checkpoint = False
        # False (the goodput's reading): checkpoint rounds too, their checkpoint time set
        # apart (the goodput counts it in its own part)
        self._skip_checkpoints = skip_checkpoints

    def parts(self, round_: Round) -> list[RankParts] | None:
        reports = round_.reports
        if any(r is None for r in reports):  # a rank had returned: the group is winding down
            self._previous = None
            return None
        times = [r.time for r in reports if r is not None]
        previous, self._previous = self._previous, times
        checkpointed = any(r.checkpoint_dir_name for r in reports if r is not None)
        after_checkpoint, self._after_checkpoint = self._after_checkpoint, checkpointed
        if previous is None or len(previous) != len(times):
            return None
        if self._skip_checkpoints and (checkpointed or after_checkpoint):
            return None
        done = [r for r in reports if r is not None]
        intervals = [now - before for now, before in zip(times, previous, strict=True)]
        checkpoint = [r.checkpoint_s for r in done]
        if not self._skip_checkpoints:  # set apart: the round without its checkpoint time
            intervals = [max(0.0, t - c) for t, c in zip(intervals, checkpoint, strict=True)]
            checkpoint = [0.0] * len(done)
        return round_parts(
            intervals,
            [r.data_wait_s for r in done],
            checkpoint,
            [r.collective_s for r in done],
            [r.steps for r in done],
        )


def excess_line(period: Mapping[str, object]) -> str:
    """``data loading 41 ms per step more`` (``period``: a StragglerPeriod, or one read back)."""
    words = CAUSE_WORDS.get(str(period.get("cause")), str(period.get("cause")))
    excess = _seconds(period.get("excess_s"))
    return f"{words} {excess * 1000:.0f} ms per {period.get('per', 'round')} more"


def short(period: StragglerPeriod) -> str:
    """The progress view's few words: ``data +41 ms/step``."""
    excess = _seconds(period.get("excess_s"))
    return f"{period.get('cause')} +{excess * 1000:.0f} ms/{period.get('per', 'round')}"


def _seconds(value: object) -> float:
    return float(value) if isinstance(value, int | float | str) and value else 0.0
