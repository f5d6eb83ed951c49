"""The goodput arithmetic on scripted events and a scripted clock: which part each second lands
in, and that the parts always add up to the wall time."""

from __future__ import annotations

import pytest

from phalanx._foundation.goodput_parts import PARTS, Goodput
from phalanx._internal.controller.goodput import GoodputClock
from phalanx._internal.controller.rounds import Report, Round


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def round_(index: int, times: list[float], ckpt_s: float = 0.0, data_s: float = 0.0) -> Round:
    reports: list[Report | None] = [
        Report(index, {}, None, t, None, ckpt_s if rank == 0 else 0.0, data_s)
        for rank, t in enumerate(times)
    ]
    return Round(index, reports)


def started(goodput: GoodputClock, clock: Clock, ranks: int, at: float) -> None:
    goodput.attempt_started(ranks)
    goodput.training_sent()
    for rank in range(ranks):
        goodput.report(rank, at, started=at)


def test_a_clean_run_is_start_up_then_productive_then_other():
    clock = Clock()
    goodput = GoodputClock(clock)
    clock.t = 1002.0
    started(goodput, clock, 2, at=1002.0)
    for i in range(4):
        clock.t = 1003.0 + i
        goodput.round_committed(round_(i, [clock.t, clock.t]), None)
    clock.t = 1010.0
    goodput.attempt_ended("finished")
    clock.t = 1010.5
    result = goodput.finish()
    assert result.wall_s == 10.5
    assert result.seconds == {
        "productive": 8.0,
        "startup": 2.0,
        "checkpoints": 0.0,
        "data": 0.0,
        "stragglers": 0.0,
        "failures": 0.0,
        "other": 0.5,
    }
    assert result.attempts == (result.seconds,)


def test_waits_come_out_of_training_and_a_straggler_counts_its_excess_once():
    clock = Clock()
    goodput = GoodputClock(clock)
    started(goodput, clock, 2, at=1000.0)
    # round 0 (a first round: not eligible): rank 0 spent 0.25 s saving a checkpoint, each
    # rank waited 0.5 s for data
    clock.t = 1002.0
    goodput.round_committed(round_(0, [1001.0, 1001.0], ckpt_s=0.25, data_s=0.5), 0.01)
    # round 1 follows a checkpoint (not eligible); rounds 2, 3: in lockstep (1 s each), rank 1
    # waited 0.5 s more for data and rank 0 that long in the all-reduce
    goodput.round_committed(round_(1, [1002.0, 1002.0]), None)
    for index in (2, 3):
        at = 1001.0 + index
        reports: list[Report | None] = [
            Report(index, {}, None, at, None, 0.0, 0.0, None, 0.5, 1),
            Report(index, {}, None, at, None, 0.0, 0.5, None, 0.0, 1),
        ]
        goodput.round_committed(Round(index, reports), None)
    clock.t = 1010.0
    goodput.attempt_ended("finished")
    parts = goodput.finish().seconds
    # the straggler's extra data wait is the others' wait for it: in stragglers, not twice
    assert parts["stragglers"] == pytest.approx(1.0)
    assert parts["checkpoints"] == 0.25 and parts["data"] == 0.5
    assert parts["productive"] == pytest.approx(10.0 - 1.0 - 0.25 - 0.5)
    assert goodput.counts.commits == 1
    assert goodput.counts.step_parts[1]["data"] == pytest.approx(0.5)


def test_a_failure_loses_the_work_since_the_last_checkpoint_and_the_restart():
    clock = Clock()
    goodput = GoodputClock(clock)
    started(goodput, clock, 1, at=1001.0)
    clock.t = 1003.0
    goodput.round_committed(round_(0, [1003.0], data_s=0.5), 0.1)  # checkpoint at 1003
    clock.t = 1005.0
    goodput.round_committed(round_(1, [1005.0], data_s=0.5), None)  # rolled back
    clock.t = 1006.0
    goodput.attempt_ended("failed")
    clock.t = 1007.0  # the wait before the retry, then the restart
    started(goodput, clock, 1, at=1008.0)
    clock.t = 1010.0
    goodput.attempt_ended("finished")
    result = goodput.finish()
    first, second = result.attempts
    assert first["startup"] == 1.0
    assert first["productive"] == pytest.approx(1.5) and first["data"] == 0.5  # 1001..1003
    assert first["failures"] == pytest.approx(3.0)  # 1003..1006: round 1 is redone
    assert second["failures"] == pytest.approx(2.0)  # 1006..1008: the restart
    assert second["startup"] == 0.0 and second["productive"] == pytest.approx(2.0)
    assert sum(result.seconds.values()) == pytest.approx(result.wall_s)
    assert goodput.failures == 1


def test_a_rank_that_never_reports_counts_from_when_training_was_sent():
    clock = Clock()
    goodput = GoodputClock(clock)
    goodput.attempt_started(2)
    clock.t = 1001.0
    goodput.training_sent()
    goodput.report(0, 1001.5, started=1001.2)  # rank 1 dies before its first report
    clock.t = 1002.0
    goodput.attempt_ended("failed")
    parts = goodput.finish().seconds
    assert parts["startup"] == pytest.approx(1.2)
    assert parts["failures"] == pytest.approx(0.8)


def test_waits_longer_than_their_span_are_scaled_to_it():
    clock = Clock()
    goodput = GoodputClock(clock)
    started(goodput, clock, 1, at=1000.0)
    clock.t = 1001.0
    goodput.round_committed(round_(0, [1001.0], ckpt_s=3.0, data_s=1.0), 0.0)
    goodput.attempt_ended("finished")
    parts = goodput.finish().seconds
    assert parts["checkpoints"] == pytest.approx(0.75) and parts["data"] == pytest.approx(0.25)
    assert parts["productive"] == pytest.approx(0.0)


def test_the_running_figure_counts_the_open_attempt_up_to_now():
    clock = Clock()
    goodput = GoodputClock(clock)
    started(goodput, clock, 1, at=1001.0)
    clock.t = 1004.0
    snapshot = goodput.snapshot()
    assert snapshot.wall_s == 4.0 and snapshot.seconds["productive"] == 3.0
    assert snapshot.goodput == 0.75


def test_the_summary_line_and_plain_data_round_trip():
    seconds = dict.fromkeys(PARTS, 0.0) | {"productive": 91.2, "checkpoints": 4.1, "data": 2.0}
    seconds |= {"failures": 1.9, "startup": 0.8}
    goodput = Goodput(100.0, seconds, (seconds,))
    assert goodput.summary() == (
        "goodput 91.2 %: checkpoints 4.1 %, data 2.0 %, failures 1.9 %, start-up 0.8 %"
    )
    assert Goodput.from_dict(goodput.to_dict()) == goodput


def test_the_progress_view_shows_the_running_figure_once_a_round_is_in():
    from phalanx._internal.controller.progress import RunWatcher

    clock = Clock()
    goodput = GoodputClock(clock)
    started(goodput, clock, 1, at=1001.0)
    clock.t = 1004.0
    watcher = RunWatcher("exp", 1, verbose=1, goodput=goodput.snapshot)
    assert "goodput" not in watcher.status_line()  # nothing trained yet: no figure
    watcher.round = 3
    assert " · goodput 75 % · " in watcher.status_line()
