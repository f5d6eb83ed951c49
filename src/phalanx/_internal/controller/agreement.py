"""The replica agreement check: a round whose replicas differ is not committed.

Ranks whose models ``prepare_model`` wrapped send, in the rounds to compare, a checksum of
their replicated parameters and their optimizer step count (``phalanx/torch/_replicas.py``).
Replicas must be bitwise equal; before a complete round commits, the ranks of each replica group
are compared. When some differ, the majority is taken as right and the others are named: the
attempt fails (kind ``"diverged"``), nothing of that round or a later one commits, and the failure
budget retries from the last committed checkpoint. Without a majority (two replicas) every
differing rank is named.

Example::

    agreement = ReplicaAgreement()
    agreement.on_attempt(workers)
    failures = agreement.check(round_)   # None: commit it; else the failure of the attempt
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

from phalanx._internal.controller.rounds import Round
from phalanx._internal.engines.base import WorkerMetadata
from phalanx.errors import WorkerFailure

__all__ = ["DIVERGED", "ReplicaAgreement", "compare"]

logger = logging.getLogger(__name__)

DIVERGED = "diverged"  # the WorkerFailure kind


def compare(
    values: dict[int, tuple[int, int]],
) -> tuple[list[int], tuple[int, int] | None]:
    """``{rank: (checksum, optimizer steps)}`` of one replica group -> the ranks that differ,
    and the majority's value (None when no value is held by more than half).

    >>> compare({0: (7, 3), 1: (7, 3), 2: (9, 3)})
    ([2], (7, 3))
    >>> compare({0: (7, 3), 1: (9, 3)})
    ([0, 1], None)
    """
    counts = Counter(values.values())
    if len(counts) <= 1:
        return [], None
    value, held = counts.most_common(1)[0]
    if held * 2 > len(values):
        return sorted(r for r, v in values.items() if v != value), value
    return sorted(values), None


class ReplicaAgreement:
    """Compares every complete round's checksums; refuses the first round whose replicas
    differ, and every later round of that attempt."""

    def __init__(self) -> None:
        self.workers: list[WorkerMetadata] = []
        self.refused_from: int | None = None
        self._noted_unchecked = False

    def on_attempt(self, workers: list[WorkerMetadata]) -> None:
        """A group started; ``workers`` in rank order."""
        self.workers = workers
        self.refused_from = None

    def check(self, round_: Round) -> dict[int, WorkerFailure] | None:
        """None when the round may commit; else the failures naming the differing ranks
        (``{}`` for a round after a refused one: the attempt is failing already)."""
        if self.refused_from is not None and round_.index >= self.refused_from:
            return {}
        groups: dict[str, dict[int, tuple[int, int]]] = {}
        for rank, report in enumerate(round_.reports):
            if report is not None and report.replica is not None:
                group, checksum, steps = report.replica
                groups.setdefault(group, {})[rank] = (int(checksum), int(steps))
        failures: dict[int, WorkerFailure] = {}
        for group, values in groups.items():
            differing, majority = compare(values)
            if differing:
                failures.update(self._failures(round_.index, group, values, differing, majority))
        if failures:
            self.refused_from = round_.index
            return failures
        self._note_unchecked(round_, groups)
        return None

    def _failures(
        self,
        index: int,
        group: str,
        values: dict[int, tuple[int, int]],
        differing: list[int],
        majority: tuple[int, int] | None,
    ) -> dict[int, WorkerFailure]:
        agreeing = sorted(set(values) - set(differing))
        named = ", ".join(self._where(r) for r in differing)
        if majority is not None:
            what = f"{named} differ{'s' if len(differing) == 1 else ''} from ranks " + ", ".join(
                map(str, agreeing)
            )
            detail = "; ".join(
                f"rank {r}: {_value(values[r])} vs {_value(majority)}" for r in differing
            )
        else:
            what = f"{named} differ and no majority tells which is right"
            detail = "; ".join(f"rank {r}: {_value(values[r])}" for r in differing)
        message = (
            f"replicas diverged in round {index}: {what} ({detail}). The replicated parameters "
            f"({group}) must be bitwise equal on every rank; nothing of this round is committed "
            "and the run goes back to its last committed checkpoint.\nHINT: a flipped bit, a "
            "failing GPU or a kernel that is not deterministic on one host; check the named "
            "host(s). replica_check=False in prepare_model (or PHALANX_REPLICA_CHECK=0) turns "
            "the check off."
        )
        failures = {}
        for rank in differing:
            worker = self.workers[rank] if rank < len(self.workers) else None
            failures[rank] = WorkerFailure(
                rank,
                DIVERGED,
                "ReplicasDiverged",
                message,
                pid=worker.pid if worker is not None else None,
                host=worker.host if worker is not None else "",
                time=time.time(),
            )
        return failures

    def _where(self, rank: int) -> str:
        host = self.workers[rank].host if rank < len(self.workers) else "?"
        return f"rank {rank} on host {host}"

    def _note_unchecked(self, round_: Round, groups: dict[str, dict[int, Any]]) -> None:
        """Once per run: a checkpoint round that only one replica hashed (rank 0 alone passed
        the checkpoint) was not compared; say how to compare."""
        if self._noted_unchecked or not round_.checkpoint_dir_names:
            return
        if not any(len(values) == 1 for values in groups.values()) or len(round_.reports) < 2:
            return
        self._noted_unchecked = True
        logger.info(
            "The checkpoint of round %d came from one replica only: the replicas were not "
            "compared (the other ranks do not know it is a checkpoint round).\nHINT: pass the "
            "checkpoint on every rank (phalanx.torch.save_state does), or prepare_model(..., "
            "replica_check=100) to compare every 100 rounds.",
            round_.index,
        )


def _value(value: tuple[int, int]) -> str:
    return f"checksum {value[0]:#018x}, {value[1]} optimizer steps"
