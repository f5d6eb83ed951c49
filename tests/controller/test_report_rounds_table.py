"""ReportRounds, row by row: when the k-th reports of the ranks become a committed round.

Each row is one thing a user sees: which rounds commit (and whose metrics they carry) given which
ranks reported how many times and which ranks' training functions have returned.
"""

from __future__ import annotations

import pytest

from phalanx._internal.controller.rounds import LAG_WARNING_ROUNDS, Report, ReportRounds


def report(rank: int, index: int) -> Report:
    return Report(index, {"rank": rank, "step": index}, None, 0.0)


# (why, world size, reports per rank, ranks that returned, the rounds that commit: for each, the
# ranks whose report is in it)
ROWS = [
    ("nothing reported, nothing commits", 2, [0, 0], set(), []),
    ("a round waits for every running rank", 2, [3, 0], set(), []),
    ("the k-th reports of every rank form round k", 2, [2, 2], set(), [[0, 1], [0, 1]]),
    ("a round commits as soon as the slowest rank reports it", 3, [3, 1, 2], set(), [[0, 1, 2]]),
    ("rank 0 only: commits once the others returned", 2, [3, 0], {1}, [[0], [0], [0]]),
    ("a returned rank adds nothing to later rounds", 2, [3, 1], {1}, [[0, 1], [0], [0]]),
    ("every rank returned: every report commits", 3, [1, 2, 0], {0, 1, 2}, [[0, 1], [1]]),
    ("a failed rank is not returned: its rounds never complete", 2, [3, 1], set(), [[0, 1]]),
]


