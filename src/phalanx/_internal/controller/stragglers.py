"""Straggler detection: the rank the others wait for, named with its cause.

Each committed round is split per rank into data, compute, checkpoint and collective seconds
(``controller/anatomy.py``, from what the ranks report: no round trip of its own). A rank is
slow in an eligible round when its own time (the round minus its collective waits) is at least
SLOWDOWN x the median of the other ranks' (LOCKSTEP_SLOWDOWN where their collective waits bear
it out: in DDP every rank waits for the slowest in each all-reduce, so all report at one pace and
the slow one is the rank the others waited for), or when its round time itself is (ranks that do
not wait for each other), and MIN_EXCESS_S more. CONSECUTIVE slow eligible rounds in a row make
it a straggler: one WARNING naming it and its cause (``"data"``, ``"compute"``,
``"checkpoint"``, or ``"collective"`` where only its waits differ) with the seconds per step,
and a period that lasts until it is not slow for CONSECUTIVE eligible rounds in a row. Not
eligible, so never a false alarm: a rank's first round (compilation, data loading), a round
with a checkpoint and the round after it (a rank writing the checkpoint is slow for a good
reason), a round a rank did not report (it had returned). A uniform slowdown (every rank slow
together) keeps every ratio near 1.

The collective waits come from the step clocks of DDP models (``prepare_model``'s, or a user's
own DDP found at its first forward), or else from the training function's blocking
``torch.distributed`` calls, timed where it makes them (``torch/_anatomy.py``). A framework
whose collectives none of these see leaves ranks in lockstep looking alike; then only the hang
roll call names a rank that stops the others outright.

Example::

    detector = StragglerDetector(workers, attempt=1)
    for round_ in complete_rounds:
        for period in detector.observe(round_):
            logger.warning(describe(period))
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from typing import TypedDict

from phalanx._internal.controller.anatomy import (
    MIN_EXCESS_S,
    PARTS,
    SLOWDOWN,
    RankParts,
    RoundAnatomy,
    Slow,
    excess_line,
    others_median,
    slow_ranks,
)
from phalanx._internal.controller.rounds import Round
from phalanx._internal.engines.base import WorkerMetadata

__all__ = [
    "CONSECUTIVE",
    "MIN_EXCESS_S",
    "SLOWDOWN",
    "StragglerDetector",
    "StragglerWatch",
    "describe",
    "slow_ranks",
]

logger = logging.getLogger(__name__)

CONSECUTIVE = 5  # slow eligible rounds in a row to flag a rank (and fast ones to clear it)

CAUSE_HINTS = {
    "data": "its input pipeline: a slow disk or network from that host, too few DataLoader "
    "workers, costly map_batches work, an uneven data shard",
    "compute": "that node: a throttled or failing GPU, a noisy neighbour on its CPUs, or "
    "uneven work in its batches",
    "checkpoint": "its checkpoint writes: storage that is slow from that host",
    "collective": "its network link, or collectives that rank calls on its own",
}


class PeriodSummary(TypedDict):
    """A period's cause and seconds (per step, or per round when steps are not counted)."""

    slowdown: float  # the median ratio of the rank's round time to the others'
    cause: str
    excess_s: float  # the cause's seconds more than the other ranks'
    per: str  # "step" or "round"
    seconds: dict[str, float]  # each part: the rank's
    others_seconds: dict[str, float]  # each part: the median of the others'


class StragglerPeriod(PeriodSummary, total=False):
    """One period a rank was flagged (``Result.stragglers``' rows, run.json's). Read back from
    a run directory, a row of an older run may lack the summary's keys."""

    rank: int
    host: str
    node_id: str
    gpu_ids: list[int]
    first_round: int
    last_round: int
    started: float  # the rank's report times, seconds since 1970
    ended: float
    attempt: int


@dataclass
class _RankState:
    slow_run: int = 0  # slow eligible rounds in a row
    fast_run: int = 0  # not-slow eligible rounds in a row (ends an open period)
    ratios: list[float] = field(default_factory=list)  # of the current run / period
    first_round: int = 0  # of the current run of slow rounds
    started: float = 0.0  # the rank's report time in that round
    period: StragglerPeriod | None = None  # open period
    lockstep: int = 0  # slow rounds named by own time (vs round time)
    mine: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    theirs: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    steps: int = 0  # steps over the slow rounds (0 in any of them: per round)
    rounds: int = 0
    counted_steps: bool = True

    def reset(self) -> None:
        self.ratios = []
        self.lockstep = self.steps = self.rounds = 0
        self.counted_steps = True
        self.mine = dict.fromkeys(PARTS, 0.0)
        self.theirs = dict.fromkeys(PARTS, 0.0)

    def add(self, parts: list[RankParts], rank: int, slow: Slow) -> None:
        self.ratios.append(slow.ratio)
        self.lockstep += slow.lockstep
        self.rounds += 1
        self.steps += parts[rank].steps
        self.counted_steps = self.counted_steps and parts[rank].steps > 0
        for name in PARTS:
            values = [p.part(name) for p in parts]
            self.mine[name] += values[rank]
            self.theirs[name] += others_median(values, rank)

    def summary(self) -> PeriodSummary:
        """The period's cause and its seconds per step (or per round) of the rank and, as the
        median of theirs, of the other ranks."""
        per = self.steps if self.counted_steps and self.steps else self.rounds
        mine = {n: round(v / per, 6) for n, v in self.mine.items()}
        theirs = {n: round(v / per, 6) for n, v in self.theirs.items()}
        lockstep = self.lockstep * 2 >= self.rounds
        named = max(
            ("data", "compute", "checkpoint") if lockstep else PARTS,
            key=lambda n: mine[n] - theirs[n],
        )
        return {
            "slowdown": round(statistics.median(self.ratios), 2),
            "cause": named,
            "excess_s": round(mine[named] - theirs[named], 6),
            "per": "step" if self.counted_steps and self.steps else "round",
            "seconds": mine,
            "others_seconds": theirs,
        }


