"""The hang watchdog, row by row: which ranks a user is told are hung, and when.

The watchdog reads ``time.monotonic`` through its module; a fake clock stands in for it, so each
row states seconds exactly and takes no time.
"""

from __future__ import annotations

import types

import pytest

from phalanx._internal.controller import watchdog
from phalanx._internal.controller.watchdog import ProgressWatchdog, stopped_ranks


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(watchdog, "time", types.SimpleNamespace(monotonic=fake.monotonic))
    return fake


# (why, hang_timeout_s, events: (seconds after start, rank that made progress), finished ranks,
#  seconds after start when asked, the ranks named hung)
ROWS = [
    ("off by default (None)", None, [], set(), 10_000, []),
    ("every rank silent past the timeout", 2, [], set(), 2.5, [0, 1]),
    ("not yet past the timeout", 2, [], set(), 2.0, []),
    ("a report is progress", 2, [(1.5, 0)], set(), 3.0, [1]),
    ("steady reports never hang", 2, [(1, 0), (1, 1), (2.5, 0), (2.5, 1)], set(), 4.0, []),
    ("a rank that finished is never hung", 2, [], {1}, 5.0, [0]),
    ("every rank finished", 2, [], {0, 1}, 100.0, []),
    ("the clock counts from the last progress", 2, [(10, 0), (10, 1)], set(), 12.5, [0, 1]),
]


@pytest.mark.parametrize(
    ("timeout", "events", "finished", "at", "hung"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_which_ranks_are_hung(clock, timeout, events, finished, at, hung):
    dog = ProgressWatchdog(timeout, world_size=2)
    start = clock.now = clock.now + 50  # start-up took 50 s: not a hang, the clock starts now
    dog.start()
    for seconds, rank in events:
        clock.now = start + seconds
        dog.progress(rank)
    clock.now = start + at
    assert dog.hung_ranks(finished) == hung


# The default rule ("auto") with a floor of 10 s: (why, events, finished, seconds after start
# when asked, the ranks named hung)
AUTO_ROWS = [
    ("before any report: 4x the floor", [], set(), 40.0, []),
    ("before any report, past 4x the floor", [], set(), 40.5, [0, 1]),
    ("reporting: the floor", [(1, 0), (1, 1), (2, 0), (2, 1)], set(), 12.5, [0, 1]),
    ("one rank stops: it alone", [(1, 0), (1, 1), (2, 0), (2, 1), (3, 1)], set(), 12.5, [0]),
    (
        "10x the slowest round when that is larger",
        [(1, 0), (1, 1), (4, 0), (4, 1)],  # a 3 s round: the bound is 30 s
        set(),
        33.0,
        [],
    ),
    ("a slow first round is not a pace", [(20, 0), (20, 1), (21, 0), (21, 1)], set(), 31.5, [0, 1]),
    (
        "a rank that never reports is judged only with one that does (rank-0-only reports)",
        [(1, 0), (2, 0), (25, 0)],
        set(),
        30.0,
        [],
    ),
    ("...and named with it once that one stops", [(1, 0), (2, 0)], set(), 12.5, [0, 1]),
]


@pytest.mark.parametrize(
    ("events", "finished", "at", "hung"),
    [row[1:] for row in AUTO_ROWS],
    ids=[row[0] for row in AUTO_ROWS],
)
def test_the_default_rule(clock, events, finished, at, hung):
    dog = ProgressWatchdog("auto", world_size=2, floor_s=10)
    start = clock.now
    dog.start()
    for seconds, rank in events:
        clock.now = start + seconds
        dog.progress(rank)
    clock.now = start + at
    assert dog.hung_ranks(finished) == hung


@pytest.mark.parametrize("off", [None, 0, 0.0])
def test_none_and_zero_turn_the_watchdog_off(clock, off):
    dog = ProgressWatchdog(off, world_size=2, floor_s=10)
    dog.start()
    clock.now += 1e9
    assert dog.hung_ranks(set()) == [] and dog.bound_s() is None


def test_the_floor_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("PHALANX_HANG_TIMEOUT_FLOOR_S", "7")
    dog = ProgressWatchdog("auto", world_size=1)
    assert dog.bound_s() == 28 and "PHALANX_HANG_TIMEOUT_FLOOR_S" in dog.rule()
    monkeypatch.delenv("PHALANX_HANG_TIMEOUT_FLOOR_S")
    assert ProgressWatchdog("auto", world_size=1).floor_s == 1800


def test_idle_seconds_count_from_each_rank_s_last_progress(clock):
    dog = ProgressWatchdog(5, world_size=3)
    dog.start()
    clock.now += 4
    dog.progress(1)
    clock.now += 3
    assert dog.idle_s() == {0: 7.0, 1: 3.0, 2: 7.0}


WAITING = 'File "/site-packages/torch/distributed/distributed_c10d.py", line 9 in all_reduce'
LOOP = 'File "/work/train.py", line {} in loop'


def stack(*frames: str) -> str:
    """A faulthandler dump of the training thread, most recent call first."""
    lines = [f"  {f}" for f in frames] + ['  File "/x/runtime.py", line 1 in run_train_fn']
    return "Thread 0x1 (most recent call first):\n" + "\n".join(lines)


BACKWARD = (
    'File "/site-packages/torch/autograd/graph.py", line 9 in _engine_run_backward',
    'File "/site-packages/torch/autograd/__init__.py", line 9 in backward',
    'File "/site-packages/torch/_tensor.py", line 9 in backward',
)
DDP_FORWARD = 'File "/site-packages/torch/nn/parallel/distributed.py", line 9 in forward'

# (why, each rank's stack, seconds since each rank's progress, the rank(s) named as the cause)
CAUSE_ROWS = [
    (
        "DDP: ranks waiting for the gradient allreduce inside backward() wait in a collective",
        {0: stack(*BACKWARD, LOOP.format(9)), 1: stack(LOOP.format(7)), 2: stack(*BACKWARD)},
        {0: 3.0, 1: 3.0, 2: 3.0},
        [1],
    ),
    (
        "DDP: so do ranks in DDP's forward (its buffer broadcast)",
        {0: stack(LOOP.format(7)), 1: stack(DDP_FORWARD, LOOP.format(8))},
        {0: 3.0, 1: 3.0},
        [0],
    ),
    (
        "the rank outside a collective is the one the others wait for",
        {0: stack(WAITING, LOOP.format(5)), 1: stack(LOOP.format(7)), 2: stack(WAITING)},
        {},
        [1],
    ),
    (
        "else the rank whose progress is clearly the oldest",
        {0: stack(LOOP.format(5)), 1: stack(LOOP.format(5))},
        {0: 9.0, 1: 3.0},
        [0],
    ),
    (
        "else the frame fewer ranks share",
        {0: stack(LOOP.format(5)), 1: stack(LOOP.format(5)), 2: stack(LOOP.format(8))},
        {0: 3.0, 1: 3.0, 2: 3.2},
        [2],
    ),
    (
        "nobody stands out: nobody is blamed",
        {0: stack(LOOP.format(5)), 1: stack(LOOP.format(5))},
        {0: 3.0, 1: 3.0},
        [],
    ),
]


@pytest.mark.parametrize(
    ("stacks", "idle", "cause"),
    [row[1:] for row in CAUSE_ROWS],
    ids=[row[0] for row in CAUSE_ROWS],
)
def test_the_rank_that_stopped_the_others_is_named(stacks, idle, cause):
    assert stopped_ranks(stacks, idle)[0] == cause