@pytest.mark.parametrize(
    ("world", "counts", "returned", "expected"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_which_rounds_commit(world, counts, returned, expected):
    rounds = ReportRounds(world_size=world, start_round=5)
    for rank, count in enumerate(counts):
        for index in range(count):
            rounds.add(rank, report(rank, index))
    done = rounds.pop_complete(returned)
    assert [[r for r, rep in enumerate(d.reports) if rep is not None] for d in done] == expected
    assert [d.index for d in done] == list(range(5, 5 + len(expected)))  # numbered on from start
    assert rounds.next_round == 5 + len(expected)
    for d in done:  # the run's metrics: rank 0's, else the lowest rank that reported
        lowest = next(r for r, rep in enumerate(d.reports) if rep is not None)
        assert d.run_metrics["rank"] == lowest
        assert len(d.metrics) == world  # one entry per rank, {} for a returned one
    assert rounds.pop_complete(returned) == []  # a round is handed out once


def test_rounds_continue_from_the_round_the_ranks_recovered_to():
    """After a recovery to the failed step the ranks' first report is a later round than the
    one after the checkpoint: the rounds are numbered from it (no row missing or repeated)."""
    rounds = ReportRounds(world_size=2, start_round=10)
    for index in (13, 14):
        rounds.add(0, report(0, index))
        rounds.add(1, report(1, index))
    assert [d.index for d in rounds.pop_complete(set())] == [13, 14]
    assert (rounds.start_round, rounds.next_round) == (13, 15)


def test_a_round_only_the_lost_rank_had_not_reported_is_carried_into_the_recovery():
    """Rank 1 died after its step 17 (round 16), before reporting it; the survivors resumed
    after it: round 16 commits with rank 0's report, without its checkpoint, before round 17."""
    failed = ReportRounds(world_size=2, start_round=10)
    for index in range(10, 17):
        failed.add(0, Report(index, {"step": index + 1}, "ckpt" if index == 16 else None, 0.0))
    for index in range(10, 16):
        failed.add(1, report(1, index))
    assert [d.index for d in failed.pop_complete(set())] == list(range(10, 16))
    rounds = ReportRounds(world_size=2, start_round=10, previous=failed)
    rounds.add(0, report(0, 17))
    rounds.add(1, report(1, 17))
    carried, after = rounds.pop_complete(set())
    assert (carried.index, after.index) == (16, 17)
    assert carried.run_metrics == {"step": 17} and carried.reports[1] is None
    assert carried.checkpoint_dir_names == set()  # its checkpoint never committed
    assert rounds.pop_complete(set()) == []
    restarted = ReportRounds(world_size=2, start_round=10, previous=failed)
    restarted.add(0, report(0, 0))  # a restart from the checkpoint: nothing carried
    restarted.add(1, report(1, 0))
    assert [d.index for d in restarted.pop_complete(set())] == [10]


def test_rounds_pop_in_order_as_reports_arrive():
    rounds = ReportRounds(world_size=2, start_round=0)
    rounds.add(0, report(0, 0))
    rounds.add(0, report(0, 1))
    assert rounds.pop_complete(set()) == []
    rounds.add(1, report(1, 0))
    assert [d.index for d in rounds.pop_complete(set())] == [0]
    rounds.add(1, report(1, 1))
    rounds.add(1, report(1, 2))
    assert [d.index for d in rounds.pop_complete(set())] == [1]
    assert [d.index for d in rounds.pop_complete({0})] == [2]
    assert [rounds.reported_through(r) for r in (0, 1)] == [2, 3]


# (why, reports per rank, ranks still running, whether the user is warned)
LAG_ROWS = [
    ("every rank reports", [5, 5], {0, 1}, False),
    ("rank 0 only, not far ahead yet", [LAG_WARNING_ROUNDS - 1, 0], {0, 1}, False),
    ("rank 0 only, far ahead", [LAG_WARNING_ROUNDS, 0], {0, 1}, True),
    ("a slow rank that has reported is not silent", [LAG_WARNING_ROUNDS + 5, 1], {0, 1}, False),
    ("a silent rank that returned is not waited for", [LAG_WARNING_ROUNDS, 0], {0}, False),
    # rank 0 writes its first (big) checkpoint while metrics-only ranks run ahead: behind, not silent
    ("rank 0 slow on its first report", [0, LAG_WARNING_ROUNDS + 5], {0, 1}, False),
    ("rank 0 slow, rank 2 silent", [0, LAG_WARNING_ROUNDS, 0], {0, 1, 2}, False),
    ("rank 0 reported and returned", [LAG_WARNING_ROUNDS, 0], {1}, True),
    ("rank 0 returned silent: rank 1 leads", [0, LAG_WARNING_ROUNDS, 0], {1, 2}, True),
]


@pytest.mark.parametrize(
    ("counts", "running", "warned"),
    [row[1:] for row in LAG_ROWS],
    ids=[row[0] for row in LAG_ROWS],
)
def test_silent_ranks_are_named_with_a_hint(counts, running, warned):
    rounds = ReportRounds(world_size=len(counts), start_round=0)
    for rank, count in enumerate(counts):
        for index in range(count):
            rounds.add(rank, report(rank, index))
    warning = rounds.silent_ranks_warning(running)
    assert (warning is not None) == warned
    if warning is not None:
        assert f"rank(s) {len(counts) - 1} have not reported" in warning and "HINT:" in warning


def test_the_silent_ranks_warning_in_full():
    rounds = ReportRounds(world_size=3, start_round=0)
    for index in range(LAG_WARNING_ROUNDS):
        rounds.add(0, report(0, index))
    assert rounds.silent_ranks_warning({0, 1, 2}) == (
        f"Rank 0 has reported {LAG_WARNING_ROUNDS} rounds but rank(s) 1, 2 have not reported "
        "yet. A round (its metrics and checkpoint) is committed only once every rank still "
        "running has reported it, or has returned; until then its checkpoint waits in staging "
        "and is lost if the attempt fails.\nHINT: call phalanx.report() on every rank, passing "
        "the checkpoint from rank 0 only: report(metrics, checkpoint=ckpt if rank == 0 else None)."
    )
