"""Straggler detection, round by round: which rank a user is told is slow, and when never.

Each row is every rank's round times; the detector sees the rounds as the controller commits
them (report times on each rank's clock), so the rows take no time.
"""

from __future__ import annotations

import logging

import pytest

from phalanx._internal.controller.anatomy import RankParts, cause
from phalanx._internal.controller.rounds import Report, Round
from phalanx._internal.controller.stragglers import (
    CONSECUTIVE,
    StragglerDetector,
    StragglerWatch,
    slow_ranks,
)
from phalanx._internal.engines.base import WorkerMetadata


def workers(n: int) -> list[WorkerMetadata]:
    return [WorkerMetadata(f"host{r}", f"node{r}", 100 + r, (r,)) for r in range(n)]


def rounds(durations: list[list[float]], checkpoints: set[int] = frozenset()) -> list[Round]:
    """Rounds whose k-th took ``durations[k][rank]`` on each rank (round 0 is the first)."""
    clocks = [1000.0 * (r + 1) for r in range(len(durations[0]))]  # clocks never compared
    out = []
    for index, row in enumerate(durations):
        clocks = [c + d for c, d in zip(clocks, row, strict=True)]
        name = f"checkpoint_{index:06d}" if index in checkpoints else None
        out.append(Round(index, [Report(index, {}, name, t) for t in clocks]))
    return out


def flagged(durations: list[list[float]], checkpoints: set[int] = frozenset()) -> list[tuple]:
    detector = StragglerDetector(workers(len(durations[0])), attempt=1)
    found = []
    for round_ in rounds(durations, checkpoints):
        found += [(p["rank"], round_.index) for p in detector.observe(round_)]
    return found


STEADY = [0.1, 0.1, 0.1, 0.1]
SLOW_2 = [0.1, 0.1, 0.15, 0.1]  # rank 2 sleeps an extra 50 % per step

# (why, rounds, rounds with a checkpoint, (rank, round it is flagged in))
ROWS = [
    ("steady ranks: nobody", [STEADY] * 30, set(), []),
    ("an extra 50 % on one rank, flagged once", [SLOW_2] * 30, set(), [(2, CONSECUTIVE)]),
    ("a uniform slowdown: nobody", [STEADY] * 10 + [[0.3] * 4] * 20, set(), []),
    ("a slow first round: nobody", [[0.1, 9.0, 0.1, 0.1]] + [STEADY] * 20, set(), []),
    ("one slow round: nobody", [STEADY] * 5 + [SLOW_2] + [STEADY] * 10, set(), []),
    ("four slow rounds in a row: not yet", [STEADY] * 3 + [SLOW_2] * 4 + [STEADY] * 9, set(), []),
    (
        "rank 0 writing a checkpoint every other round: nobody",
        [[0.4, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.1]] * 10,
        set(range(0, 20, 2)),
        [],
    ),
    (
        "slow rounds around checkpoints still count",
        [SLOW_2] * 20,
        {3, 9},
        [(2, 7)],  # rounds 1, 2, (3, 4 not eligible), 5, 6, 7 are its first five
    ),
    ("two ranks, one 1.5x slower", [[0.1, 0.15]] * 12, set(), [(1, CONSECUTIVE)]),
    ("sub-10 ms rounds jitter: nobody", [[0.001, 0.0015]] * 30, set(), []),
    (
        "fast again, then slow again: a second period",
        [SLOW_2] * 8 + [STEADY] * CONSECUTIVE + [SLOW_2] * 8,
        set(),
        [(2, CONSECUTIVE), (2, 8 + CONSECUTIVE + CONSECUTIVE - 1)],
    ),
]


