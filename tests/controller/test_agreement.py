"""The driver's comparison of replica checksums: the minority is named with its host, a round
without a majority names every rank, later rounds of a refused attempt never commit."""

from __future__ import annotations

from phalanx._internal.controller.agreement import DIVERGED, ReplicaAgreement, compare
from phalanx._internal.controller.rounds import Report, Round
from phalanx._internal.engines.base import WorkerMetadata


def round_(index, sums, steps=4):
    reports = [
        Report(index, {}, None, 1.0, replica=None if s is None else ("ddp", s, steps)) for s in sums
    ]
    return Round(index, reports)


def agreement(n):
    check = ReplicaAgreement()
    check.on_attempt([WorkerMetadata(f"h{r}", f"n{r}", 100 + r, ()) for r in range(n)])
    return check


def test_agreeing_replicas_and_rounds_not_compared_commit():
    check = agreement(3)
    assert check.check(round_(0, [None, None, None])) is None
    assert check.check(round_(1, [7, 7, 7])) is None


def test_the_minority_is_named_with_its_host_and_later_rounds_are_refused():
    check = agreement(3)
    failures = check.check(round_(5, [7, 9, 7]))
    assert failures is not None and list(failures) == [1]
    failure = failures[1]
    assert failure.kind == DIVERGED and failure.host == "h1"
    assert "replicas diverged in round 5: rank 1 on host h1 differs from ranks 0, 2" in (
        failure.message
    )
    assert "PHALANX_REPLICA_CHECK=0" in failure.message
    assert check.check(round_(6, [None, None, None])) == {}  # the attempt is failing already
    check.on_attempt(check.workers)  # the retry compares afresh
    assert check.check(round_(6, [7, 7, 7])) is None


def test_a_skipped_optimizer_step_differs_too_and_two_replicas_have_no_majority():
    assert compare({0: (7, 4), 1: (7, 3), 2: (7, 4)}) == ([1], (7, 4))
    check = agreement(2)
    failures = check.check(round_(3, [7, 9]))
    assert failures is not None and sorted(failures) == [0, 1]
    assert "no majority tells which is right" in failures[0].message