class StragglerDetector:
    """Fed every committed round of one attempt; returns the stragglers it newly flags.

    ``periods`` lists every period of this attempt (open ones with ``last_round`` so far),
    as plain data: rank, host, node_id, gpu_ids, slowdown (median ratio), cause, excess_s
    (the cause's seconds more than the other ranks', per step or per round as ``per`` says),
    seconds and others_seconds (each part per step: the rank's, the median of the others'),
    first/last round, started/ended (the rank's report times, seconds since 1970), attempt."""

    def __init__(self, workers: list[WorkerMetadata], attempt: int) -> None:
        self.workers = workers
        self.attempt = attempt
        self.periods: list[StragglerPeriod] = []
        self._states = [_RankState() for _ in workers]
        self._anatomy = RoundAnatomy()

    def observe(self, round_: Round) -> list[StragglerPeriod]:
        reports = round_.reports
        if len(reports) < 2 or len(reports) != len(self._states):
            return []
        parts = self._anatomy.parts(round_)
        if parts is None:
            return []
        slow = slow_ranks(parts)
        flagged = []
        for rank, state in enumerate(self._states):
            at = reports[rank].time  # type: ignore[union-attr]
            if self._update(rank, state, parts, slow.get(rank), round_.index, at):
                flagged.append(state.period)
        return [p for p in flagged if p is not None]

    def _update(
        self,
        rank: int,
        state: _RankState,
        parts: list[RankParts],
        slow: Slow | None,
        index: int,
        at: float,
    ) -> bool:
        """One eligible round of ``rank``; True when it just became a straggler."""
        if slow is None:
            state.slow_run, state.fast_run = 0, state.fast_run + 1
            if state.period is None:
                state.reset()
            elif state.fast_run >= CONSECUTIVE:
                state.period = None
                state.reset()
            return False
        if state.slow_run == 0 and state.period is None:
            state.first_round, state.started = index, at
        state.slow_run, state.fast_run = state.slow_run + 1, 0
        state.add(parts, rank, slow)
        if state.period is not None:
            state.period.update(state.summary())
            state.period["last_round"], state.period["ended"] = index, at
            return False
        if state.slow_run < CONSECUTIVE:
            return False
        worker = self.workers[rank]
        state.period = StragglerPeriod(
            rank=rank,
            host=worker.host,
            node_id=worker.node_id,
            gpu_ids=list(worker.gpu_ids),
            **state.summary(),
            first_round=state.first_round,
            last_round=index,
            started=state.started,
            ended=at,
            attempt=self.attempt,
        )
        self.periods.append(state.period)
        return True

    def straggling(self) -> dict[int, StragglerPeriod]:
        """``{rank: its open period}`` of the ranks flagged now (for the progress view)."""
        return {rank: state.period for rank, state in enumerate(self._states) if state.period}


class StragglerWatch:
    """The run's stragglers across its attempts: a detector per attempt (its group), every
    period in ``periods`` (for ``Result.stragglers`` and run.json). ``enabled=False``
    (``PHALANX_STRAGGLER_DETECTION=0``) watches nothing."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.periods: list[StragglerPeriod] = []
        self._detector: StragglerDetector | None = None

    def on_attempt(self, workers: list[WorkerMetadata], attempt: int) -> None:
        """A group started; ``workers`` in rank order."""
        self._detector = StragglerDetector(workers, attempt) if self.enabled else None

    def on_round(self, round_: Round) -> None:
        if self._detector is None:
            return
        for period in self._detector.observe(round_):
            self.periods.append(period)
            logger.warning(describe(period))

    def straggling(self) -> dict[int, StragglerPeriod]:
        return self._detector.straggling() if self._detector is not None else {}


def describe(period: StragglerPeriod) -> str:
    """The WARNING for a rank just flagged."""
    cause_name = period.get("cause", "compute")
    return (
        f"Straggler: {where(period)}: {excess_line(period)} than the other ranks for "
        f"{CONSECUTIVE} rounds in a row (rounds {period['first_round']}-{period['last_round']}; "
        f"{period['slowdown']:.2f}x their time). A slow rank slows every rank that waits for it "
        f"in a collective.\nHINT: check {CAUSE_HINTS.get(cause_name, 'that node')}; "
        "PHALANX_STRAGGLER_DETECTION=0 silences this check."
    )


def where(period: StragglerPeriod) -> str:
    """``rank 2 on host h3 (node n3, GPU 2)``."""
    gpus = period.get("gpu_ids") or []
    extra = f"node {period.get('node_id')}" + (f", GPU {', '.join(map(str, gpus))}" if gpus else "")
    return f"rank {period.get('rank')} on host {period.get('host')} ({extra})"