@pytest.mark.parametrize(
    ("durations", "checkpoints", "expected"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_which_rank_is_a_straggler(durations, checkpoints, expected):
    assert flagged(durations, checkpoints) == expected


def parts(intervals: list[float]) -> list[RankParts]:
    """Ranks that do not wait for each other: the round is all compute."""
    return [RankParts(t, 0.0, t, 0.0, 0.0, 1) for t in intervals]


def test_slowdown_is_against_the_median_of_the_others():
    [(rank, slow)] = slow_ranks(parts([0.1, 0.1, 0.1, 0.2])).items()
    assert rank == 3 and slow.ratio == pytest.approx(2.0) and slow.excess_s == pytest.approx(0.1)
    assert slow_ranks(parts([0.1, 0.12, 0.1, 0.11])) == {}


def test_in_lockstep_the_rank_the_others_waited_for_is_slow_by_its_own_time():
    # every round takes 0.1 s on every rank; rank 1 spent 0.03 s more on data, which the others
    # spent waiting in the all-reduce
    lockstep = [RankParts(0.1, 0.0, 0.07, 0.0, 0.03, 1) for _ in range(4)]
    lockstep[1] = RankParts(0.1, 0.03, 0.07, 0.0, 0.0, 1)
    [(rank, slow)] = slow_ranks(lockstep).items()
    assert rank == 1 and slow.lockstep and slow.excess_s == pytest.approx(0.03)
    assert cause(lockstep, 1, slow.lockstep) == "data"


def test_a_period_names_where_the_rank_runs_and_how_long_it_lasted():
    detector = StragglerDetector(workers(4), attempt=3)
    for round_ in rounds([SLOW_2] * 9 + [STEADY] * 6):
        detector.observe(round_)
    [period] = detector.periods
    assert period["rank"] == 2 and period["attempt"] == 3
    assert (period["host"], period["node_id"], period["gpu_ids"]) == ("host2", "node2", [2])
    assert period["slowdown"] == pytest.approx(1.5)
    assert (period["first_round"], period["last_round"]) == (1, 8)
    assert period["ended"] - period["started"] == pytest.approx(7 * 0.15)
    assert detector.straggling() == {}  # fast for CONSECUTIVE rounds: the period is over


def test_one_warning_per_period_and_none_when_silenced(caplog):
    caplog.set_level(logging.WARNING)
    watch = StragglerWatch(enabled=True)
    watch.on_attempt(workers(4), attempt=1)
    for round_ in rounds([SLOW_2] * 20):
        watch.on_round(round_)
    [warning] = [r.getMessage() for r in caplog.records if "Straggler" in r.getMessage()]
    assert warning.startswith("Straggler: rank 2 on host host2 (node node2, GPU 2): compute 50 ms")
    assert "(rounds 1-5; 1.50x their time)" in warning
    assert "PHALANX_STRAGGLER_DETECTION=0" in warning
    [(rank, period)] = watch.straggling().items()
    assert rank == 2 and period["cause"] == "compute" and period["slowdown"] == 1.5

    caplog.clear()
    silenced = StragglerWatch(enabled=False)
    silenced.on_attempt(workers(4), attempt=1)
    for round_ in rounds([SLOW_2] * 20):
        silenced.on_round(round_)
    assert silenced.periods == [] and not caplog.records


def test_the_controller_names_the_straggler_in_the_view_and_the_result(tmp_path):
    """The wiring: a fit()'s committed rounds reach the detector; the progress view marks the
    rank while it straggles; the Result lists the period with the worker's host and node."""
    from controller_stepper import Stepper

    from phalanx._internal.controller.state import State
    from phalanx._internal.engines import messages

    stepper = Stepper(tmp_path, num_workers=3)
    assert stepper.step() is State.RUNNING
    clocks = [100.0, 200.0, 300.0]
    for index in range(10):
        for rank, worker in enumerate(stepper.workers):
            clocks[rank] += 0.15 if rank == 1 else 0.1
            worker.events.put((worker.index, messages.Report(index, {}, None, clocks[rank])))
        assert stepper.step() is State.RUNNING
    assert "straggler: rank 1 1.50x" in stepper.controller.watcher.status_line()
    for worker in stepper.workers:
        worker.finish()
    assert stepper.step() is State.FINISHED
    [period] = stepper.end().stragglers
    assert (period["rank"], period["host"], period["node_id"]) == (1, "fake-host", "fake-node")
    assert (period["first_round"], period["last_round"]) == (1, 9)
